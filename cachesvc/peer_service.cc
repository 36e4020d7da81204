#include "cachesvc/peer_service.h"

#include <algorithm>
#include <set>

#include "cachesvc/service_impl.h"
#include "storage/slot_format.h"

namespace kvc::cachesvc {
namespace {

// Equal strings, in time that does not depend on where they differ.
bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

// A peer's namespace made (or found) here, after checking that it is one every node
// derives the same way. `create`: register it if this node has not seen it.
absl::StatusOr<std::optional<NamespaceInfo>> KvCacheService::Impl::PeerNamespace(
    const pb::PeerNamespace& p, bool create) {
  if (p.tenant().empty()) return absl::InvalidArgumentError("peer namespace: tenant is empty");
  // A peer's identities are bounded as a tenant's registration is: a node never keeps, or
  // looks up by, a name no tenant could have registered.
  KVC_RETURN_IF_ERROR(CheckName("peer namespace: tenant", p.tenant()));
  KVC_RETURN_IF_ERROR(CheckName("peer namespace: model_id", p.model_id()));
  if (!auth->enabled() && p.tenant() != "default") {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer namespace: tenant ", p.tenant(),
        " on a node without tenants (no --auth-tokens: every namespace is \"default\"'s)"));
  }
  KVC_ASSIGN_OR_RETURN(ChunkKey root, wire::KeyFrom(p.root_key(), "peer namespace root_key"));
  if (p.namespace_id() != DerivedNamespaceId(p.tenant(), root)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer namespace ", p.namespace_id(), " is not the id tenant ", p.tenant(), " and root ",
        root.Hex(), " derive (", DerivedNamespaceId(p.tenant(), root), ")"));
  }
  if (std::optional<NamespaceInfo> known = registry->Get(p.namespace_id(), p.tenant())) {
    if (known->root != root || known->chunk_bytes != p.chunk_bytes() ||
        known->key_mode != static_cast<uint32_t>(p.key_mode())) {
      return absl::FailedPreconditionError(
          absl::StrCat("peer namespace ", p.namespace_id(), " (root ", root.Hex(), ", ",
                       p.chunk_bytes(), "-byte chunks, key mode ", p.key_mode(),
                       ") differs from this node's (root ", known->root.Hex(), ", ",
                       known->chunk_bytes, "-byte chunks, key mode ", known->key_mode, ")"));
    }
    return known;
  }
  if (!create) return std::optional<NamespaceInfo>();
  if (p.chunk_bytes() == 0 || p.chunk_bytes() > opt.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer namespace: chunk_bytes is ", p.chunk_bytes(),
                     "; this node stores chunks of 1 to ", opt.max_chunk_bytes, " bytes"));
  }
  NamespaceInfo info;
  info.tenant = p.tenant();
  info.model_id = p.model_id();
  info.chunk_tokens = p.chunk_tokens();
  info.chunk_bytes = p.chunk_bytes();
  info.vocab_size = p.vocab_size();
  info.root = root;
  info.key_scope = kKeyScopeLatest;
  if (p.key_mode() == pb::KEY_MODE_CALLER) {
    info.key_mode = kKeysFromCaller;
    // A caller-keyed root follows from what the namespace is: check it.
    if (root != client::CallerNamespaceRoot(info.tenant, info.model_id, info.chunk_bytes,
                                            info.chunk_tokens)) {
      return absl::InvalidArgumentError(
          "peer namespace: root_key is not the caller-keyed root of "
          "its tenant, model_id, chunk_bytes and chunk_tokens");
    }
  } else if (p.key_mode() == pb::KEY_MODE_TOKENS) {
    info.key_mode = kKeysFromTokens;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("peer namespace: key_mode ", p.key_mode()));
  }
  KVC_RETURN_IF_ERROR(quotas.Admit(info.tenant, /*must_fit=*/true));
  KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, registry->FindOrAdd(info));
  KVC_RETURN_IF_ERROR(store->RegisterNamespace(ns.store_id, ns.chunk_bytes));
  AssignRamPool(ns);
  ShareNamespace(ns);
  quotas.Assign(ns);
  return ns;
}

