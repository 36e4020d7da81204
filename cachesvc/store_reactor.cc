// Store: read one message, store it, read the next. A message is handled on the gRPC thread
// that read it unless storing it would wait on I/O (RAM room to make by writing a chunk to
// SSD, durable chunks to write before it): that one goes to the executor
// (storage::PutOptions::may_block).
//
// Store is a raw method: each message arrives as bytes and is parsed here, so a message
// that is not a StoreRequest fails the call with INVALID_ARGUMENT naming it (a typed
// reactor would see it as the end of the stream and answer OK with what came before).
// The messages before a bad one stay stored; the bad one and those after it change
// nothing.
//
// Durable chunks are staged and stored durable_store_batch at a time (8; ServiceOptions): one
// PutBatch, whose writes go out together and share one group commit — one fdatasync — instead
// of one sync per message. A full batch is written on the executor while the stream goes on:
// the next batch's messages are read and staged, and its own PutBatch starts, while the
// previous one's sync runs (up to durable_store_in_flight batches at once, 2). The group
// commit (storage/group_commit.h) still acknowledges each chunk only after a sync that began
// once its write completed, and the stream's answer comes only after every durable chunk is.
// Everything in flight is written before a memory-durability message is stored (the stream's
// order), before a bad message is answered, and at the stream's end.
#include <grpcpp/support/proto_buffer_writer.h>

#include <functional>
#include <memory>
#include <unordered_set>
#include <utility>

