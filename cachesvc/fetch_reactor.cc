// Fetch: each chunk sent as soon as it is at hand — from the RAM arena without a copy, or
// read from SSD on the executor in batches of the chunks ahead (one submission, many reads
// in flight), then written one by one.
#include <new>

#include "absl/strings/str_replace.h"
#include "base/mutex.h"
#include "cachesvc/service_impl.h"
#include "cachesvc/tsan_handoff.h"
#include "wire/wire.h"

namespace kvc::cachesvc {

// Fetch is served as a raw method: each FetchResponse is framed by hand (the protobuf
// wire format of two bytes fields) as a small header slice plus a payload slice that
// points straight into the RAM arena and holds the chunk's lease until gRPC has sent it.
// That saves the two payload copies of the generated code (into the message, then into
// the serialized buffer); clients see ordinary FetchResponse messages.

namespace {

// The payload slice owns what keeps its bytes alive: a RAM lease, or a buffer an SSD read
// landed in (laid out as ChunkStore::ReadRoomFor says, so the slot is read straight into it
// and verified there: no staging copy), whose payload `bytes` points at.
struct PayloadOwner {
  storage::RamLease lease;
  storage::ReadBuffer buffer;
  uint8_t* bytes = nullptr;
};

void DestroyPayloadOwner(void* owner) { delete static_cast<PayloadOwner*>(owner); }

grpc::ByteBuffer FetchResponseFrame(const ChunkKey& key, std::span<const uint8_t> payload,
                                    PayloadOwner* owner) {
  const std::string header = wire::FetchResponseHeader(key, payload.size());
  grpc::Slice slices[2] = {grpc::Slice(header),
                           grpc::Slice(const_cast<uint8_t*>(payload.data()), payload.size(),
                                       DestroyPayloadOwner, owner)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

namespace {

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(KvCacheService::Impl* svc, TenantLimiter::Slot slot,
               KvCacheService::Impl::ScopedKeys keys)
      : svc_(svc),
        slot_(std::move(slot)),
        ns_(std::move(keys.ns)),
        keys_(std::move(keys.keys)),
        stored_(std::move(keys.stored)) {
    Next();
  }
  void OnWriteDone(bool ok) override {
    TookBackFromGrpc(this);
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading"));
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/false, ns_.chunk_bytes);
    ++next_;
    Next();
  }
  void OnDone() override {
    TookBackFromGrpc(this);
    {
      MutexLock lock(mu_);
      if (reading_) {  // a read ahead is still running: it deletes the reactor when done
        orphaned_ = true;
        return;
      }
    }
    delete this;
  }

 private:
  // Chunks read in one batch: keys_[from + i] is items[i] (its owner goes to gRPC when sent).
  struct Ahead {
    std::unique_ptr<PayloadOwner> owner;
    absl::Status status;
  };
  struct Batch {
    size_t from = 0;
    std::vector<Ahead> items;
    size_t end() const { return from + items.size(); }
  };

  void Done(const grpc::Status& s) {
    resp_.Clear();  // ends the lease of the last chunk now rather than with the reactor
    slot_.Release();
    svc_->Observe("Fetch", slot_.tenant(), s, start_);
    HandOffToGrpc(this);
    Finish(s);
  }
  // Sends chunk next_: from a batch read ahead, from the RAM arena, or after a batch read.
  // Called by one step at a time (a write's completion, or the read it waited for).
  void Next() {
    if (next_ == keys_.size()) {
      Done(grpc::Status::OK);
      return;
    }
    MutexLock lock(mu_);
    if (!(cur_.from <= next_ && next_ < cur_.end()) && ready_ && ready_->from == next_) {
      cur_ = *std::move(ready_);
      ready_.reset();
    }
    if (cur_.from <= next_ && next_ < cur_.end()) {
      StartReadAhead(cur_.end());  // the next batch, while this one is sent
      lock.unlock();
      SendAhead();
      return;
    }
    if (reading_) {  // the batch with this chunk is on its way: it continues the call
      waiting_ = true;
      return;
    }
    lock.unlock();
    // A chunk in RAM is sent from the arena right here (no I/O, nothing blocks): no hop
    // to the executor, which only SSD reads need.
    if (absl::StatusOr<storage::RamLease> lease =
            svc_->store->LeaseRam(ns_.store_id, stored_[next_]);
        lease.ok()) {
      svc_->CountFetch(slot_.tenant(), 1, 0, 0);
      const std::span<const uint8_t> bytes = lease->bytes();
      resp_ = FetchResponseFrame(keys_[next_], bytes, new PayloadOwner{*std::move(lease), {}});
      Write();
      return;
    }
    lock.lock();
    waiting_ = true;
    if (!StartReadAhead(next_)) {
      waiting_ = false;
      lock.unlock();
      Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server busy: work queue full"));
    }
  }
  // Reads the chunks from `from` on (up to kAheadBytes) on the executor, unless a read is
  // running or done already or nothing is left. False only if the executor refused.
  bool StartReadAhead(size_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || ready_ || from >= keys_.size()) return true;
    reading_ = true;
    mu_.unlock();
    const bool queued = svc_->executor.Submit(slot_.tenant(), [this, from] { ReadAhead(from); });
    mu_.lock();
    if (!queued) reading_ = false;
    return queued;
  }
  // On the executor: one batch read — the SSD serves many reads at once far faster than one
  // after another, and the batch after the one being sent is read while it is sent, so a
  // prefix resumed from SSD streams at the disk's batch speed.
  void ReadAhead(size_t from) {
    constexpr uint64_t kAheadBytes = 8 << 20;
    const size_t n = std::min<size_t>(
        keys_.size() - from,
        std::clamp<uint64_t>(kAheadBytes / std::max<uint64_t>(ns_.chunk_bytes, 1), 1, 32));
    const std::span<const ChunkKey> keys(stored_.data() + from, n);
    Batch batch;
    batch.from = from;
    std::vector<std::span<uint8_t>> outs;
    const storage::ChunkStore::ReadRoom room = svc_->store->ReadRoomFor(ns_.chunk_bytes);
    for (size_t i = 0; i < n; ++i) {
      auto owner = std::make_unique<PayloadOwner>();
      owner->buffer = storage::AllocateReadBuffer(room);
      if (!owner->buffer) throw std::bad_alloc();  // out of memory: as operator new fails
      owner->bytes = owner->buffer.get() + room.before;
      outs.emplace_back(owner->bytes, ns_.chunk_bytes);
      batch.items.push_back({std::move(owner), absl::OkStatus()});
    }
    std::vector<storage::Tier> tiers;
    std::vector<absl::Status> got =
        svc_->store->GetBatch(ns_.store_id, keys, outs, &tiers, /*outs_have_read_room=*/true);
    uint64_t ram = 0, ssd = 0;
    for (size_t i = 0; i < n; ++i) {
      batch.items[i].status = std::move(got[i]);
      if (batch.items[i].status.ok()) ++(tiers[i] == storage::Tier::kRam ? ram : ssd);
    }
    svc_->CountFetch(slot_.tenant(), ram, ssd, 0);
    MutexLock lock(mu_);
    reading_ = false;
    if (orphaned_) {  // the call ended while this read ran
      lock.unlock();
      delete this;
      return;
    }
    ready_ = std::move(batch);
    const bool resume = std::exchange(waiting_, false);
    lock.unlock();
    if (resume) Next();
  }
  // Sends chunk next_ from the batch being sent (or ends the call at a chunk that failed).
  void SendAhead() {
    Ahead& a = cur_.items[next_ - cur_.from];
    if (!a.status.ok()) {
      svc_->CountFetch(slot_.tenant(), 0, 0, absl::IsNotFound(a.status) ? 1 : 0);
      // The caller hears of its own key: the key storage holds the chunk under (bound to
      // the namespace) is internal, so it is replaced wherever storage's message names it.
      const std::string caller_key = keys_[next_].Hex();
      const std::string message =
          absl::StrReplaceAll(a.status.message(), {{stored_[next_].Hex(), caller_key}});
      Done(wire::ToGrpc(
          absl::Status(a.status.code(), absl::StrCat("chunk_keys[", next_, "]: ", message))));
      return;
    }
    const std::span<const uint8_t> payload(a.owner->bytes, ns_.chunk_bytes);
    resp_ = FetchResponseFrame(keys_[next_], payload, a.owner.release());
    Write();
  }
  // The last chunk goes out with the trailers in one step (no OnWriteDone round trip:
  // it matters for the many one-chunk fetches).
  void Write() {
    if (next_ + 1 < keys_.size()) {
      HandOffToGrpc(this);
      StartWrite(&resp_);
      return;
    }
    if (svc_->opt.metrics) svc_->opt.metrics->AddBytes(/*in=*/false, ns_.chunk_bytes);
    slot_.Release();
    svc_->Observe("Fetch", slot_.tenant(), grpc::Status::OK, start_);
    HandOffToGrpc(this);
    StartWriteAndFinish(&resp_, grpc::WriteOptions(), grpc::Status::OK);
  }

  KvCacheService::Impl* svc_;
  TenantLimiter::Slot slot_;
  NamespaceInfo ns_;
  std::vector<ChunkKey> keys_;    // as the caller gave them: the frames carry these
  std::vector<ChunkKey> stored_;  // as storage holds them (StorageKey)
  size_t next_ = 0;
  grpc::ByteBuffer resp_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  Mutex mu_;   // guards what a read ahead on the executor shares with the call
  Batch cur_;  // being sent (touched only by the step that owns the call)
  std::optional<Batch> ready_ ABSL_GUARDED_BY(mu_);  // read ahead, not yet being sent
  bool reading_ ABSL_GUARDED_BY(mu_) = false;        // a read ahead is running
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;        // the call waits for that read to continue it
  bool orphaned_ ABSL_GUARDED_BY(mu_) = false;       // the call ended during the read: it deletes
                                                     // the reactor
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(KvCacheService::Impl* svc,
                                                       TenantLimiter::Slot slot,
                                                       KvCacheService::Impl::ScopedKeys keys) {
  return new FetchReactor(svc, std::move(slot), std::move(keys));
}

}  // namespace kvc::cachesvc