absl::Status KvCacheService::Impl::DoHolds(const pb::HoldsRequest& req, pb::HoldsResponse* resp) {
  KVC_ASSIGN_OR_RETURN(std::vector<ChunkKey> keys,
                       wire::UnpackKeys(req.packed_chunk_keys(), opt.max_keys_per_call));
  KVC_ASSIGN_OR_RETURN(std::optional<NamespaceInfo> ns, PeerNamespace(req.ns(), /*create=*/false));
  if (!ns) {  // never seen here: holds none of them
    for (size_t i = 0; i < keys.size(); ++i) resp->add_tiers(pb::TIER_NONE);
    return absl::OkStatus();
  }
  const std::vector<ChunkKey> stored = StorageKeys(*ns, keys);
  for (storage::Tier t : store->Lookup(ns->store_id, stored)) resp->add_tiers(ToProto(t));
  if (opt.tombstones != nullptr) {
    for (size_t i = 0; i < stored.size(); ++i) {
      if (opt.tombstones->Deleted(ns->store_id, stored[i])) {
        resp->add_deleted(static_cast<uint32_t>(i));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::DoReplicate(const pb::ReplicateRequest& req,
                                               pb::ReplicateResponse* resp) {
  if (static_cast<uint32_t>(req.chunks_size()) > opt.max_keys_per_call) {
    return absl::InvalidArgumentError(
        absl::StrCat(req.chunks_size(), " chunks in one call; at most ", opt.max_keys_per_call));
  }
  KVC_RETURN_IF_ERROR(TakingStores());
  KVC_ASSIGN_OR_RETURN(std::optional<NamespaceInfo> found,
                       PeerNamespace(req.ns(), /*create=*/true));
  const NamespaceInfo& ns = *found;
  const int64_t now = NowS();
  // Everything is checked before anything is stored: a bad chunk fails the call, naming it.
  struct Checked {
    ChunkKey key;
    std::optional<ChunkKey> parent;
    std::span<const uint8_t> payload;
    int64_t ttl_s = 0;
    int64_t pin_until_s = 0;
  };
  std::vector<Checked> chunks;
  for (int i = 0; i < req.chunks_size(); ++i) {
    const pb::ReplicaChunk& c = req.chunks(i);
    const std::string where = absl::StrCat("chunk ", i, ": ");
    absl::StatusOr<ChunkKey> key = wire::KeyFrom(c.chunk_key(), "chunk_key");
    if (!key.ok()) return absl::InvalidArgumentError(where + std::string(key.status().message()));
    Checked ck{*key, std::nullopt, {}, 0, c.pin_until_unix_s()};
    if (!c.parent_key().empty()) {
      absl::StatusOr<ChunkKey> parent = wire::KeyFrom(c.parent_key(), "parent_key");
      if (!parent.ok()) {
        return absl::InvalidArgumentError(where + std::string(parent.status().message()));
      }
      ck.parent = *parent;
    }
    if (c.payload().size() != ns.chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, "payload is ", c.payload().size(),
                                                     " bytes, namespace ", ns.id, " expects ",
                                                     ns.chunk_bytes));
    }
    ck.payload =
        std::span(reinterpret_cast<const uint8_t*>(c.payload().data()), c.payload().size());
    if (storage::PayloadChecksum(ck.payload) != c.checksum()) {
      return absl::DataLossError(
          absl::StrCat(where, key->Hex(), ": payload does not match its checksum"));
    }
    if (c.expires_unix_s() != 0) {
      if (c.expires_unix_s() <= now) {
        resp->set_expired(resp->expired() + 1);
        continue;
      }
      ck.ttl_s = c.expires_unix_s() - now;
    }
    // Deleted here by its tenant while the sender was away: not brought back.
    if (opt.tombstones != nullptr && opt.tombstones->Deleted(ns.store_id, StorageKey(ns, ck.key))) {
      resp->set_deleted(resp->deleted() + 1);
      continue;
    }
    chunks.push_back(ck);
  }
  // Stored together (one group commit per run of equal TTL), as a Store stream's are. A
  // parent is named only when held here or earlier in this call (it orders eviction).
  std::vector<storage::PutRequest> puts;
  std::vector<int64_t> ttls;
  std::set<ChunkKey> in_call;
  for (const Checked& c : chunks) {
    std::optional<ChunkKey> stored_parent;
    if (c.parent) {
      const ChunkKey p = StorageKey(ns, *c.parent);
      if (in_call.contains(p) || store->Contains(ns.store_id, p) != storage::Tier::kNone) {
        stored_parent = p;
      }
    }
    puts.emplace_back(ns.store_id, StorageKey(ns, c.key), stored_parent, c.payload,
                      ChunkOrigin{c.key, c.parent});
    in_call.insert(puts.back().key);
    ttls.push_back(c.ttl_s);
  }
  const std::vector<absl::StatusOr<storage::PutResult>> results = PutDurable(puts, ttls);
  for (size_t i = 0; i < chunks.size(); ++i) {
    KVC_RETURN_IF_ERROR(results[i].status());
    if (results[i]->already_present) {
      resp->set_already_present(resp->already_present() + 1);
    } else {
      resp->set_stored(resp->stored() + 1);
    }
    if (chunks[i].pin_until_s > now) {
      KVC_RETURN_IF_ERROR(store->Pin(ns.store_id, puts[i].key, chunks[i].pin_until_s));
    }
  }
  return absl::OkStatus();
}

ClusterPeerService::ClusterPeerService(KvCacheService* service, std::string secret,
                                       std::function<absl::StatusOr<uint64_t>()> on_drain)
    : svc_(service->impl()), secret_(std::move(secret)), on_drain_(std::move(on_drain)) {}

absl::Status ClusterPeerService::CheckPeer(const grpc::CallbackServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find(wire::kPeerCredentialMetadata);
  if (secret_.empty()) {
    if (svc_->auth->enabled()) {
      return absl::UnauthenticatedError(
          "this node takes no peer calls: it has tenants but no cluster credential "
          "(kvcached --cluster-secret-file)");
    }
    return absl::OkStatus();
  }
  if (it == md.end()) {
    return absl::UnauthenticatedError(absl::StrCat("missing \"", wire::kPeerCredentialMetadata,
                                                   "\" metadata (the cluster credential)"));
  }
  if (!SameSecret(std::string_view(it->second.data(), it->second.size()), secret_)) {
    return absl::UnauthenticatedError("wrong cluster credential");
  }
  return absl::OkStatus();
}

namespace {

// The peers' calls take their turn in the executor as one more tenant would (a name no
// token file can give a tenant: it has a control character).
const std::string kPeerWork("\x01peer");

// Authenticated (`admitted`), then on the executor: ServeRaw (the request parsed, served
// by work(request, &response), the response serialized).
template <typename Req, typename Resp, typename Work>
grpc::ServerUnaryReactor* RunPeerCall(KvCacheService::Impl* svc, const char* method,
                                      grpc::CallbackServerContext* ctx, absl::Status admitted,
                                      const grpc::ByteBuffer* raw_request,
                                      grpc::ByteBuffer* raw_response, Work work) {
  const auto start = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto finish = [svc, reactor, method, start](const absl::Status& s) {
    const grpc::Status g = wire::ToGrpc(s);
    svc->Observe(method, "(peer)", g, start);
    reactor->Finish(g);
  };
  auto serve = [method, raw_request, raw_response, work]() mutable {
    return ServeRaw<Req, Resp>(method, raw_request, raw_response, work);
  };
  if (!admitted.ok()) {
    finish(admitted);
  } else if (!svc->executor.Submit(kPeerWork, [finish, serve]() mutable { finish(serve()); })) {
    finish(absl::ResourceExhaustedError("server busy: work queue full"));
  }
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* ClusterPeerService::Holds(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req,
                                                    grpc::ByteBuffer* resp) {
  return RunPeerCall<pb::HoldsRequest, pb::HoldsResponse>(
      svc_, "Peer.Holds", ctx, CheckPeer(ctx), req, resp,
      [this](const pb::HoldsRequest& r, pb::HoldsResponse* out) { return svc_->DoHolds(r, out); });
}

grpc::ServerUnaryReactor* ClusterPeerService::Replicate(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* req,
                                                        grpc::ByteBuffer* resp) {
  return RunPeerCall<pb::ReplicateRequest, pb::ReplicateResponse>(
      svc_, "Peer.Replicate", ctx, CheckPeer(ctx), req, resp,
      [this](const pb::ReplicateRequest& r, pb::ReplicateResponse* out) {
        return svc_->DoReplicate(r, out);
      });
}

grpc::ServerUnaryReactor* ClusterPeerService::Drain(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req,
                                                    grpc::ByteBuffer* resp) {
  // Drain ends the node: it always takes the cluster credential, also on a node that takes
  // the other peer calls without one (no tenants, no secret), which drains only from its
  // own host (SIGTERM with --drain, or SIGUSR1).
  const absl::Status admitted =
      secret_.empty() ? absl::PermissionDeniedError(
                            "Drain takes the cluster credential and this node has none "
                            "(kvcached --cluster-secret-file); drain it from its host with "
                            "SIGUSR1, or SIGTERM when started with --drain")
                      : CheckPeer(ctx);
  return RunPeerCall<pb::DrainRequest, pb::DrainResponse>(
      svc_, "Peer.Drain", ctx, admitted, req, resp,
      [this](const pb::DrainRequest&, pb::DrainResponse* out) -> absl::Status {
        KVC_ASSIGN_OR_RETURN(uint64_t chunks, on_drain_());
        out->set_chunks(chunks);
        return absl::OkStatus();
      });
}

}  // namespace kvc::cachesvc
