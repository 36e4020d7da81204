// Store: read one message, store it, read the next. A message is handled on the gRPC thread
// that read it unless storing it would wait on I/O (a batch of durable chunks to write, RAM
// room to make by writing a chunk to SSD): that one goes to the executor (storage::PutOptions::
// may_block).
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
#include <grpcpp/support/proto_buffer_writer.h>

#include <functional>
#include <memory>
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
      OnExecutor([this] { Done(wire::ToGrpc(Flush())); });
      return;
    }
    // Parsed and stored right here when nothing waits on I/O (a chunk going to RAM, a
    // durable chunk joining its batch): a hand-off to the executor and back for every
    // message cost more server CPU than the store itself (docs/benchmarks.md). What must
    // wait — a batch's durable write, RAM room made by writing a chunk to SSD — is
    // repeated on the executor.
    Handle(/*may_block=*/false);
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
  // Runs fn on the executor (this reactor handed over as to gRPC: its state has no lock).
  void OnExecutor(std::function<void()> fn) {
    HandOffToGrpc(this);
    if (!svc_->executor.Submit([this, fn = std::move(fn)] {
          TookBackFromGrpc(this);
          fn();
        })) {
      TookBackFromGrpc(this);
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  // The message in raw_: parsed (once), stored or staged, then the next one read. With
  // may_block false, on a gRPC thread: what would wait on I/O goes to the executor.
  void Handle(bool may_block) {
    absl::Status s = parsed_ ? absl::OkStatus() : Parse();
    parsed_ = s.ok();
    const uint64_t bytes = frame_.payload_bytes;
    if (s.ok()) s = StoreOne(may_block);
    if (!may_block && storage::IsWouldBlock(s)) {  // nothing stored: again, where it may wait
      OnExecutor([this] { Handle(/*may_block=*/true); });
      return;
    }
    parsed_ = false;
    raw_.Clear();
    if (!s.ok()) {
      // Failing stores the staged chunks before it (I/O): on the executor.
      if (!may_block && !staged_.empty()) {
        OnExecutor([this, s] { Fail(s); });
      } else {
        Fail(s);
      }
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/true, bytes);
    ++index_;
    HandOffToGrpc(this);
    StartRead(&raw_);
  }
  // Ends the call with this message's error; the staged ones before it are stored first.
  void Fail(const absl::Status& s) {
    if (failed_at_ < 0) {
      failed_at_ = index_;
      (void)Flush();
    }
    Done(wire::ToGrpc(
        absl::Status(s.code(), absl::StrCat("message ", failed_at_, ": ", s.message()))));
  }

  // The message's fields but the payload parsed by protobuf; the payload left where gRPC
  // received it (wire::SplitStoreRequest), so its bytes are copied once, into the store.
  absl::Status Parse() {
    received_ = std::make_unique<std::vector<grpc::Slice>>();
    if (!raw_.Dump(received_.get()).ok()) {
      return absl::InvalidArgumentError("not a StoreRequest (its bytes cannot be read)");
    }
    std::vector<std::span<const uint8_t>> pieces;
    pieces.reserve(received_->size());
    for (const grpc::Slice& slice : *received_) pieces.emplace_back(slice.begin(), slice.size());
    KVC_RETURN_IF_ERROR(wire::SplitStoreRequest(pieces, &frame_));
    if (!req_.ParseFromString(frame_.rest)) {
      return absl::InvalidArgumentError("not a StoreRequest (the bytes do not parse)");
    }
    if (!pb::Durability_IsValid(req_.durability())) {
      return absl::InvalidArgumentError(
          absl::StrCat("durability is ", req_.durability(), "; it must be ", pb::DURABILITY_MEMORY,
                       " (memory) or ", pb::DURABILITY_DURABLE, " (durable)"));
    }
    return absl::OkStatus();
  }

  absl::Status StoreOne(bool may_block) {
    KVC_RETURN_IF_ERROR(svc_->TakingStores());
    KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, svc_->Namespace(req_.namespace_id(), tenant_));
    if (frame_.payload_bytes != ns.chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk payload is ", frame_.payload_bytes,
                                                     " bytes, namespace ", ns.id, " expects ",
                                                     ns.chunk_bytes));
    }
    if (ns.key_mode == kKeysFromCaller) return StoreByCallerKey(ns, may_block);
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
    return Put(ns, key, parent, client_parent, may_block);
  }

  // A caller-keyed namespace: the key is the caller's (already mapped to 16 bytes by
  // CallerChunkKey, client-side); no tokens. A parent is optional and only orders
  // eviction: the caller's chain is its own, and a parent this node lacks is no error.
  absl::Status StoreByCallerKey(const NamespaceInfo& ns, bool may_block) {
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
    return Put(ns, key, parent, client_parent, may_block);
  }

  // Stores under the namespace-bound key; the client's key and parent go along as the
  // chunk's origin (what a cluster node places and repairs it by: docs/cluster.md).
  // Without may_block, what would wait on I/O returns WouldBlockError before changing
  // anything, so that Handle can repeat the message on the executor.
  absl::Status Put(const NamespaceInfo& ns, const ChunkKey& key,
                   std::optional<ChunkKey> stored_parent, std::optional<ChunkKey> client_parent,
                   bool may_block) {
    const int64_t ttl_s = static_cast<int64_t>(req_.ttl_seconds());
    const ChunkKey stored = StorageKey(ns, key);
    if (req_.durability() == pb::DURABILITY_DURABLE) {
      if (!may_block && staged_.size() + 1 >= svc_->opt.durable_store_batch)
        return storage::WouldBlockError("a full batch of durable chunks");
      staged_keys_.insert(stored);
      staged_.push_back({index_, ns.id, key, stored, stored_parent, client_parent, ttl_s,
                         std::move(received_), std::move(frame_.payload)});
      return staged_.size() >= svc_->opt.durable_store_batch ? Flush() : absl::OkStatus();
    }
    if (!may_block && !staged_.empty())
      return storage::WouldBlockError("storing the staged durable chunks");
    KVC_RETURN_IF_ERROR(Flush());  // the stream's order: durable chunks before this one
    KVC_ASSIGN_OR_RETURN(
        storage::PutResult put,
        svc_->store->Put({ns.id, stored, stored_parent, storage::Payload(frame_.payload),
                          ChunkOrigin{key, client_parent}},
                         {storage::Durability::kMemory, ttl_s, may_block}));
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
      puts.emplace_back(c.ns, c.stored, c.stored_parent, storage::Payload(c.payload),
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

  // A durable chunk waiting for its batch, holding its message's buffers.
  struct Staged {
    uint32_t index;  // its message in the stream
    storage::NamespaceId ns;
    ChunkKey key;  // the client's
    ChunkKey stored;
    std::optional<ChunkKey> stored_parent, client_parent;
    int64_t ttl_s;
    std::unique_ptr<std::vector<grpc::Slice>> received;  // (a Slice may hold bytes inline:
    std::vector<std::span<const uint8_t>> payload;       //  it must not move while viewed)
  };

  KvCacheService::Impl* svc_;
  TenantLimiter::Slot slot_;
  const std::string tenant_;
  grpc::ByteBuffer* response_;
  pb::StoreResponse resp_;
  grpc::ByteBuffer raw_;
  pb::StoreRequest req_;                                // every field but the payload
  std::unique_ptr<std::vector<grpc::Slice>> received_;  // raw_'s buffers, the payload's home
  wire::StoreFrame frame_;
  bool parsed_ = false;  // req_ holds raw_'s message (kept while it goes to the executor)
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
