#include "cachesvc/service.h"

#include <chrono>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "cachesvc/prefix_hash.h"
#include "cachesvc/status.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
using storage::ChunkKey;

namespace {

int64_t NowS() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

pb::Tier ToProto(storage::Tier t) {
  switch (t) {
    case storage::Tier::kRam:
      return pb::TIER_RAM;
    case storage::Tier::kSsd:
      return pb::TIER_SSD;
    default:
      return pb::TIER_NONE;
  }
}

std::optional<std::string> Authorization(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

absl::StatusOr<std::vector<ChunkKey>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& raw, uint32_t max_keys) {
  if (raw.size() > static_cast<int>(max_keys)) {
    return absl::InvalidArgumentError(
        absl::StrCat(raw.size(), " chunk keys in one call; the limit is ", max_keys));
  }
  std::vector<ChunkKey> keys(raw.size());
  for (int i = 0; i < raw.size(); ++i) {
    if (raw[i].size() != 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_keys[", i, "] is ", raw[i].size(), " bytes; keys are 16 bytes"));
    }
    std::memcpy(keys[i].bytes.data(), raw[i].data(), 16);
  }
  return keys;
}

std::string KeyBytes(const ChunkKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), 16);
}

}  // namespace

class KvCacheService::Impl {
 public:
  Impl(storage::ChunkStore* s, NamespaceRegistry* r, const Authenticator* a, ServiceOptions o)
      : store(s), registry(r), auth(a), opt(o), executor(o.executor_threads, o.executor_queue) {}