#include "base/mutex.h"
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
      if (staged_.empty() && !Writing()) {
        Done(wire::ToGrpc(WrittenStatus()));
        return;
      }
      AfterWrites([this] { Done(wire::ToGrpc(Flush())); });
      return;
    }
    // Parsed and stored right here when nothing waits on I/O (a chunk going to RAM, a
    // durable chunk joining its batch): a hand-off to the executor and back for every
    // message cost more server CPU than the store itself (docs/benchmarks.md). What must
    // wait — RAM room made by writing a chunk to SSD, durable chunks still being written
    // before a memory one — is repeated on the executor.
    Handle(/*may_block=*/false);
  }
  void OnDone() override {
    TookBackFromGrpc(this);
    delete this;
  }

 private:
  // A batch of durable chunks written in the background, holding its messages' buffers.
  struct Staged;
  using Batch = std::vector<Staged>;

  void Done(const grpc::Status& s) {
    slot_.Release();
    svc_->Observe("Store", tenant_, s, start_);
    grpc::Status status = s;
    if (s.ok()) {
      bool own_buffer = false;
      MutexLock lk(mu_);  // (no batch is being written any more)
      status = grpc::GenericSerialize<grpc::ProtoBufferWriter, pb::StoreResponse>(resp_, response_,
                                                                                  &own_buffer);
    }
    HandOffToGrpc(this);
    Finish(status);
  }
  // Runs fn on the executor (this reactor handed over as to gRPC: its state has no lock).
  void OnExecutor(std::function<void()> fn) {
    HandOffToGrpc(this);
    if (!svc_->executor.Submit(tenant_, [this, fn = std::move(fn)] {
          TookBackFromGrpc(this);
          fn();
        })) {
      TookBackFromGrpc(this);
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  // Runs fn on the executor once no batch of this stream is being written: at once (through
  // the queue) when none is, else on the thread that finishes the last one. The reactor is
  // parked meanwhile (no read outstanding), so fn owns its state.
  void AfterWrites(std::function<void()> fn) { WhenWriting(0, std::move(fn), /*queue=*/true); }
  // Runs fn once at most `at_most` batches are being written: right here when that holds
  // now (queue false) or through the executor (queue true), else on the thread that
  // finishes the batch that makes it hold.
  void WhenWriting(size_t at_most, std::function<void()> fn, bool queue) {
    {
      MutexLock lk(mu_);
      if (writing_ > at_most) {
        parked_ = std::move(fn);
        parked_at_most_ = at_most;
        return;
      }
    }
    if (queue) {
      OnExecutor(std::move(fn));
    } else {
      fn();
    }
  }
  bool Writing() {
    MutexLock lk(mu_);
    return writing_ > 0;
  }
  // The first failure among the batches written in the background (OK if none).
  absl::Status WrittenStatus() {
    MutexLock lk(mu_);
    return written_;
  }

  // The message in raw_: parsed (once), stored or staged, then the next one read. With
  // may_block false, on a gRPC thread: what would wait on I/O goes to the executor.
  void Handle(bool may_block) {
    absl::Status s = parsed_ ? absl::OkStatus() : Parse();
    parsed_ = s.ok();
    const uint64_t bytes = frame_.payload_bytes;
    if (s.ok()) s = WrittenStatus();  // a batch written meanwhile failed: the call ends
    if (s.ok()) s = StoreOne(may_block);
    if (!may_block && storage::IsWouldBlock(s)) {  // nothing stored: again, where it may wait
      AfterWrites([this] { Handle(/*may_block=*/true); });
      return;
    }
    parsed_ = false;
    raw_.Clear();
    if (!s.ok()) {
      // Failing stores the staged chunks before it (I/O): on the executor, after the
      // batches being written.
      if (may_block && !Writing()) {
        Fail(s);
      } else {
        AfterWrites([this, s] { Fail(s); });
      }
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/true, bytes);
    ++index_;
    if (staged_.size() < svc_->opt.durable_store_batch) {
      ReadNext();
      return;
    }
    // A full batch: written in the background while the next messages are read, once
    // fewer than durable_store_in_flight batches are being written.
    WhenWriting(
        svc_->opt.durable_store_in_flight - 1,
        [this] {
          WriteInBackground();
          ReadNext();
        },
        /*queue=*/false);
  }
  void ReadNext() {
    HandOffToGrpc(this);
    StartRead(&raw_);
  }
  // Ends the call with this message's error (or the failure of a batch written before it);
  // the staged chunks before it are stored first. No batch is being written.
  void Fail(const absl::Status& s) {
    const uint32_t at = index_;
    if (absl::Status flushed = Flush(); !flushed.ok()) {
      Done(wire::ToGrpc(flushed));
      return;
    }
    Done(wire::ToGrpc(absl::Status(s.code(), absl::StrCat("message ", at, ": ", s.message()))));
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
      const bool parent_here = Holds(ns.store_id, stored_parent);
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
      if (Holds(ns.store_id, stored_parent)) parent = stored_parent;
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
    if (Tombstones* t = svc_->opt.tombstones; t != nullptr && t->Deleted(ns.store_id, stored)) {
      if (req_.repair_copy()) {
        // A client's read-repair copy of a chunk deleted here: not brought back.
        MutexLock lk(mu_);
        resp_.set_deleted(resp_.deleted() + 1);
        resp_.add_chunk_keys(KeyBytes(key));
        return absl::OkStatus();
      }
      // The tenant stores the key anew, a newer decision than its delete (a synced write).
      if (!may_block) return storage::WouldBlockError("forgetting the chunk's tombstone");
      KVC_RETURN_IF_ERROR(t->Clear(ns.store_id, stored));
    }
    if (req_.durability() == pb::DURABILITY_DURABLE) {
      staged_keys_.insert(stored);
      staged_.push_back({index_, ns.store_id, key, stored, stored_parent, client_parent, ttl_s,
                         std::move(received_), std::move(frame_.payload)});
      MutexLock lk(mu_);
      resp_.add_chunk_keys(KeyBytes(key));  // in the stream's order, whichever batch ends first
      return absl::OkStatus();
    }
    if (!may_block && (!staged_.empty() || Writing()))
      return storage::WouldBlockError("storing the stream's durable chunks");
    KVC_RETURN_IF_ERROR(Flush());  // the stream's order: durable chunks before this one
    KVC_ASSIGN_OR_RETURN(
        storage::PutResult put,
        svc_->store->Put({ns.store_id, stored, stored_parent, storage::Payload(frame_.payload),
                          ChunkOrigin{key, client_parent}},
                         {storage::Durability::kMemory, ttl_s, may_block}));
    MutexLock lk(mu_);
    Count(put);
    resp_.add_chunk_keys(KeyBytes(key));
    return absl::OkStatus();
  }

  void Count(const storage::PutResult& put) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (put.already_present) {
      resp_.set_already_present(resp_.already_present() + 1);
    } else {
      resp_.set_stored(resp_.stored() + 1);
    }
  }

  // Whether the chunk is stored here or staged (or being written) in this stream.
  bool Holds(storage::NamespaceId ns, const ChunkKey& stored) const {
    return staged_keys_.contains(stored) ||
           svc_->store->Contains(ns, stored) != storage::Tier::kNone;
  }

  // The staged durable chunks, written on the executor; the reactor goes on meanwhile.
  void WriteInBackground() {
    auto batch = std::make_shared<Batch>(std::move(staged_));
    staged_.clear();
    {
      MutexLock lk(mu_);
      ++writing_;
    }
    if (!svc_->executor.Submit(tenant_, [this, batch] {
          Write(*batch);
          WriteDone();
        })) {
      {
        MutexLock lk(mu_);
        if (written_.ok()) {
          written_ = absl::ResourceExhaustedError(
              absl::StrCat("message ", batch->front().index, ": server busy: work queue full"));
        }
      }
      WriteDone();
    }
  }
  // A background write ended: the parked continuation runs here if it may now.
  void WriteDone() {
    std::function<void()> next;
    {
      MutexLock lk(mu_);
      --writing_;
      if (parked_ && writing_ <= parked_at_most_) next = std::exchange(parked_, nullptr);
    }
    if (next) next();
  }
  // Writes the staged durable chunks now; with no batch being written, the call's first
  // failure (this batch's or an earlier one's).
  absl::Status Flush() {
    if (!staged_.empty()) {
      Batch batch;
      batch.swap(staged_);
      Write(batch);
    }
    return WrittenStatus();
  }
  // Stores a batch (Impl::PutDurable: one group commit per run of equal TTL). The first
  // failure in the stream fails the call, naming its message; the chunks of its batch are
  // attempted all the same.
  void Write(const Batch& batch) {
    // After a failure the call ends there: chunks staged after it are not stored (a batch
    // already being written beside the failed one may still be).
    if (!WrittenStatus().ok()) return;
    std::vector<storage::PutRequest> puts;
    std::vector<int64_t> ttls;
    puts.reserve(batch.size());
    ttls.reserve(batch.size());
    for (const Staged& c : batch) {
      puts.emplace_back(c.ns, c.stored, c.stored_parent, storage::Payload(c.payload),
                        ChunkOrigin{c.key, c.client_parent});
      ttls.push_back(c.ttl_s);
    }
    const std::vector<absl::StatusOr<storage::PutResult>> results = svc_->PutDurable(puts, ttls);
    MutexLock lk(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (results[i].ok()) {
        Count(*results[i]);
      } else if (written_.ok()) {
        const absl::Status& e = results[i].status();
        written_ =
            absl::Status(e.code(), absl::StrCat("message ", batch[i].index, ": ", e.message()));
      }
    }
  }

  // A durable chunk waiting for its batch, holding its message's buffers.
  struct Staged {
    uint32_t index;  // its message in the stream
    storage::NamespaceId ns;  // its store_id
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
  grpc::ByteBuffer raw_;
  pb::StoreRequest req_;                                // every field but the payload
  std::unique_ptr<std::vector<grpc::Slice>> received_;  // raw_'s buffers, the payload's home
  wire::StoreFrame frame_;
  bool parsed_ = false;  // req_ holds raw_'s message (kept while it goes to the executor)
  uint32_t index_ = 0;
  Batch staged_;
  std::unordered_set<ChunkKey, ChunkKeyHash> staged_keys_;  // every durable chunk staged
  // Shared with the batches being written in the background.
  Mutex mu_;
  pb::StoreResponse resp_ ABSL_GUARDED_BY(mu_);
  absl::Status written_ ABSL_GUARDED_BY(mu_);  // the first failure of a durable chunk
  size_t writing_ ABSL_GUARDED_BY(mu_) = 0;    // batches being written
  // What runs once at most parked_at_most_ batches are being written (the reactor waits).
  std::function<void()> parked_ ABSL_GUARDED_BY(mu_);
  size_t parked_at_most_ ABSL_GUARDED_BY(mu_) = 0;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* StartStore(KvCacheService::Impl* svc,
                                                      TenantLimiter::Slot slot,
                                                      grpc::ByteBuffer* response) {
  return new StoreReactor(svc, std::move(slot), response);
}

}  // namespace kvc::cachesvc
