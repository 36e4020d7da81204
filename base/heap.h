// Keeping chunk-sized buffers in the heap of a process that moves chunks.
//
// A chunk is ~228 KB for the reference model, and every one a program sends or receives
// passes through buffers of that size or more (gRPC's receive slices, a parsed message, a
// Redis reply). glibc gives each allocation over 128 KiB its own mmap and hands a freed
// heap top back to the kernel, so by default each such buffer is fresh memory faulted in
// page by page. On a VM a page fault costs ~10 µs: that was 3-4x a Store's whole time in
// kvcached, and 5x a fetch's with 8 client threads (docs/benchmarks.md). With large
// buffers from the heap and the heap's free memory kept, they are reused warm.
#pragma once

#include <malloc.h>

#include <cstddef>
#include <cstdlib>
#include <string_view>

namespace kvc {

struct HeapKeep {
  int mmap_threshold;   // allocations up to this come from the heap
  int trim_threshold;   // up to this much free heap top stays in the process
  const char* opt_out;  // the environment variable that, set to 0, leaves glibc's defaults
};
// A daemon: bounded by the largest burst of messages in flight.
inline constexpr HeapKeep kDaemonHeap{64 << 20, 1 << 30, "KVCACHED_TUNE_MALLOC"};
// A client program: gRPC reads up to 4 MiB at a time, and a few calls are in flight.
inline constexpr HeapKeep kClientHeap{64 << 20, 256 << 20, "KVCACHE_TUNE_MALLOC"};

// Sets the thresholds at a program's start, unless the environment already chose them
// (glibc's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_) or says not to (the opt-out
// variable set to 0; KVCACHE_TUNE_MALLOC also for the Python client). True when set.
inline bool KeepLargeBuffersInHeap(HeapKeep keep) {
  if (const char* tune = std::getenv(keep.opt_out);
      tune != nullptr && std::string_view(tune) == "0")
    return false;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr)
    return false;
  return mallopt(M_MMAP_THRESHOLD, keep.mmap_threshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, keep.trim_threshold) == 1;
}

}  // namespace kvc
