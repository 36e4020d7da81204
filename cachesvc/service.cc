#include "cachesvc/service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "cachesvc/arena_socket.h"
#include "cachesvc/log.h"
#include "cachesvc/prefix_hash.h"
#include "cachesvc/status.h"
#include "engine/spec/check.h"
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
      : store(s),
        registry(r),
        auth(a),
        opt(o),
        limiter(o.max_calls_per_tenant),
        executor(o.executor_threads, o.executor_queue) {
    if (o.hbm != nullptr) hbm_handle = o.hbm->arena().ExportHandle();
    for (size_t pool = 0; pool < s->ram_pool_count(); ++pool) {
      const int fd = s->ram_arena_fd(static_cast<storage::RamPoolId>(pool));
      arena_ids.push_back(fd >= 0 ? ArenaIdentity(fd) : 0);
    }
    // Namespaces of tenants with a RAM pool of their own keep their chunks there.
    for (const NamespaceInfo& ns : r->All()) AssignRamPool(ns);
  }

  void AssignRamPool(const NamespaceInfo& ns) {
    const std::optional<storage::RamPoolId> pool = opt.shm.PoolOf(ns.tenant);
    if (pool && *pool != 0 && *pool < store->ram_pool_count()) {
      absl::Status s = store->SetRamPool(ns.id, *pool);
      KVC_CHECK(s.ok()) << "namespace " << ns.id << ": " << s;
    }
  }

  // The RAM pool a tenant's shared-memory calls use: PermissionDenied when it has none.
  absl::StatusOr<storage::RamPoolId> ShmPoolOf(const std::string& tenant) const {
    const std::optional<storage::RamPoolId> pool = opt.shm.PoolOf(tenant);
    if (!pool || store->ram_arena_fd(*pool) < 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "tenant ", tenant, " may not use shared memory (see kvcached --shm-tenants)"));
    }
    return *pool;
  }

  // Records a finished call in the metrics (if any) and the log: successes at debug,
  // the caller's mistakes at info, the server's own failures at error.
  void Observe(const char* method, absl::string_view tenant, const grpc::Status& s,
               std::chrono::steady_clock::time_point start) const {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (opt.metrics != nullptr) opt.metrics->ObserveCall(method, s.error_code(), seconds);
    const LogLevel level = s.ok()                          ? LogLevel::kDebug
                           : IsServerFault(s.error_code()) ? LogLevel::kError
                                                           : LogLevel::kInfo;
    if (!LogEnabled(level)) return;
    LogLine line(level, "call");
    line.Str("method", method)
        .Str("tenant", tenant)
        .Str("code", StatusCodeName(s.error_code()))
        .Num("ms", seconds * 1e3);
    if (!s.ok()) line.Str("error", s.error_message());
  }

  // Authenticates a call and takes one of its tenant's in-flight slots. `tenant` is set
  // once known (for the log); callers start it as "-".
  absl::StatusOr<TenantLimiter::Slot> Admit(const grpc::CallbackServerContext* ctx,
                                            std::string* tenant) {
    absl::StatusOr<std::string> t = auth->TenantFor(Authorization(ctx));
    if (!t.ok()) return t.status();
    *tenant = *t;
    return limiter.Acquire(*t);
  }

  // Runs `work` on the executor (or right here when `inline_work`: short, never blocking
  // on I/O) and finishes the unary call with its status.
  template <typename Work>
  grpc::ServerUnaryReactor* Unary(const char* method, grpc::CallbackServerContext* ctx, Work work,
                                  bool inline_work = false) {
    const auto start = std::chrono::steady_clock::now();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    std::string tenant(1, '-');
    absl::StatusOr<TenantLimiter::Slot> admitted = Admit(ctx, &tenant);
    if (!admitted.ok()) {
      Observe(method, tenant, ToGrpc(admitted.status()), start);
      reactor->Finish(ToGrpc(admitted.status()));
      return reactor;
    }
    // The slot is held until the call finishes.
    auto slot = std::make_shared<TenantLimiter::Slot>(*std::move(admitted));
    auto finish = [this, reactor, method, start, slot](const grpc::Status& s) {
      slot->Release();
      Observe(method, slot->tenant(), s, start);
      reactor->Finish(s);
    };
    if (inline_work) {
      finish(ToGrpc(work(slot->tenant())));
    } else if (!executor.Submit(
                   [finish, work, slot]() mutable { finish(ToGrpc(work(slot->tenant()))); })) {
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
    AssignRamPool(*ns);
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
    std::vector<storage::HbmLease> hbm;  // FetchDeviceRefs
  };

  // Drops leases past their time; called on every FetchRefs and by the reaper thread.
  void ReapLeases() {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lk(leases_mu);
    for (auto it = ref_leases.begin(); it != ref_leases.end();) {
      it = it->second.expires <= now ? Forget(it) : std::next(it);
    }
  }

  absl::Status DoFetchRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                           pb::FetchRefsResponse* resp) {
    absl::StatusOr<storage::RamPoolId> pool = ShmPoolOf(tenant);
    if (!pool.ok()) return pool.status();
    auto nk = NamespaceAndKeys(tenant, req);
    if (!nk.ok()) return nk.status();
    for (uint64_t done : req.release_lease_ids())
      (void)DoReleaseRefs(tenant, done);  // saves a call
    ReapLeases();
    const uint32_t ms =
        std::min(req.lease_ms() ? req.lease_ms() : opt.default_lease_ms, opt.max_lease_ms);
    resp->set_lease_ms(ms);
    resp->set_arena_id(arena_ids.at(*pool));
    RefLease lease{
        tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
    for (const ChunkKey& key : nk->second) {
      absl::StatusOr<storage::RamLease> l = store->LeaseRam(nk->first.id, key);
      // The leading chunks only; the client fetches the rest over gRPC. A chunk in another
      // pool (stored before the tenant had its own) is not in the caller's mapping.
      if (!l.ok() || l->pool() != *pool) break;
      pb::ChunkRef* ref = resp->add_refs();
      ref->set_chunk_key(KeyBytes(key));
      ref->set_arena_offset(l->arena_offset());
      ref->set_length(l->bytes().size());
      lease.leases.push_back(*std::move(l));
    }
    if (lease.leases.empty()) return absl::OkStatus();
    return Hold(std::move(lease), resp);
  }

  // Keeps `lease` until released or expired; its id goes into resp.
  template <typename Response>
  absl::Status Hold(RefLease lease, Response* resp) {
    std::lock_guard lk(leases_mu);
    size_t& held = leases_held[lease.tenant];
    if (held >= opt.max_ref_leases) {
      resp->clear_refs();
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", lease.tenant, " holds ", held, " shared-memory leases already (the limit)"));
    }
    ++held;
    const uint64_t id = ++next_lease_id;
    ref_leases.emplace(id, std::move(lease));
    resp->set_lease_id(id);
    return absl::OkStatus();
  }

  // T0: leases the leading chunks in HBM, first copying into it those read (and so
  // verified) from RAM or SSD.
  absl::Status DoFetchDeviceRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                                 pb::FetchDeviceRefsResponse* resp) {
    if (opt.hbm == nullptr) {
      return absl::FailedPreconditionError(
          "this kvcached has no HBM tier (start it with --hbm-bytes on a machine with a GPU)");
    }
    if (auth->enabled() && !opt.device_tenants.contains(tenant)) {  // before any work
      return absl::PermissionDeniedError(
          absl::StrCat("tenant ", tenant, " may not map the HBM tier (see --shm-tenants)"));
    }
    auto nk = NamespaceAndKeys(tenant, req);
    if (!nk.ok()) return nk.status();
    for (uint64_t done : req.release_lease_ids()) (void)DoReleaseRefs(tenant, done);
    ReapLeases();
    const uint32_t ms =
        std::min(req.lease_ms() ? req.lease_ms() : opt.default_lease_ms, opt.max_lease_ms);
    resp->set_lease_ms(ms);
    resp->set_ipc_handle(hbm_handle);
    resp->set_device(opt.hbm->arena().device());
    resp->set_arena_id(opt.hbm->arena().id());
    RefLease lease{
        tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
    const storage::NamespaceId ns = nk->first.id;
    std::vector<uint8_t> staged;
    for (const ChunkKey& key : nk->second) {
      absl::StatusOr<storage::HbmLease> l = opt.hbm->Lease(ns, key);
      if (!l.ok()) {
        staged.resize(nk->first.chunk_bytes);
        if (!store->Get(ns, key, staged).ok()) break;  // missing (or failed its checksum)
        l = opt.hbm->PutAndLease(ns, key, staged);
        if (!l.ok()) break;  // every slot leased: the prefix ends here
      }
      pb::ChunkRef* ref = resp->add_refs();
      ref->set_chunk_key(KeyBytes(key));
      ref->set_arena_offset(l->offset());
      ref->set_length(l->length());
      lease.hbm.push_back(*std::move(l));
    }
    if (lease.hbm.empty()) return absl::OkStatus();
    return Hold(std::move(lease), resp);
  }

  absl::Status DoReleaseRefs(const std::string& tenant, uint64_t id) {
    std::lock_guard lk(leases_mu);
    auto it = ref_leases.find(id);
    if (it == ref_leases.end() || it->second.tenant != tenant) {
      return absl::NotFoundError(absl::StrCat("lease ", id, " not found (released or expired)"));
    }
    Forget(it);
    return absl::OkStatus();
  }

  // Ends a held lease (under leases_mu).
  std::map<uint64_t, RefLease>::iterator Forget(std::map<uint64_t, RefLease>::iterator it) {
    auto held = leases_held.find(it->second.tenant);
    KVC_CHECK(held != leases_held.end() && held->second > 0)
        << "tenant " << it->second.tenant << " releases a lease it does not hold";
    if (--held->second == 0) leases_held.erase(held);
    return ref_leases.erase(it);
  }

  storage::ChunkStore* store;
  NamespaceRegistry* registry;
  const Authenticator* auth;
  ServiceOptions opt;
  TenantLimiter limiter;
  std::string hbm_handle;  // the HBM arena's IPC handle, exported once
  std::mutex leases_mu;
  std::map<uint64_t, RefLease> ref_leases;
  std::map<std::string, size_t> leases_held;  // per tenant
  uint64_t next_lease_id = 0;
  std::vector<uint64_t> arena_ids;  // ArenaIdentity per RAM pool (0: no slots)
  Executor executor;  // declared last: its threads stop before the state they use goes away
};

