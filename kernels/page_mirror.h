// PageMirror: device copies of sequences' pages for the engine's CUDA indexer and
// attention backends, so each call uploads only the pages whose bytes changed since the
// last one (a decode step writes at most one page per Full layer) instead of every page.
//
// Per sequence one contiguous device buffer in the chunk layout — what the kernels read —
// with each page's version as last uploaded; the model gives every page write a version
// unique across all sequences (engine/model/attention_backend.h), so equal versions mean
// equal bytes. Buffers grow by doubling (the old contents copied device-to-device); past
// `budget_bytes` the least recently used other sequences are dropped (ended sequences go
// that way too). Thread-safe; uploads are queued on the caller's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"

namespace kvc::cuda {

class PageMirror {
 public:
  explicit PageMirror(size_t budget_bytes) : budget_(budget_bytes) {}
  ~PageMirror();
  PageMirror(const PageMirror&) = delete;
  PageMirror& operator=(const PageMirror&) = delete;

  // Pages [0, count) of `sequence` on the device, current once `stream` has run the
  // uploads this call queued. The view holds the mirror (no buffer moves or goes away)
  // until it is dropped: keep it until the work reading the pages is done.
  struct View {
    uint8_t* device = nullptr;     // written only by WriteEntries-like callers (Written)
    std::unique_lock<Mutex> hold;  // the mirror's mu_
  };
  // (The lock leaves with the view, which the lock analysis cannot follow: unchecked.)
  View Pages(uint64_t sequence, std::span<const std::vector<uint8_t>> pages,
             std::span<const uint64_t> versions, int64_t count, size_t page_bytes,
             cudaStream_t stream) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The caller, holding `view` of `sequence`, has queued writes into pages [first,
  // first + versions.size()) on `stream` (a backend making compressed entries on the
  // device, the host's bytes landing later): the device copies are current under the
  // versions the host gave the pages for those writes (no upload for them), and every
  // later Pages() call's stream waits for the writes before it reads, grows or uploads.
  // The host's bytes of a page it writes must be current except for what the device wrote
  // (a page not current here was uploaded by Pages() before the writes).
  // Until the function it returns is called — once the host's pages hold the written
  // bytes — the sequence is never evicted: dropped, its pages would come back from the
  // host's stale copies. The function takes no lock (it may run under a backend's).
  [[nodiscard]] std::function<void()> Written(const View& view, uint64_t sequence, int64_t first,
                                              std::span<const uint64_t> versions,
                                              cudaStream_t stream)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;  // (the lock is the view's: checked at run time)

  struct Stats {
    int64_t uploaded_pages = 0, reused_pages = 0, sequences = 0;
    int64_t awaiting_host = 0;  // sequences with device writes the host's pages lack
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    uint8_t* device = nullptr;
    int64_t capacity = 0;  // pages
    size_t page_bytes = 0;
    std::vector<uint64_t> versions;  // as uploaded; 0 = never
    uint64_t last_use = 0;
    cudaEvent_t written = nullptr;  // after the last writes on the device (Written)
    // Device writes so far, and how many of them the host has (set by Written's function).
    uint64_t writes = 0;
    std::shared_ptr<std::atomic<uint64_t>> landed = std::make_shared<std::atomic<uint64_t>>(0);
  };
  static void Release(Entry& e);  // its device memory and event
  void EvictFor(uint64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t budget_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> seqs_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

// A mirror shared by the backends of one model (0: a quarter of the device's memory).
std::shared_ptr<PageMirror> MakePageMirror(size_t budget_bytes = 0);

}  // namespace kvc::cuda
