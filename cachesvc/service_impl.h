// The service's internals, shared by service.cc (the calls), fetch_reactor.cc and
// store_reactor.cc (the two streams): admission (auth, per-tenant limits), namespaces,
// lookup, and the executor; the parts with state of their own are classes of their own
// (lease_table.h, quota_groups.h, tenant_counters.h). Bodies in service_impl.cc and
// lookup.cc, but the templates. Not a public header.
#pragma once

#include <algorithm>
#include <atomic>
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
#include "cachesvc/cost_pacer.h"
#include "cachesvc/delayed_start.h"
#include "cachesvc/lease_table.h"
#include "cachesvc/log.h"
#include "cachesvc/quota_groups.h"
#include "cachesvc/service.h"
#include "cachesvc/tenant_counters.h"
#include "client/prefix_hash.h"
#include "engine/spec/chunk_layout.h"
#include "kvcache/v1/peer.pb.h"
#include "wire/arena_handshake.h"
#include "wire/grpc_status.h"
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
    case storage::Tier::kRados:
      return pb::TIER_RADOS;
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

// The keys of a request's repeated chunk_keys field; InvalidArgument naming a key that is
// not 16 bytes, or more than max_keys of them.
absl::StatusOr<std::vector<ChunkKey>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& raw, uint32_t max_keys);

using wire::KeyBytes;

// A raw unary call's body: the request parsed as Req (one that does not parse is
// INVALID_ARGUMENT naming the method), work(request, &response), the response serialized
// into raw_response. Shared by the tenants' calls and the peers' (peer_service.cc).
template <typename Req, typename Resp, typename Work>
absl::Status ServeRaw(const char* method, const grpc::ByteBuffer* raw_request,
                      grpc::ByteBuffer* raw_response, Work&& work) {
  grpc::ByteBuffer bytes(*raw_request);  // shares the slices
  grpc::ProtoBufferReader reader(&bytes);
  Req request;
  if (!request.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": the request does not parse as ", Req::descriptor()->name()));
  }
  Resp response;
  KVC_RETURN_IF_ERROR(work(request, &response));
  bool own_buffer = false;
  if (!grpc::GenericSerialize<grpc::ProtoBufferWriter, Resp>(response, raw_response, &own_buffer)
           .ok()) {
    return absl::InternalError(absl::StrCat(method, ": the response does not serialize"));
  }
  return absl::OkStatus();
}

class KvCacheService::Impl {
 public:
  Impl(storage::ChunkStore* s, NamespaceRegistry* r, const Authenticator* a, ServiceOptions o);

  // The tenant's quota and what it holds against it; false without a quota.
  bool QuotaOf(const std::string& tenant, pb::TenantQuota* out) const {
    return quotas.Describe(tenant, out);
  }
  void AssignRamPool(const NamespaceInfo& ns);
  // Names the namespace in the store's shared tier (if it has one) by a tag every node
  // derives alike from its root (the store id is this node's own); a namespace whose keys
  // are not bound to it (registered before key scopes) stays off the shared tier.
  void ShareNamespace(const NamespaceInfo& ns);

  // Records a finished call in the metrics (if any) and the log: successes at debug,
  // the caller's mistakes at info, the server's own failures at error.
  void Observe(const char* method, absl::string_view tenant, const grpc::Status& s,
               std::chrono::steady_clock::time_point start) const;

  // Authenticates a call and takes one of its tenant's in-flight slots. `tenant` is set
  // once known (for the log); callers start it as "-".
  absl::StatusOr<TenantLimiter::Slot> Admit(const grpc::CallbackServerContext* ctx,
                                            std::string* tenant);