  // Records a finished call in the metrics (if any).
  void Observe(const char* method, const grpc::Status& s,
               std::chrono::steady_clock::time_point start) const {
    if (opt.metrics == nullptr) return;
    opt.metrics->ObserveCall(
        method, s.error_code(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // Runs `work` on the executor and finishes the unary call with its status.
  template <typename Work>
  grpc::ServerUnaryReactor* Unary(const char* method, grpc::CallbackServerContext* ctx, Work work) {
    const auto start = std::chrono::steady_clock::now();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    auto finish = [this, reactor, method, start](const grpc::Status& s) {
      Observe(method, s, start);
      reactor->Finish(s);
    };
    absl::StatusOr<std::string> tenant = auth->TenantFor(Authorization(ctx));
    if (!tenant.ok()) {
      finish(ToGrpc(tenant.status()));
      return reactor;
    }
    if (!executor.Submit([finish, work, t = *tenant]() mutable { finish(ToGrpc(work(t))); })) {
      finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
    return reactor;
  }

  absl::StatusOr<NamespaceInfo> Namespace(uint32_t id, const std::string& tenant) const {
    std::optional<NamespaceInfo> ns = registry->Get(id, tenant);
    if (!ns) return absl::NotFoundError(absl::StrCat("namespace ", id, " not found"));
    return *ns;
  }

  absl::Status Register(const std::string& tenant, const pb::RegisterNamespaceRequest& req,
                        pb::RegisterNamespaceResponse* resp) {
    if (req.model_id().empty()) return absl::InvalidArgumentError("model_id is empty");
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig(req.model_config_json(), "model_config_json");
    if (!config.ok()) return config.status();
    absl::StatusOr<LayerSchedule> schedule = BuildLayerSchedule(*config);
    if (!schedule.ok()) return schedule.status();
    const uint32_t chunk_tokens =
        req.chunk_tokens() ? req.chunk_tokens() : opt.default_chunk_tokens;
    absl::StatusOr<ChunkLayout> layout = BuildChunkLayout(*config, *schedule, chunk_tokens);
    if (!layout.ok()) return layout.status();
    if (static_cast<uint64_t>(layout->chunk_bytes) > opt.max_chunk_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a chunk of ", chunk_tokens, " tokens is ", layout->chunk_bytes,
                       " bytes; this server stores chunks of at most ", opt.max_chunk_bytes));
    }
    NamespaceInfo info;
    info.tenant = tenant;
    info.model_id = req.model_id();
    info.chunk_tokens = chunk_tokens;
    info.chunk_bytes = static_cast<uint64_t>(layout->chunk_bytes);
    info.vocab_size = static_cast<uint64_t>(config->vocab_size);
    info.root = NamespaceRoot(tenant, ModelFingerprint(req.model_id(), *layout), kKvLayoutVersion,
                              chunk_tokens);
    absl::StatusOr<NamespaceInfo> ns = registry->FindOrAdd(info);
    if (!ns.ok()) return ns.status();
    if (absl::Status s = store->RegisterNamespace(ns->id, ns->chunk_bytes); !s.ok()) return s;
    resp->set_namespace_id(ns->id);
    resp->set_chunk_bytes(ns->chunk_bytes);
    resp->set_chunk_tokens(ns->chunk_tokens);
    resp->set_root_key(KeyBytes(ns->root));
    resp->set_kv_layout_version(kKvLayoutVersion);
    return absl::OkStatus();
  }

  absl::Status CheckTokens(const NamespaceInfo& ns,
                           const google::protobuf::RepeatedField<uint32_t>& tokens) const {
    for (int i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= ns.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokens[", i, "] is ", tokens[i], ", outside the vocabulary of ", ns.vocab_size));
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoLookup(const std::string& tenant, const pb::LookupRequest& req,
                        pb::LookupResponse* resp) {
    absl::StatusOr<NamespaceInfo> ns = Namespace(req.namespace_id(), tenant);
    if (!ns.ok()) return ns.status();
    if (static_cast<uint64_t>(req.tokens_size()) > opt.max_lookup_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          req.tokens_size(), " tokens in one Lookup; the limit is ", opt.max_lookup_tokens));
    }
    if (absl::Status s = CheckTokens(*ns, req.tokens()); !s.ok()) return s;
    const std::vector<ChunkKey> keys =
        ChunkKeys(ns->root, std::span(req.tokens().data(), req.tokens().size()), ns->chunk_tokens);
    const std::vector<storage::Tier> tiers = store->Lookup(ns->id, keys);
    uint32_t matched = 0;
    while (matched < tiers.size() && tiers[matched] != storage::Tier::kNone) ++matched;
    resp->set_matched_chunks(matched);
    for (const ChunkKey& k : keys) resp->add_chunk_keys(KeyBytes(k));
    for (uint32_t i = 0; i < matched; ++i) resp->add_tiers(ToProto(tiers[i]));
    return absl::OkStatus();
  }

  template <typename Req>
  absl::StatusOr<std::pair<NamespaceInfo, std::vector<ChunkKey>>> NamespaceAndKeys(
      const std::string& tenant, const Req& req) {
    absl::StatusOr<NamespaceInfo> ns = Namespace(req.namespace_id(), tenant);
    if (!ns.ok()) return ns.status();
    absl::StatusOr<std::vector<ChunkKey>> keys = ParseKeys(req.chunk_keys(), opt.max_keys_per_call);
    if (!keys.ok()) return keys.status();
    return std::pair{*ns, *keys};
  }

  // Counts the OK statuses; the first error other than NotFound fails the call.
  static absl::StatusOr<uint32_t> CountOk(const std::vector<absl::Status>& statuses) {
    uint32_t ok = 0;
    for (const absl::Status& s : statuses) {
      if (s.ok())
        ++ok;
      else if (!absl::IsNotFound(s))
        return s;
    }
    return ok;
  }

  absl::StatusOr<uint32_t> DoPin(const std::string& tenant, const pb::PinRequest& req,
                                 int64_t until) {
    auto nk = NamespaceAndKeys(tenant, req);
    if (!nk.ok()) return nk.status();
    return CountOk(store->PinBatch(nk->first.id, nk->second, until));
  }

  // ---- leases of RAM slots handed to co-located clients (FetchRefs) ----
  struct RefLease {
    std::string tenant;
    std::vector<storage::RamLease> leases;
    std::chrono::steady_clock::time_point expires;
  };

  // Drops leases past their time; called on every FetchRefs and by the reaper thread.
  void ReapLeases() {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lk(leases_mu);
    for (auto it = ref_leases.begin(); it != ref_leases.end();) {
      it = it->second.expires <= now ? ref_leases.erase(it) : std::next(it);
    }
  }

  absl::Status DoFetchRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                           pb::FetchRefsResponse* resp) {
    auto nk = NamespaceAndKeys(tenant, req);
    if (!nk.ok()) return nk.status();
    for (uint64_t done : req.release_lease_ids())
      (void)DoReleaseRefs(tenant, done);  // saves a call
    ReapLeases();
    const uint32_t ms = req.lease_ms() ? req.lease_ms() : opt.default_lease_ms;
    RefLease lease{tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms)};
    for (const ChunkKey& key : nk->second) {
      absl::StatusOr<storage::RamLease> l = store->LeaseRam(nk->first.id, key);
      if (!l.ok()) break;  // the leading chunks only; the client fetches the rest over gRPC
      pb::ChunkRef* ref = resp->add_refs();
      ref->set_chunk_key(KeyBytes(key));
      ref->set_arena_offset(l->arena_offset());
      ref->set_length(l->bytes().size());
      lease.leases.push_back(*std::move(l));
    }
    if (lease.leases.empty()) return absl::OkStatus();
    std::lock_guard lk(leases_mu);
    if (ref_leases.size() >= opt.max_ref_leases) {
      resp->clear_refs();
      return absl::ResourceExhaustedError(
          absl::StrCat(opt.max_ref_leases, " shared-memory leases are held already"));
    }
    const uint64_t id = ++next_lease_id;
    ref_leases.emplace(id, std::move(lease));
    resp->set_lease_id(id);
    return absl::OkStatus();
  }

