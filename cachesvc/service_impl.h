// The service's internals, shared by service.cc (the calls), fetch_reactor.cc and
// store_reactor.cc (the two streams): admission (auth, per-tenant limits), namespaces,
// shared-memory leases, and the executor. Not a public header.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "cachesvc/arena_socket.h"
#include "cachesvc/log.h"
#include "cachesvc/prefix_hash.h"
#include "cachesvc/service.h"
#include "cachesvc/status.h"
#include "engine/spec/chunk_layout.h"
#include "wire/wire.h"

namespace kvc::cachesvc {

namespace pb = ::kvcache::v1;
using storage::ChunkKey;

inline int64_t NowS() { return WallSeconds(); }

inline pb::Tier ToProto(storage::Tier t) {
  switch (t) {
    case storage::Tier::kRam:
      return pb::TIER_RAM;
    case storage::Tier::kSsd:
      return pb::TIER_SSD;
    case storage::Tier::kHbm:
      return pb::TIER_HBM;
    default:
      return pb::TIER_NONE;
  }
}

inline std::optional<std::string> Authorization(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

inline absl::StatusOr<std::vector<ChunkKey>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& raw, uint32_t max_keys) {
  if (raw.size() > static_cast<int>(max_keys)) {
    return absl::InvalidArgumentError(
        absl::StrCat(raw.size(), " chunk keys in one call; the limit is ", max_keys));
  }
  std::vector<ChunkKey> keys;
  keys.reserve(raw.size());
  for (int i = 0; i < raw.size(); ++i) {
    KVC_ASSIGN_OR_RETURN(ChunkKey k, wire::KeyFrom(raw[i], absl::StrCat("chunk_keys[", i, "]")));
    keys.push_back(k);
  }
  return keys;
}

using wire::KeyBytes;

class KvCacheService::Impl {
 public:
  Impl(storage::ChunkStore* s, NamespaceRegistry* r, const Authenticator* a, ServiceOptions o)
      : store(s),
        registry(r),
        auth(a),
        opt(o),
        limiter(o.max_calls_per_tenant),
        executor(o.executor_threads, o.executor_queue) {
    if (s->hbm_arena() != nullptr) hbm_handle = s->hbm_arena()->ExportHandle();
    for (size_t pool = 0; pool < s->ram_pool_count(); ++pool) {
      const int fd = s->ram_arena_fd(static_cast<storage::RamPoolId>(pool));
      arena_ids.push_back(fd >= 0 ? ArenaIdentity(fd) : 0);
    }
    // Namespaces of tenants with a RAM pool of their own keep their chunks there.
    for (const NamespaceInfo& ns : r->All()) {
      AssignRamPool(ns);
      AssignQuota(ns);
    }
  }

  // The tenant's quota and what it holds against it; false without a quota.
  bool QuotaOf(const std::string& tenant, pb::TenantQuota* out) {
    const std::optional<storage::Quota> q = opt.quotas.For(tenant);
    if (!q) return false;
    out->set_ram_bytes_limit(q->ram_bytes);
    out->set_ssd_bytes_limit(q->ssd_bytes);
    out->set_pinned_chunks_limit(q->pinned_chunks);
    const storage::ChunkStore::QuotaRoom room = store->QuotaCapacity();
    out->set_ram_bytes_per_chunk(room.ram_bytes_per_chunk);
    out->set_ssd_bytes_per_chunk(room.ssd_bytes_per_chunk);
    std::optional<storage::QuotaGroup> group;  // none before its first namespace: holds nothing
    {
      std::lock_guard lk(quota_mu);
      if (auto it = quota_groups.find(tenant); it != quota_groups.end()) group = it->second;
    }
    if (group) {
      const storage::QuotaUsage u = store->Usage(*group);
      out->set_ram_bytes(u.ram_bytes);
      out->set_ssd_bytes(u.ssd_bytes);
      out->set_pinned_chunks(u.pinned_chunks);
    }
    return true;
  }