  // Runs `work` on the executor (or right here when `inline_work`: short, never blocking
  // on I/O) and finishes the unary call with its status. A call that costs `cost_keys`
  // is first charged to its tenant's budget (cost_pacer.h): past it, the call is started
  // only once the budget has refilled, or refused.
  template <typename Work>
  grpc::ServerUnaryReactor* Unary(const char* method, grpc::CallbackServerContext* ctx, Work work,
                                  bool inline_work = false, uint64_t cost_keys = 0) {
    const auto start = std::chrono::steady_clock::now();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    std::string tenant(1, '-');
    absl::StatusOr<TenantLimiter::Slot> admitted = Admit(ctx, &tenant);
    if (!admitted.ok()) {
      Observe(method, tenant, wire::ToGrpc(admitted.status()), start);
      reactor->Finish(wire::ToGrpc(admitted.status()));
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
      finish(wire::ToGrpc(work(slot->tenant())));
      return reactor;
    }
    auto submit = [this, finish, work, slot]() mutable {
      if (!executor.Submit(slot->tenant(), [finish, work, slot]() mutable {
            finish(wire::ToGrpc(work(slot->tenant())));
          })) {
        finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
      }
    };
    absl::StatusOr<CostPacer::Clock::duration> wait =
        cost_keys > 0 ? pacer.Charge(slot->tenant(), cost_keys) : CostPacer::Clock::duration{};
    if (!wait.ok()) {
      finish(wire::ToGrpc(wait.status()));
    } else if (*wait > CostPacer::Clock::duration::zero()) {
      // Held back without a thread; the tenant's in-flight slot stays taken meanwhile, so a
      // tenant cannot pile up more held calls than max_calls_per_tenant.
      held_back.At(CostPacer::Clock::now() + *wait, std::move(submit));
    } else {
      submit();
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
                                     bool inline_work = false, uint64_t cost_keys = 0) {
    return Unary(
        method, ctx,
        [method, raw_request, raw_response, work](const std::string& tenant) mutable {
          return ServeRaw<Req, Resp>(
              method, raw_request, raw_response,
              [&](const Req& req, Resp* resp) { return work(tenant, &req, resp); });
        },
        inline_work, cost_keys);
  }

  absl::StatusOr<NamespaceInfo> Namespace(uint32_t id, const std::string& tenant) const;
  // InvalidArgument naming `field` when `value` is longer than opt.max_name_bytes.
  absl::Status CheckName(const char* field, const std::string& value) const;
  absl::Status Register(const std::string& tenant, const pb::RegisterNamespaceRequest& req,
                        pb::RegisterNamespaceResponse* resp);
  // The layout and root of a namespace of each key mode (Register's two halves).
  absl::Status CallerKeyedNamespace(const pb::RegisterNamespaceRequest& req,
                                    NamespaceInfo* info) const;
  absl::Status TokenKeyedNamespace(const pb::RegisterNamespaceRequest& req,
                                   NamespaceInfo* info) const;
  absl::Status CheckTokens(const NamespaceInfo& ns,
                           const google::protobuf::RepeatedField<uint32_t>& tokens) const;
  // peer_service.cc: the calls of a cluster's other nodes (authenticated there).
  absl::StatusOr<std::optional<NamespaceInfo>> PeerNamespace(const pb::PeerNamespace& p,
                                                             bool create);
  absl::Status DoHolds(const pb::HoldsRequest& req, pb::HoldsResponse* resp);
  absl::Status DoReplicate(const pb::ReplicateRequest& req, pb::ReplicateResponse* resp);
  // lookup.cc
  absl::Status DoLookup(const std::string& tenant, const pb::LookupRequest& req,
                        pb::LookupResponse* resp);

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

  // Durable puts whose TTLs may differ (ttl_s[i] for puts[i]): one PutBatch — one group
  // commit, one fdatasync — per run of equal TTL, results in the requests' order. What a
  // Store stream's staged chunks and a peer's copies are stored with.
  std::vector<absl::StatusOr<storage::PutResult>> PutDurable(
      std::span<const storage::PutRequest> puts, std::span<const int64_t> ttl_s);

  // Counts the OK statuses; the first error other than NotFound fails the call.
  static absl::StatusOr<uint32_t> CountOk(const std::vector<absl::Status>& statuses);
  absl::StatusOr<uint32_t> DoPin(const std::string& tenant, const pb::PinRequest& req,
                                 int64_t until);
  // The operator's calls on a tenant's pins: PERMISSION_DENIED unless `caller` sees the
  // daemon's totals (SeesTotals). `unpin`: every pin of the tenant is removed as listed.
  absl::Status DoTenantPins(const std::string& caller, const std::string& tenant, uint32_t limit,
                            bool unpin, pb::ListPinsResponse* listed, uint32_t* unpinned);

  // ---- leases of RAM and HBM slots handed to co-located clients (lease_table.h) ----
  using RefLease = LeaseTable::Lease;
  // Drops leases past their time; called on every FetchRefs and by the reaper thread.
  void ReapLeases() { leases.Reap(); }
  absl::Status DoFetchRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                           pb::FetchRefsResponse* resp);
  // T0: leases the leading chunks in HBM (the store copies in those only in RAM or SSD).
  absl::Status DoFetchDeviceRefs(const std::string& tenant, const pb::FetchRefsRequest& req,
                                 pb::FetchDeviceRefsResponse* resp);
  // Keeps `lease` until released or expired; its id goes into resp (its refs are dropped
  // when the tenant holds its limit of leases already).
  template <typename Response>
  absl::Status Hold(RefLease lease, Response* resp) {
    absl::StatusOr<uint64_t> id = leases.Hold(std::move(lease));
    if (!id.ok()) {
      resp->clear_refs();
      return id.status();
    }
    resp->set_lease_id(*id);
    return absl::OkStatus();
  }
  absl::Status DoReleaseRefs(const std::string& tenant, uint64_t id) {
    return leases.Release(tenant, id);
  }

  // ---- what Stats tells a tenant about itself ----
  void CountFetch(const std::string& tenant, uint64_t ram_hits, uint64_t ssd_hits,
                  uint64_t misses) {
    counters.Add(tenant, ram_hits, ssd_hits, misses);
  }
  TenantCounters::Counts CountersOf(const std::string& tenant) const { return counters.Of(tenant); }
  bool SeesTotals(const std::string& tenant) const {
    return !auth->enabled() || opt.admin_tenants.contains(tenant);
  }

  // Set when the node drains (KvCacheService::StopTakingStores).
  std::atomic<bool> refusing_stores{false};
  absl::Status TakingStores() const {
    return refusing_stores.load() ? absl::UnavailableError(
                                        "this node is draining: it takes no new chunks (the "
                                        "next node of the ranking does)")
                                  : absl::OkStatus();
  }

  storage::ChunkStore* store;
  NamespaceRegistry* registry;
  const Authenticator* auth;
  ServiceOptions opt;
  TenantLimiter limiter;
  std::string hbm_handle;           // the HBM arena's IPC handle, exported once
  std::vector<uint64_t> arena_ids;  // ArenaIdentity per RAM pool (0: no slots)
  LeaseTable leases;
  TenantCounters counters;
  QuotaGroups quotas;
  CostPacer pacer;
  Executor executor;  // its threads stop before the state they use goes away
  // Declared after the executor, so destroyed before it: the calls still held back are
  // handed to the executor, which then runs them before it stops.
  DelayedStart held_back;
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
