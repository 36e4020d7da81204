// Fetch: one chunk read (on the executor when it is not in RAM), then written, then the
// next.
#include "cachesvc/service_impl.h"

namespace kvc::cachesvc {

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

namespace {

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
      svc_->CountFetch(slot_.tenant(), 1, 0, 0);
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
    svc_->CountFetch(slot_.tenant(), 0, s.ok() ? 1 : 0, absl::IsNotFound(s) ? 1 : 0);
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

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(KvCacheService::Impl* svc,
                                                       TenantLimiter::Slot slot, NamespaceInfo ns,
                                                       std::vector<ChunkKey> keys) {
  return new FetchReactor(svc, std::move(slot), std::move(ns), std::move(keys));
}

}  // namespace kvc::cachesvc
