// Store: read one message, handle it on the executor, read the next.
//
// Store is a raw method: each message arrives as bytes and is parsed here, so a message
// that is not a StoreRequest fails the call with INVALID_ARGUMENT naming it (a typed
// reactor would see it as the end of the stream and answer OK with what came before).
// The messages before a bad one stay stored; the bad one and those after it change
// nothing.
//
// Durable chunks are staged and stored durable_store_batch at a time (8; ServiceOptions) (one
// PutBatch: their writes go out together and share one group commit — one fdatasync — instead of
// one sync per message); the stream's answer still comes only after every staged chunk is durable.
// A staged batch is stored before a memory-durability message, before a bad message is answered,
// and at the stream's end.
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <unordered_set>

#include "base/status_macros.h"
#include "cachesvc/service_impl.h"
#include "cachesvc/tsan_handoff.h"

namespace kvc::cachesvc {
namespace {

class StoreReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  StoreReactor(KvCacheService::Impl* svc, TenantLimiter::Slot slot, grpc::ByteBuffer* response)
      : svc_(svc), slot_(std::move(slot)), tenant_(slot_.tenant()), response_(response) {
    HandOffToGrpc(this);
    StartRead(&raw_);
  }
  void OnReadDone(bool ok) override {
    TookBackFromGrpc(this);
    if (!ok) {  // the client finished sending (or went away): answer with what was stored
      if (staged_.empty()) {
        Done(grpc::Status::OK);
        return;
      }
      HandOffToGrpc(this);
      if (!svc_->executor.Submit([this] {
            TookBackFromGrpc(this);
            Done(wire::ToGrpc(Flush()));
          })) {
        Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
      }
      return;
    }
    HandOffToGrpc(this);
    if (!svc_->executor.Submit([this] { Handle(); })) {
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  void OnDone() override {
    TookBackFromGrpc(this);
    delete this;
  }

 private:
  void Done(const grpc::Status& s) {
    slot_.Release();
    svc_->Observe("Store", tenant_, s, start_);
    if (s.ok()) {
      bool own_buffer = false;
      grpc::Status serialized = grpc::GenericSerialize<grpc::ProtoBufferWriter, pb::StoreResponse>(
          resp_, response_, &own_buffer);
      if (!serialized.ok()) {
        HandOffToGrpc(this);
        Finish(serialized);
        return;
      }
    }
    HandOffToGrpc(this);
    Finish(s);
  }
  void Handle() {
    TookBackFromGrpc(this);
    absl::Status s = Parse();
    const size_t bytes = req_.payload().size();  // (a staged payload is moved out)
    if (s.ok()) s = StoreOne();
    raw_.Clear();
    if (!s.ok()) {
      if (failed_at_ < 0) {  // this message is the bad one: the staged ones before it stay
        failed_at_ = index_;
        (void)Flush();
      }
      Done(wire::ToGrpc(
          absl::Status(s.code(), absl::StrCat("message ", failed_at_, ": ", s.message()))));
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/true, bytes);
    ++index_;
    HandOffToGrpc(this);
    StartRead(&raw_);
  }

  absl::Status Parse() {
    grpc::ProtoBufferReader reader(&raw_);
    if (!req_.ParseFromZeroCopyStream(&reader)) {
      return absl::InvalidArgumentError("not a StoreRequest (the bytes do not parse)");
    }
    if (!pb::Durability_IsValid(req_.durability())) {
      return absl::InvalidArgumentError(
          absl::StrCat("durability is ", req_.durability(), "; it must be ", pb::DURABILITY_MEMORY,
                       " (memory) or ", pb::DURABILITY_DURABLE, " (durable)"));
    }
    return absl::OkStatus();
  }

  absl::Status StoreOne() {
    KVC_RETURN_IF_ERROR(svc_->TakingStores());
    KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, svc_->Namespace(req_.namespace_id(), tenant_));
    if (req_.payload().size() != ns.chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk payload is ", req_.payload().size(),
                                                     " bytes, namespace ", ns.id, " expects ",
                                                     ns.chunk_bytes));
    }
    if (ns.key_mode == kKeysFromCaller) return StoreByCallerKey(ns);
    if (!req_.chunk_key().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk_key is given, but namespace ", ns.id,
          " derives its keys from tokens (register it with key_mode CALLER to choose keys)"));
    }
    if (static_cast<uint32_t>(req_.tokens_size()) != ns.chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("chunk has ", req_.tokens_size(),
                                                     " tokens; namespace ", ns.id, " uses ",
                                                     ns.chunk_tokens));
    }
    KVC_RETURN_IF_ERROR(svc_->CheckTokens(ns, req_.tokens()));
    std::optional<ChunkKey> parent, client_parent;
    ChunkKey chain = ns.root;
    if (!req_.parent_key().empty()) {
      if (req_.parent_key().size() != 16) {
        return absl::InvalidArgumentError(
            absl::StrCat("parent_key is ", req_.parent_key().size(), " bytes; keys are 16"));
      }
      std::memcpy(chain.bytes.data(), req_.parent_key().data(), 16);
      client_parent = chain;
      const ChunkKey stored_parent = StorageKey(ns, chain);
      const bool parent_here = Holds(ns.id, stored_parent);
      // A chunk is only reachable through its prefix: refuse orphans (and keys chained
      // from another namespace's chunks). In a cluster the parent is usually on another
      // node (placement is per chunk); the chunk is then a root of this node's eviction.
      // A parent claimed from another tenant's chain is harmless there: the key is bound
      // to this namespace before storage sees it, so it can neither meet nor reveal the
      // other tenant's chunk.
      if (!parent_here && !svc_->opt.cluster) {
        return absl::FailedPreconditionError(
            absl::StrCat("parent chunk ", chain.Hex(), " is not cached in namespace ", ns.id));
      }
      if (parent_here) parent = stored_parent;
    }
    const ChunkKey key =
        client::NextChunkKey(chain, std::span(req_.tokens().data(), req_.tokens().size()));
    return Put(ns, key, parent, client_parent);
  }

  // A caller-keyed namespace: the key is the caller's (already mapped to 16 bytes by
  // CallerChunkKey, client-side); no tokens. A parent is optional and only orders
  // eviction: the caller's chain is its own, and a parent this node lacks is no error.
  absl::Status StoreByCallerKey(const NamespaceInfo& ns) {
    if (req_.tokens_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace ", ns.id, " is caller-keyed: a chunk gives chunk_key, not tokens"));
    }
    if (req_.chunk_key().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace ", ns.id, " is caller-keyed: each chunk gives its 16-byte chunk_key"));
    }
    std::optional<ChunkKey> parent, client_parent;
    if (!req_.parent_key().empty()) {
      KVC_ASSIGN_OR_RETURN(ChunkKey given, wire::KeyFrom(req_.parent_key(), "parent_key"));
      client_parent = given;
      const ChunkKey stored_parent = StorageKey(ns, given);
      if (Holds(ns.id, stored_parent)) parent = stored_parent;
    }
    KVC_ASSIGN_OR_RETURN(ChunkKey key, wire::KeyFrom(req_.chunk_key(), "chunk_key"));
    return Put(ns, key, parent, client_parent);
  }

  // Stores under the namespace-bound key; the client's key and parent go along as the
  // chunk's origin (what a cluster node places and repairs it by: docs/cluster.md).
  absl::Status Put(const NamespaceInfo& ns, const ChunkKey& key,
                   std::optional<ChunkKey> stored_parent, std::optional<ChunkKey> client_parent) {
    const int64_t ttl_s = static_cast<int64_t>(req_.ttl_seconds());
    const ChunkKey stored = StorageKey(ns, key);
    if (req_.durability() == pb::DURABILITY_DURABLE) {
      staged_keys_.insert(stored);
      staged_.push_back({index_, ns.id, key, stored, stored_parent, client_parent, ttl_s,
                         std::move(*req_.mutable_payload())});
      return staged_.size() >= svc_->opt.durable_store_batch ? Flush() : absl::OkStatus();
    }
    KVC_RETURN_IF_ERROR(Flush());  // the stream's order: durable chunks before this one
    KVC_ASSIGN_OR_RETURN(
        storage::PutResult put,
        svc_->store->Put({ns.id, stored, stored_parent,
                          std::span(reinterpret_cast<const uint8_t*>(req_.payload().data()),
                                    req_.payload().size()),
                          ChunkOrigin{key, client_parent}},
                         {storage::Durability::kMemory, ttl_s}));
    Count(put, key);
    return absl::OkStatus();
  }

  void Count(const storage::PutResult& put, const ChunkKey& key) {
    if (put.already_present) {
      resp_.set_already_present(resp_.already_present() + 1);
    } else {
      resp_.set_stored(resp_.stored() + 1);
    }
    resp_.add_chunk_keys(KeyBytes(key));
  }

  // Whether the chunk is stored here or staged in this stream.
  bool Holds(storage::NamespaceId ns, const ChunkKey& stored) const {
    return staged_keys_.contains(stored) ||
           svc_->store->Contains(ns, stored) != storage::Tier::kNone;
  }

  // Stores the staged durable chunks (Impl::PutDurable: one group commit per run of equal
  // TTL). The first failure fails the call, naming its message (failed_at_); the chunks
  // staged with it are attempted all the same.
  absl::Status Flush() {
    std::vector<Staged> staged;
    staged.swap(staged_);
    staged_keys_.clear();
    std::vector<storage::PutRequest> puts;
    std::vector<int64_t> ttls;
    for (const Staged& c : staged) {
      puts.emplace_back(
          c.ns, c.stored, c.stored_parent,
          std::span(reinterpret_cast<const uint8_t*>(c.payload.data()), c.payload.size()),
          ChunkOrigin{c.key, c.client_parent});
      ttls.push_back(c.ttl_s);
    }
    const std::vector<absl::StatusOr<storage::PutResult>> results = svc_->PutDurable(puts, ttls);
    absl::Status first;
    for (size_t i = 0; i < staged.size(); ++i) {
      if (results[i].ok()) {
        Count(*results[i], staged[i].key);
      } else if (first.ok()) {
        first = results[i].status();
        if (failed_at_ < 0) failed_at_ = staged[i].index;
      }
    }
    return first;
  }

  // A durable chunk waiting for its batch (its payload moved out of the request).
  struct Staged {
    uint32_t index;  // its message in the stream
    storage::NamespaceId ns;
    ChunkKey key;  // the client's
    ChunkKey stored;
    std::optional<ChunkKey> stored_parent, client_parent;
    int64_t ttl_s;
    std::string payload;
  };

  KvCacheService::Impl* svc_;
  TenantLimiter::Slot slot_;
  const std::string tenant_;
  grpc::ByteBuffer* response_;
  pb::StoreResponse resp_;
  grpc::ByteBuffer raw_;
  pb::StoreRequest req_;
  uint32_t index_ = 0;
  int64_t failed_at_ = -1;  // the message a failure is reported against
  std::vector<Staged> staged_;
  std::unordered_set<ChunkKey, ChunkKeyHash> staged_keys_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* StartStore(KvCacheService::Impl* svc,
                                                      TenantLimiter::Slot slot,
                                                      grpc::ByteBuffer* response) {
  return new StoreReactor(svc, std::move(slot), response);
}

}  // namespace kvc::cachesvc