  absl::Status DoReleaseRefs(const std::string& tenant, uint64_t id) {
    std::lock_guard lk(leases_mu);
    auto it = ref_leases.find(id);
    if (it == ref_leases.end() || it->second.tenant != tenant) {
      return absl::NotFoundError(absl::StrCat("lease ", id, " not found (released or expired)"));
    }
    ref_leases.erase(it);
    return absl::OkStatus();
  }

  storage::ChunkStore* store;
  NamespaceRegistry* registry;
  const Authenticator* auth;
  ServiceOptions opt;
  std::mutex leases_mu;
  std::map<uint64_t, RefLease> ref_leases;
  uint64_t next_lease_id = 0;
  Executor executor;  // declared last: its threads stop before the state they use goes away
};

// ---- Fetch: one chunk read (on the executor), then written, then the next ----

class FetchReactor final : public grpc::ServerWriteReactor<pb::FetchResponse> {
 public:
  FetchReactor(KvCacheService::Impl* svc, NamespaceInfo ns, std::vector<ChunkKey> keys)
      : svc_(svc), ns_(std::move(ns)), keys_(std::move(keys)) {
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading"));
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/false, ns_.chunk_bytes);
    ++next_;
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Done(const grpc::Status& s) {
    svc_->Observe("Fetch", s, start_);
    Finish(s);
  }
  void Next() {
    if (next_ == keys_.size()) {
      Done(grpc::Status::OK);
      return;
    }
    // A chunk in RAM is a memcpy away: serve it right here (no I/O, nothing blocks) and
    // skip the hop to the executor, which only SSD reads need.
    if (absl::StatusOr<storage::RamLease> lease = svc_->store->LeaseRam(ns_.id, keys_[next_]);
        lease.ok()) {
      resp_.set_chunk_key(KeyBytes(keys_[next_]));
      resp_.set_payload(lease->bytes().data(), lease->bytes().size());
      StartWrite(&resp_);
      return;
    }
    if (!svc_->executor.Submit([this] { ReadAndWrite(); })) {
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  void ReadAndWrite() {
    const ChunkKey& key = keys_[next_];
    resp_.set_chunk_key(KeyBytes(key));
    std::string* payload = resp_.mutable_payload();
    payload->resize(ns_.chunk_bytes);
    absl::Status s = svc_->store->Get(
        ns_.id, key, std::span(reinterpret_cast<uint8_t*>(payload->data()), payload->size()));
    if (!s.ok()) {
      Finish(
          ToGrpc(absl::Status(s.code(), absl::StrCat("chunk_keys[", next_, "]: ", s.message()))));
      return;
    }
    StartWrite(&resp_);
  }

  KvCacheService::Impl* svc_;
  NamespaceInfo ns_;
  std::vector<ChunkKey> keys_;
  size_t next_ = 0;
  pb::FetchResponse resp_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// ---- Store: read one message, handle it on the executor, read the next ----

class StoreReactor final : public grpc::ServerReadReactor<pb::StoreRequest> {
 public:
  StoreReactor(KvCacheService::Impl* svc, std::string tenant, pb::StoreResponse* resp)
      : svc_(svc), tenant_(std::move(tenant)), resp_(resp) {
    StartRead(&req_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending (or went away): answer with what was stored
      Done(grpc::Status::OK);
      return;
    }
    if (!svc_->executor.Submit([this] { Handle(); })) {
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  void OnDone() override { delete this; }

 private:
  void Done(const grpc::Status& s) {
    svc_->Observe("Store", s, start_);
    Finish(s);
  }
  void Handle() {
    absl::Status s = StoreOne();
    if (!s.ok()) {
      Done(ToGrpc(absl::Status(s.code(), absl::StrCat("message ", index_, ": ", s.message()))));
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/true, req_.payload().size());
    ++index_;
    StartRead(&req_);
  }

  absl::Status StoreOne() {
    absl::StatusOr<NamespaceInfo> ns = svc_->Namespace(req_.namespace_id(), tenant_);
    if (!ns.ok()) return ns.status();
    if (static_cast<uint32_t>(req_.tokens_size()) != ns->chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("chunk has ", req_.tokens_size(),
                                                     " tokens; namespace ", ns->id, " uses ",
                                                     ns->chunk_tokens));
    }
    if (absl::Status s = svc_->CheckTokens(*ns, req_.tokens()); !s.ok()) return s;
    if (req_.payload().size() != ns->chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk payload is ", req_.payload().size(),
                                                     " bytes, namespace ", ns->id, " expects ",
                                                     ns->chunk_bytes));
    }
    std::optional<ChunkKey> parent;
    ChunkKey chain = ns->root;
    if (!req_.parent_key().empty()) {
      if (req_.parent_key().size() != 16) {
        return absl::InvalidArgumentError(
            absl::StrCat("parent_key is ", req_.parent_key().size(), " bytes; keys are 16"));
      }
      std::memcpy(chain.bytes.data(), req_.parent_key().data(), 16);
      // A chunk is only reachable through its prefix: refuse orphans (and keys chained
      // from another namespace's chunks).
      if (svc_->store->Contains(ns->id, chain) == storage::Tier::kNone) {
        return absl::FailedPreconditionError(
            absl::StrCat("parent chunk ", chain.Hex(), " is not cached in namespace ", ns->id));
      }
      parent = chain;
    }
    const ChunkKey key = NextChunkKey(chain, std::span(req_.tokens().data(), req_.tokens().size()));
    const auto durability = req_.durability() == pb::DURABILITY_DURABLE
                                ? storage::Durability::kDurable
                                : storage::Durability::kMemory;
    absl::StatusOr<storage::PutResult> put = svc_->store->Put(
        {ns->id, key, parent,
         std::span(reinterpret_cast<const uint8_t*>(req_.payload().data()), req_.payload().size())},
        {durability, static_cast<int64_t>(req_.ttl_seconds())});
    if (!put.ok()) return put.status();
    if (put->already_present) {
      resp_->set_already_present(resp_->already_present() + 1);
    } else {
      resp_->set_stored(resp_->stored() + 1);
    }
    resp_->add_chunk_keys(KeyBytes(key));
    return absl::OkStatus();
  }

  KvCacheService::Impl* svc_;
  std::string tenant_;
  pb::StoreResponse* resp_;
  pb::StoreRequest req_;
  uint32_t index_ = 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// ---- the service ----

KvCacheService::KvCacheService(storage::ChunkStore* store, NamespaceRegistry* registry,
                               const Authenticator* auth, ServiceOptions options)
    : impl_(std::make_unique<Impl>(store, registry, auth, options)) {
  // Leases of clients that vanished end on time even when no other call comes.
  reaper_ = std::thread([this] {
    std::unique_lock lk(reaper_mu_);
    while (!reaper_cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return stopping_; })) {
      impl_->ReapLeases();
    }
  });
}

KvCacheService::~KvCacheService() {
  {
    std::lock_guard lk(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  reaper_.join();
}

grpc::ServerUnaryReactor* KvCacheService::FetchRefs(grpc::CallbackServerContext* ctx,
                                                    const pb::FetchRefsRequest* req,
                                                    pb::FetchRefsResponse* resp) {
  return impl_->Unary("FetchRefs", ctx, [this, req, resp](const std::string& t) {
    return impl_->DoFetchRefs(t, *req, resp);
  });
}

grpc::ServerUnaryReactor* KvCacheService::ReleaseRefs(grpc::CallbackServerContext* ctx,
                                                      const pb::ReleaseRefsRequest* req,
                                                      pb::ReleaseRefsResponse*) {
  return impl_->Unary("ReleaseRefs", ctx, [this, req](const std::string& t) {
    return impl_->DoReleaseRefs(t, req->lease_id());
  });
}

grpc::ServerUnaryReactor* KvCacheService::RegisterNamespace(grpc::CallbackServerContext* ctx,
                                                            const pb::RegisterNamespaceRequest* req,
                                                            pb::RegisterNamespaceResponse* resp) {
  return impl_->Unary("RegisterNamespace", ctx, [this, req, resp](const std::string& t) {
    return impl_->Register(t, *req, resp);
  });
}

grpc::ServerUnaryReactor* KvCacheService::Lookup(grpc::CallbackServerContext* ctx,
                                                 const pb::LookupRequest* req,
                                                 pb::LookupResponse* resp) {
  return impl_->Unary("Lookup", ctx, [this, req, resp](const std::string& t) {
    return impl_->DoLookup(t, *req, resp);
  });
}

grpc::ServerWriteReactor<pb::FetchResponse>* KvCacheService::Fetch(grpc::CallbackServerContext* ctx,
                                                                   const pb::FetchRequest* req) {
  absl::Status status;
  absl::StatusOr<std::string> tenant = impl_->auth->TenantFor(Authorization(ctx));
  if (tenant.ok()) {
    auto nk = impl_->NamespaceAndKeys(*tenant, *req);
    if (nk.ok()) return new FetchReactor(impl_.get(), nk->first, nk->second);
    status = nk.status();
  } else {
    status = tenant.status();
  }
  // Fails before streaming anything.
  class Failed final : public grpc::ServerWriteReactor<pb::FetchResponse> {
   public:
    explicit Failed(const grpc::Status& s) { Finish(s); }
    void OnDone() override { delete this; }
  };
  return new Failed(ToGrpc(status));
}

grpc::ServerReadReactor<pb::StoreRequest>* KvCacheService::Store(grpc::CallbackServerContext* ctx,
                                                                 pb::StoreResponse* resp) {
  absl::StatusOr<std::string> tenant = impl_->auth->TenantFor(Authorization(ctx));
  if (!tenant.ok()) {
    class Failed final : public grpc::ServerReadReactor<pb::StoreRequest> {
     public:
      explicit Failed(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Failed(ToGrpc(tenant.status()));
  }
  return new StoreReactor(impl_.get(), *tenant, resp);
}

grpc::ServerUnaryReactor* KvCacheService::Pin(grpc::CallbackServerContext* ctx,
                                              const pb::PinRequest* req, pb::PinResponse* resp) {
  return impl_->Unary("Pin", ctx, [this, req, resp](const std::string& t) -> absl::Status {
    if (req->ttl_seconds() == 0)
      return absl::InvalidArgumentError("ttl_seconds must be positive (use Unpin to unpin)");
    absl::StatusOr<uint32_t> n = impl_->DoPin(t, *req, NowS() + req->ttl_seconds());
    if (!n.ok()) return n.status();
    resp->set_pinned(*n);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvCacheService::Unpin(grpc::CallbackServerContext* ctx,
                                                const pb::UnpinRequest* req,
                                                pb::UnpinResponse* resp) {
  return impl_->Unary("Unpin", ctx, [this, req, resp](const std::string& t) -> absl::Status {
    auto nk = impl_->NamespaceAndKeys(t, *req);
    if (!nk.ok()) return nk.status();
    absl::StatusOr<uint32_t> n = Impl::CountOk(impl_->store->PinBatch(nk->first.id, nk->second, 0));
    if (!n.ok()) return n.status();
    resp->set_unpinned(*n);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvCacheService::Delete(grpc::CallbackServerContext* ctx,
                                                 const pb::DeleteRequest* req,
                                                 pb::DeleteResponse* resp) {
  return impl_->Unary("Delete", ctx, [this, req, resp](const std::string& t) -> absl::Status {
    auto nk = impl_->NamespaceAndKeys(t, *req);
    if (!nk.ok()) return nk.status();
    absl::StatusOr<uint32_t> n = Impl::CountOk(impl_->store->EraseBatch(nk->first.id, nk->second));
    if (!n.ok()) return n.status();
    resp->set_deleted(*n);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvCacheService::Stats(grpc::CallbackServerContext* ctx,
                                                const pb::StatsRequest*, pb::StatsResponse* resp) {
  return impl_->Unary("Stats", ctx, [this, resp](const std::string&) {
    const storage::StoreStats s = impl_->store->Stats();
    resp->set_ram_chunks(s.ram_chunks);
    resp->set_ram_capacity_chunks(s.ram_capacity_chunks);
    resp->set_ssd_chunks(s.ssd_chunks);
    resp->set_ssd_capacity_chunks(s.ssd_capacity_chunks);
    resp->set_ram_hits(s.ram_hits);
    resp->set_ssd_hits(s.ssd_hits);
    resp->set_misses(s.misses);
    resp->set_checksum_failures(s.checksum_failures);
    resp->set_evictions(s.ram_evictions + s.ssd_evictions);
    resp->set_io_backend(s.io_backend);
    return absl::OkStatus();
  });
}

}  // namespace kvc::cachesvc
