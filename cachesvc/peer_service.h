// ClusterPeerService: the calls a cluster's nodes make to each other
// (proto/kvcache/v1/peer.proto) — Holds and Replicate, which another node's repair
// (repair.h) uses to bring chunks back to R copies, and Drain (kvctl drain).
//
// Authenticated by the cluster credential alone (`x-kvcache-peer` metadata, kvcached
// --cluster-secret-file), never by a tenant's token: a tenant cannot reach these calls, so
// it cannot put chunks into another tenant's namespace through them. A node without a
// credential takes peer calls only when it has no tenants either (no --auth-tokens: every
// caller is the tenant "default" anyway). Whatever arrives is checked as a tenant's Store
// would be, and more: the namespace's id must be the one its tenant and root derive, each
// payload must match its checksum, and each key is bound to the namespace here.
#pragma once

#include <functional>
#include <string>

#include "cachesvc/service.h"
#include "kvcache/v1/peer.grpc.pb.h"

namespace kvc::cachesvc {

// Raw methods, as KVCache's: the caller is authenticated first, then the request parsed
// (one that does not parse is INVALID_ARGUMENT naming the method), then served.
namespace peer_internal {
using Base = kvcache::v1::ClusterPeer::WithRawCallbackMethod_Holds<
    kvcache::v1::ClusterPeer::WithRawCallbackMethod_Replicate<
        kvcache::v1::ClusterPeer::WithRawCallbackMethod_Drain<
            kvcache::v1::ClusterPeer::CallbackService>>>;
}  // namespace peer_internal

class ClusterPeerService final : public peer_internal::Base {
 public:
  // `secret`: the cluster credential (empty: none). `on_drain`: starts this node's drain
  // and returns the chunks it holds, or why it cannot drain.
  ClusterPeerService(KvCacheService* service, std::string secret,
                     std::function<absl::StatusOr<uint64_t>()> on_drain);

  grpc::ServerUnaryReactor* Holds(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;

 private:
  absl::Status CheckPeer(const grpc::CallbackServerContext* ctx) const;
  KvCacheService::Impl* svc_;
  std::string secret_;
  std::function<absl::StatusOr<uint64_t>()> on_drain_;
};

}  // namespace kvc::cachesvc