// ---- Fetch: one chunk read (on the executor), then written, then the next ----
//
// Fetch is served as a raw method: each FetchResponse is framed by hand (the protobuf
// wire format of two bytes fields) as a small header slice plus a payload slice that
// points straight into the RAM arena and holds the chunk's lease until gRPC has sent it.
// That saves the two payload copies of the generated code (into the message, then into
// the serialized buffer); clients see ordinary FetchResponse messages.

namespace {

// The payload slice owns what keeps its bytes alive: a RAM lease or a heap buffer.
struct PayloadOwner {
  storage::RamLease lease;
  std::unique_ptr<uint8_t[]> heap;
};

void DestroyPayloadOwner(void* owner) { delete static_cast<PayloadOwner*>(owner); }

// FetchResponse{chunk_key = key, payload = <len bytes>}, payload excluded: the header.
std::string FetchResponseHeader(const ChunkKey& key, uint64_t len) {
  std::string h;
  h.reserve(32);
  h.push_back(0x0A);  // field 1, length-delimited
  h.push_back(16);
  h.append(reinterpret_cast<const char*>(key.bytes.data()), 16);
  h.push_back(0x12);  // field 2, length-delimited
  for (uint64_t v = len;; v >>= 7) {
    if (v < 0x80) {
      h.push_back(static_cast<char>(v));
      break;
    }
    h.push_back(static_cast<char>((v & 0x7F) | 0x80));
  }
  return h;
}

grpc::ByteBuffer FetchResponseFrame(const ChunkKey& key, std::span<const uint8_t> payload,
                                    PayloadOwner* owner) {
  const std::string header = FetchResponseHeader(key, payload.size());
  grpc::Slice slices[2] = {grpc::Slice(header),
                           grpc::Slice(const_cast<uint8_t*>(payload.data()), payload.size(),
                                       DestroyPayloadOwner, owner)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(KvCacheService::Impl* svc, TenantLimiter::Slot slot, NamespaceInfo ns,
               std::vector<ChunkKey> keys)
      : svc_(svc), slot_(std::move(slot)), ns_(std::move(ns)), keys_(std::move(keys)) {
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
    resp_.Clear();  // ends the lease of the last chunk now rather than with the reactor
    slot_.Release();
    svc_->Observe("Fetch", slot_.tenant(), s, start_);
    Finish(s);
  }
  void Next() {
    if (next_ == keys_.size()) {
      Done(grpc::Status::OK);
      return;
    }
    // A chunk in RAM is sent from the arena right here (no I/O, nothing blocks): no hop
    // to the executor, which only SSD reads need.
    if (absl::StatusOr<storage::RamLease> lease = svc_->store->LeaseRam(ns_.id, keys_[next_]);
        lease.ok()) {
      const std::span<const uint8_t> bytes = lease->bytes();
      resp_ = FetchResponseFrame(keys_[next_], bytes, new PayloadOwner{*std::move(lease), {}});
      Write();
      return;
    }
    if (!svc_->executor.Submit([this] { ReadAndWrite(); })) {
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  void ReadAndWrite() {
    const ChunkKey& key = keys_[next_];
    auto owner = std::make_unique<PayloadOwner>();
    owner->heap = std::make_unique_for_overwrite<uint8_t[]>(ns_.chunk_bytes);
    const std::span<uint8_t> payload(owner->heap.get(), ns_.chunk_bytes);
    absl::Status s = svc_->store->Get(ns_.id, key, payload);
    if (!s.ok()) {
      Done(ToGrpc(absl::Status(s.code(), absl::StrCat("chunk_keys[", next_, "]: ", s.message()))));
      return;
    }
    resp_ = FetchResponseFrame(key, payload, owner.release());
    Write();
  }
  // The last chunk goes out with the trailers in one step (no OnWriteDone round trip:
  // it matters for the many one-chunk fetches).
  void Write() {
    if (next_ + 1 < keys_.size()) {
      StartWrite(&resp_);
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/false, ns_.chunk_bytes);
    slot_.Release();
    svc_->Observe("Fetch", slot_.tenant(), grpc::Status::OK, start_);
    StartWriteAndFinish(&resp_, grpc::WriteOptions(), grpc::Status::OK);
  }

  KvCacheService::Impl* svc_;
  TenantLimiter::Slot slot_;
  NamespaceInfo ns_;
  std::vector<ChunkKey> keys_;
  size_t next_ = 0;
  grpc::ByteBuffer resp_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// ---- Store: read one message, handle it on the executor, read the next ----

class StoreReactor final : public grpc::ServerReadReactor<pb::StoreRequest> {
 public:
  StoreReactor(KvCacheService::Impl* svc, TenantLimiter::Slot slot, pb::StoreResponse* resp)
      : svc_(svc), slot_(std::move(slot)), tenant_(slot_.tenant()), resp_(resp) {
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
    slot_.Release();
    svc_->Observe("Store", tenant_, s, start_);
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
    if (svc_->opt.hbm != nullptr && svc_->opt.hbm_write_through) {
      // The next turn's FetchDeviceRefs then finds it in T0 (a cache: a full tier only
      // means the chunk is promoted later).
      (void)svc_->opt.hbm->Put(ns->id, key,
                               std::span(reinterpret_cast<const uint8_t*>(req_.payload().data()),
                                         req_.payload().size()));
    }
    if (put->already_present) {
      resp_->set_already_present(resp_->already_present() + 1);
    } else {
      resp_->set_stored(resp_->stored() + 1);
    }
    resp_->add_chunk_keys(KeyBytes(key));
    return absl::OkStatus();
  }

  KvCacheService::Impl* svc_;
  TenantLimiter::Slot slot_;
  const std::string tenant_;
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
  // In-memory bookkeeping only: answered on the gRPC thread, saving a hop per fetch.
  return impl_->Unary(
      "FetchRefs", ctx,
      [this, req, resp](const std::string& t) { return impl_->DoFetchRefs(t, *req, resp); },
      /*inline_work=*/true);
}

grpc::ServerUnaryReactor* KvCacheService::FetchDeviceRefs(grpc::CallbackServerContext* ctx,
                                                          const pb::FetchRefsRequest* req,
                                                          pb::FetchDeviceRefsResponse* resp) {
  // On the executor: a promotion reads from SSD and copies into device memory.
  return impl_->Unary("FetchDeviceRefs", ctx, [this, req, resp](const std::string& t) {
    return impl_->DoFetchDeviceRefs(t, *req, resp);
  });
}

grpc::ServerUnaryReactor* KvCacheService::ReleaseRefs(grpc::CallbackServerContext* ctx,
                                                      const pb::ReleaseRefsRequest* req,
                                                      pb::ReleaseRefsResponse*) {
  return impl_->Unary(
      "ReleaseRefs", ctx,
      [this, req](const std::string& t) { return impl_->DoReleaseRefs(t, req->lease_id()); },
      /*inline_work=*/true);
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

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvCacheService::Fetch(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* raw) {
  absl::Status status;
  std::string tenant(1, '-');
  pb::FetchRequest req;
  grpc::ByteBuffer copy(*raw);  // shares the slices
  if (grpc::Status parsed = grpc::SerializationTraits<pb::FetchRequest>::Deserialize(&copy, &req);
      !parsed.ok()) {
    status = absl::InvalidArgumentError("FetchRequest does not parse");
  } else if (absl::StatusOr<TenantLimiter::Slot> slot = impl_->Admit(ctx, &tenant); !slot.ok()) {
    status = slot.status();
  } else if (auto nk = impl_->NamespaceAndKeys(tenant, req); !nk.ok()) {
    status = nk.status();
  } else {
    return new FetchReactor(impl_.get(), *std::move(slot), nk->first, nk->second);
  }
  // Fails before streaming anything.
  class Failed final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Failed(const grpc::Status& s) { Finish(s); }
    void OnDone() override { delete this; }
  };
  impl_->Observe("Fetch", tenant, ToGrpc(status), std::chrono::steady_clock::now());
  return new Failed(ToGrpc(status));
}

grpc::ServerReadReactor<pb::StoreRequest>* KvCacheService::Store(grpc::CallbackServerContext* ctx,
                                                                 pb::StoreResponse* resp) {
  std::string tenant(1, '-');
  absl::StatusOr<TenantLimiter::Slot> slot = impl_->Admit(ctx, &tenant);
  if (!slot.ok()) {
    class Failed final : public grpc::ServerReadReactor<pb::StoreRequest> {
     public:
      explicit Failed(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    impl_->Observe("Store", tenant, ToGrpc(slot.status()), std::chrono::steady_clock::now());
    return new Failed(ToGrpc(slot.status()));
  }
  return new StoreReactor(impl_.get(), *std::move(slot), resp);
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
    if (impl_->opt.hbm != nullptr) {
      for (const ChunkKey& key : nk->second) impl_->opt.hbm->Erase(nk->first.id, key);
    }
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
    if (impl_->opt.hbm != nullptr) {
      const storage::HbmStats h = impl_->opt.hbm->stats();
      resp->set_hbm_chunks(h.used);
      resp->set_hbm_capacity_chunks(h.slots);
      resp->set_hbm_hits(h.hits);
    }
    return absl::OkStatus();
  });
}

}  // namespace kvc::cachesvc