  // The tenant's quota group in the store, made at its first namespace (tenant_quotas.h).
  // With must_fit, ResourceExhausted when its guaranteed share does not fit beside the
  // others' (storage's SetQuota); without (namespaces registered before a restart, whose
  // quotas were admitted then), it is set whatever the sum — a guarantee that cannot be
  // kept then fails stores rather than evicting another tenant.
  absl::Status AdmitQuota(const std::string& tenant, bool must_fit) {
    const std::optional<storage::Quota> quota = opt.quotas.For(tenant);
    if (!quota) return absl::OkStatus();
    std::lock_guard lk(quota_mu);
    if (quota_groups.contains(tenant)) return absl::OkStatus();
    const auto group = static_cast<storage::QuotaGroup>(quota_groups.size() + 1);
    KVC_RETURN_IF_ERROR(store->SetQuota(group, *quota, must_fit));
    quota_groups.emplace(tenant, group);
    return absl::OkStatus();
  }

  // A tenant's namespaces share one quota group in the store (tenant_quotas.h).
  void AssignQuota(const NamespaceInfo& ns) {
    if (!opt.quotas.For(ns.tenant)) return;
    absl::Status s = AdmitQuota(ns.tenant, /*must_fit=*/false);
    KVC_CHECK(s.ok()) << "quota of tenant " << ns.tenant << ": " << s;
    std::lock_guard lk(quota_mu);
    store->SetQuotaGroup(ns.id, quota_groups.at(ns.tenant));
  }

