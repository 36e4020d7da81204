// KvCacheService: the kvcache.v1.KVCache gRPC service (callback API) over a ChunkStore.
//
// Every call is authenticated first (Authenticator) and then runs on the service's own
// Executor; reactors only hand work over and resume when it is done. Fetch writes one
// chunk at a time (a client that stops reading holds one chunk's memory, until its
// deadline or cancellation frees it); Store reads one message at a time. Each bad request
// gets a precise status and changes nothing: a namespace of another tenant is NOT_FOUND,
// exactly like one that does not exist.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "cachesvc/auth.h"
#include "cachesvc/executor.h"
#include "cachesvc/metrics.h"
#include "cachesvc/namespace_registry.h"
#include "cachesvc/shm_access.h"
#include "cachesvc/tenant_limits.h"
#include "cachesvc/tenant_quotas.h"
#include "cachesvc/tombstones.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "storage/chunk_store.h"
#include "storage/hbm_tier.h"

namespace kvc::cachesvc {

// kvcached's default Lookup budget per tenant, per core of the machine: on 2 cores it keeps
// another tenant's one-key Lookup p99 within 1.1-1.4x of its quiet value under a flood of
// 65,536-key Lookups (docs/benchmarks.md, "Tenant fairness"), and is still ~120 Lookups/s of
// a 4,096-chunk (1 M-token) prefix per core for each tenant.
inline constexpr double kLookupKeysPerSecondPerCore = 500000;

struct ServiceOptions {
  uint32_t default_chunk_tokens = 256;
  uint64_t max_chunk_bytes = 0;           // the store's slot payload size
  uint64_t max_lookup_tokens = 4u << 20;  // per Lookup call
  uint32_t max_keys_per_call = 65536;     // Fetch / Pin / Unpin / Delete, and Lookup's keys
  // Every name a tenant (or a peer) supplies — model_id, a peer namespace's tenant — is at
  // most this many bytes (kvcached --max-name-bytes); the model config JSON at most
  // max_model_config_bytes. INVALID_ARGUMENT naming the field and the limit otherwise.
  size_t max_name_bytes = 256;
  size_t max_model_config_bytes = 256 * 1024;
  int executor_threads = 4;
  size_t executor_queue = 4096;
  ServiceMetrics* metrics = nullptr;  // optional; not owned
  // Who maps which RAM pool (FetchRefs, and the arena socket); the default is the
  // single-tenant rule of a server without authentication.
  ShmAccess shm;
  size_t max_ref_leases = 4096;  // FetchRefs / FetchDeviceRefs leases one tenant holds at once
  uint32_t default_lease_ms = 10000;
  uint32_t max_lease_ms = 60000;
  uint32_t max_calls_per_tenant = 256;  // in flight at once (streams for their whole life)
  // What each tenant's Lookups may cost per second, in keys (a request's bytes / 16: one
  // caller key, or four tokens), with a burst of a quarter second's worth (at least one
  // call of max_keys_per_call); past it a Lookup waits up to 1 s, then is refused
  // (cost_pacer.h). 0: no pacing (kvcached's default: kLookupKeysPerSecondPerCore for each
  // core of the machine).
  double lookup_keys_per_second = 0;
  // With authentication on, only these tenants may map the store's T0 (FetchDeviceRefs;
  // it holds every tenant's chunks).
  std::set<std::string> device_tenants;
  // With authentication on, Stats shows these tenants the daemon's totals; every other
  // tenant sees its own chunks and hits only (and the tiers' capacities).
  std::set<std::string> admin_tenants;
  // What each tenant may keep in RAM and on SSD, and pin (--tenant-quota).
  TenantQuotas quotas;
  // A node of a cluster (docs/cluster.md): a chunk's parent may live on another node, so
  // Store does not require it here.
  bool cluster = false;
  // Durable chunks of one Store stream stored together (one group commit, one fdatasync,
  // for up to this many); 1: each message on its own (store_reactor.cc).
  size_t durable_store_batch = 8;
  // Batches of one Store stream being written at once: with 2, the next batch's messages
  // are read and its writes issued while the previous batch's sync runs (each chunk is still
  // acknowledged only after a sync that began once its write completed); 1: one at a time.
  size_t durable_store_in_flight = 2;
  // A cluster node's memory of its tenants' deletes (tombstones.h; not owned): Delete adds
  // to it, peers' copies and clients' repair copies of a deleted chunk are refused, and
  // Lookup (every_chunk) and Holds say which keys were deleted. Null: none kept (one node).
  Tombstones* tombstones = nullptr;
  // A cluster node's repair state for Stats (repair.h); null: no repair runs here.
  std::function<void(kvcache::v1::RepairStats*)> repair_stats;
};

// Every method is raw: requests are parsed by the service after authentication (a request
// that does not parse is INVALID_ARGUMENT, logged), and Fetch and Store frame payloads
// themselves (fetch_reactor.cc, store_reactor.cc). On the wire they are the proto's.
namespace service_internal {
using Base = kvcache::v1::KVCache::WithRawCallbackMethod_RegisterNamespace<
    kvcache::v1::KVCache::WithRawCallbackMethod_Lookup<
        kvcache::v1::KVCache::WithRawCallbackMethod_Fetch<
            kvcache::v1::KVCache::WithRawCallbackMethod_Store<
                kvcache::v1::KVCache::WithRawCallbackMethod_Pin<
                    kvcache::v1::KVCache::WithRawCallbackMethod_Unpin<
                        kvcache::v1::KVCache::WithRawCallbackMethod_Delete<
                            kvcache::v1::KVCache::WithRawCallbackMethod_Stats<
                                kvcache::v1::KVCache::WithRawCallbackMethod_FetchRefs<
                                    kvcache::v1::KVCache::WithRawCallbackMethod_FetchDeviceRefs<
                                        kvcache::v1::KVCache::WithRawCallbackMethod_ReleaseRefs<
                                            kvcache::v1::KVCache::WithRawCallbackMethod_ListPins<
                                                kvcache::v1::KVCache::
                                                    WithRawCallbackMethod_UnpinTenant<
                                                        kvcache::v1::KVCache::
                                                            CallbackService>>>>>>>>>>>>>;
}  // namespace service_internal

class KvCacheService final : public service_internal::Base {
 public:
  KvCacheService(storage::ChunkStore* store, NamespaceRegistry* registry, const Authenticator* auth,
                 ServiceOptions options);
  ~KvCacheService() override;

  grpc::ServerUnaryReactor* RegisterNamespace(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req,
                                              grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Store(grpc::CallbackServerContext* ctx,
                                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Pin(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* FetchRefs(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* FetchDeviceRefs(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* req,
                                            grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ReleaseRefs(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  // The operator's view of a tenant's pins (admin tenants only).
  grpc::ServerUnaryReactor* ListPins(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* UnpinTenant(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;

  class Impl;
  // For the cluster's peer calls (peer_service.h), which share the service's state.
  Impl* impl() { return impl_.get(); }
  // A draining node (kvcached --drain, kvctl drain): Store and peers' copies are refused
  // with UNAVAILABLE from now on, so cluster clients place new chunks on the next node of
  // the ranking while this node hands its own over; reads go on.
  void StopTakingStores();

 private:
  std::unique_ptr<Impl> impl_;
  Mutex reaper_mu_;
  std::condition_variable_any reaper_cv_;
  bool stopping_ ABSL_GUARDED_BY(reaper_mu_) = false;
  std::thread reaper_;
};

}  // namespace kvc::cachesvc