  void AssignRamPool(const NamespaceInfo& ns) {
    const std::optional<storage::RamPoolId> pool = opt.shm.PoolOf(ns.tenant);
    if (pool && *pool != 0 && *pool < store->ram_pool_count()) {
      absl::Status s = store->SetRamPool(ns.id, *pool);
      KVC_CHECK(s.ok()) << "namespace " << ns.id << ": " << s;
    }
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
    KVC_ASSIGN_OR_RETURN(std::string t, auth->TenantFor(Authorization(ctx)));
    *tenant = t;
    return limiter.Acquire(t);
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

  // A unary call served as a raw method: authenticated and admitted first, then the
  // request parsed (a request that does not parse is INVALID_ARGUMENT, logged like any
  // other failed call), then `work(tenant, &request, &response)`, then the response
  // serialized.
  template <typename Req, typename Resp, typename Work>
  grpc::ServerUnaryReactor* RawUnary(const char* method, grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* raw_request,
                                     grpc::ByteBuffer* raw_response, Work work,
                                     bool inline_work = false) {
    return Unary(
        method, ctx,
        [method, raw_request, raw_response, work](const std::string& tenant) mutable {
          grpc::ByteBuffer bytes(*raw_request);  // shares the slices
          grpc::ProtoBufferReader reader(&bytes);
          Req request;
          if (!request.ParseFromZeroCopyStream(&reader)) {
            return absl::InvalidArgumentError(absl::StrCat(
                method, ": the request does not parse as ", Req::descriptor()->name()));
          }
          Resp response;
          KVC_RETURN_IF_ERROR(work(tenant, &request, &response));
          bool own_buffer = false;
          if (!grpc::GenericSerialize<grpc::ProtoBufferWriter, Resp>(response, raw_response,
                                                                     &own_buffer)
                   .ok()) {
            return absl::InternalError(absl::StrCat(method, ": the response does not serialize"));
          }
          return absl::OkStatus();
        },
        inline_work);
  }

  absl::StatusOr<NamespaceInfo> Namespace(uint32_t id, const std::string& tenant) const {
    std::optional<NamespaceInfo> ns = registry->Get(id, tenant);
    if (!ns) return absl::NotFoundError(absl::StrCat("namespace ", id, " not found"));
    return *ns;
  }

  absl::Status Register(const std::string& tenant, const pb::RegisterNamespaceRequest& req,
                        pb::RegisterNamespaceResponse* resp) {
    if (req.model_id().empty()) return absl::InvalidArgumentError("model_id is empty");
    KVC_ASSIGN_OR_RETURN(ModelConfig config,
                         ParseModelConfig(req.model_config_json(), "model_config_json"));
    KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
    const uint32_t chunk_tokens =
        req.chunk_tokens() ? req.chunk_tokens() : opt.default_chunk_tokens;
    KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, schedule, chunk_tokens));
    if (static_cast<uint64_t>(layout.chunk_bytes) > opt.max_chunk_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a chunk of ", chunk_tokens, " tokens is ", layout.chunk_bytes,
                       " bytes; this server stores chunks of at most ", opt.max_chunk_bytes));
    }
    NamespaceInfo info;
    info.tenant = tenant;
    info.model_id = req.model_id();
    info.chunk_tokens = chunk_tokens;
    info.chunk_bytes = static_cast<uint64_t>(layout.chunk_bytes);
    info.vocab_size = static_cast<uint64_t>(config.vocab_size);
    info.root = NamespaceRoot(tenant, ModelFingerprint(req.model_id(), layout), kKvLayoutVersion,
                              chunk_tokens);
    info.key_scope = kKeyScopeBound;  // a namespace registered before keeps its own
    // The tenant's quota is admitted before its first namespace exists: a quota that does
    // not fit refuses the registration and leaves nothing behind.
    KVC_RETURN_IF_ERROR(AdmitQuota(tenant, /*must_fit=*/true));
    KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, registry->FindOrAdd(info));
    KVC_RETURN_IF_ERROR(store->RegisterNamespace(ns.id, ns.chunk_bytes));
    AssignRamPool(ns);
    AssignQuota(ns);
    resp->set_namespace_id(ns.id);
    resp->set_chunk_bytes(ns.chunk_bytes);
    resp->set_chunk_tokens(ns.chunk_tokens);
    resp->set_root_key(KeyBytes(ns.root));
    resp->set_kv_layout_version(kKvLayoutVersion);
    resp->set_vocab_size(ns.vocab_size);
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
    KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, Namespace(req.namespace_id(), tenant));
    std::vector<ChunkKey> keys;
    const bool packed = !req.packed_chunk_keys().empty();
    const bool by_key = packed || req.chunk_keys_size() > 0;
    if (by_key) {
      if (req.tokens_size() > 0 || (packed && req.chunk_keys_size() > 0)) {
        return absl::InvalidArgumentError(
            "a Lookup gives one of tokens, chunk_keys and packed_chunk_keys");
      }
      // The keys of a max_lookup_tokens prefix at the namespace's chunk size, at most.
      const uint64_t limit = opt.max_lookup_tokens / std::max<uint32_t>(1, ns.chunk_tokens);
      const auto max_keys = static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX));
      KVC_ASSIGN_OR_RETURN(std::vector<ChunkKey> parsed,
                           packed ? wire::UnpackKeys(req.packed_chunk_keys(), max_keys)
                                  : ParseKeys(req.chunk_keys(), max_keys));
      keys = std::move(parsed);
      resp->set_keys_seen(static_cast<uint32_t>(keys.size()));
    } else {
      if (static_cast<uint64_t>(req.tokens_size()) > opt.max_lookup_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            req.tokens_size(), " tokens in one Lookup; the limit is ", opt.max_lookup_tokens));
      }
      KVC_RETURN_IF_ERROR(CheckTokens(ns, req.tokens()));
      keys =
          ChunkKeys(ns.root, std::span(req.tokens().data(), req.tokens().size()), ns.chunk_tokens);
    }
    const std::vector<storage::Tier> tiers = store->Lookup(ns.id, StorageKeys(ns, keys));
    uint32_t matched = 0;
    while (matched < tiers.size() && tiers[matched] != storage::Tier::kNone) ++matched;
    resp->set_matched_chunks(matched);
    if (!by_key) {
      for (const ChunkKey& k : keys) resp->add_chunk_keys(KeyBytes(k));
    }
    const size_t reported = req.every_chunk() ? tiers.size() : matched;
    for (size_t i = 0; i < reported; ++i) resp->add_tiers(ToProto(tiers[i]));
    return absl::OkStatus();
  }

  // A request's namespace and chunk keys: as the caller gave them (for answers) and as
  // storage holds them (bound to the namespace, namespace_registry.h: StorageKey).
  struct ScopedKeys {
    NamespaceInfo ns;
    std::vector<ChunkKey> keys;
    std::vector<ChunkKey> stored;
  };
  template <typename Req>
  absl::StatusOr<ScopedKeys> NamespaceAndKeys(const std::string& tenant, const Req& req) {
    KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, Namespace(req.namespace_id(), tenant));
    KVC_ASSIGN_OR_RETURN(std::vector<ChunkKey> keys,
                         ParseKeys(req.chunk_keys(), opt.max_keys_per_call));
    std::vector<ChunkKey> stored = StorageKeys(ns, keys);
    return ScopedKeys{std::move(ns), std::move(keys), std::move(stored)};
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
    return CountOk(store->PinBatch(nk->ns.id, nk->stored, until));
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
    KVC_ASSIGN_OR_RETURN(storage::RamPoolId pool, opt.shm.MappablePool(tenant, *store));
    auto nk = NamespaceAndKeys(tenant, req);
    if (!nk.ok()) return nk.status();
    for (uint64_t done : req.release_lease_ids())
      (void)DoReleaseRefs(tenant, done);  // saves a call
    ReapLeases();
    const uint32_t ms =
        std::min(req.lease_ms() ? req.lease_ms() : opt.default_lease_ms, opt.max_lease_ms);
    resp->set_lease_ms(ms);
    resp->set_arena_id(arena_ids.at(pool));
    RefLease lease{
        tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
    for (size_t i = 0; i < nk->keys.size(); ++i) {
      absl::StatusOr<storage::RamLease> l = store->LeaseRam(nk->ns.id, nk->stored[i]);
      // The leading chunks only; the client fetches the rest over gRPC. A chunk in another
      // pool (stored before the tenant had its own) is not in the caller's mapping.
      if (!l.ok() || l->pool() != pool) break;
      CountFetch(tenant, 1, 0, 0);
      pb::ChunkRef* ref = resp->add_refs();
      ref->set_chunk_key(KeyBytes(nk->keys[i]));
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

  // T0: leases the leading chunks in HBM (the store copies in those only in RAM or SSD).
  absl::Status DoFetchDeviceRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                                 pb::FetchDeviceRefsResponse* resp) {
    const storage::DeviceArena* arena = store->hbm_arena();
    if (arena == nullptr) {
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
    resp->set_device(arena->device());
    resp->set_arena_id(arena->id());
    RefLease lease{
        tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
    for (size_t i = 0; i < nk->keys.size(); ++i) {
      // A T0 hit, or a copy promoted from RAM or SSD. Missing, failed its checksum, or
      // every T0 slot leased: the prefix ends here.
      absl::StatusOr<storage::HbmLease> l = store->LeaseHbm(nk->ns.id, nk->stored[i]);
      if (!l.ok()) break;
      pb::ChunkRef* ref = resp->add_refs();
      ref->set_chunk_key(KeyBytes(nk->keys[i]));
      ref->set_arena_offset(l->offset());
      ref->set_length(l->length());
      ref->set_checksum(l->checksum());
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

  // ---- what Stats tells a tenant about itself ----
  struct TenantCounters {
    uint64_t ram_hits = 0, ssd_hits = 0, misses = 0;
  };
  void CountFetch(const std::string& tenant, uint64_t ram_hits, uint64_t ssd_hits,
                  uint64_t misses) {
    std::lock_guard lk(counters_mu);
    TenantCounters& c = counters[tenant];
    c.ram_hits += ram_hits;
    c.ssd_hits += ssd_hits;
    c.misses += misses;
  }
  TenantCounters CountersOf(const std::string& tenant) {
    std::lock_guard lk(counters_mu);
    auto it = counters.find(tenant);
    return it == counters.end() ? TenantCounters{} : it->second;
  }
  bool SeesTotals(const std::string& tenant) const {
    return !auth->enabled() || opt.admin_tenants.contains(tenant);
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
  std::mutex counters_mu;
  std::map<std::string, TenantCounters> counters;  // per tenant
  std::mutex quota_mu;
  std::map<std::string, storage::QuotaGroup> quota_groups;  // per tenant with a quota
  Executor executor;  // declared last: its threads stop before the state they use goes away
};

// The two streaming calls, each served by a reactor of its own (fetch_reactor.cc,
// store_reactor.cc), started once the call is admitted.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(KvCacheService::Impl* svc,
                                                       TenantLimiter::Slot slot,
                                                       KvCacheService::Impl::ScopedKeys keys);
grpc::ServerReadReactor<grpc::ByteBuffer>* StartStore(KvCacheService::Impl* svc,
                                                      TenantLimiter::Slot slot,
                                                      grpc::ByteBuffer* response);

}  // namespace kvc::cachesvc
