// The CUDA runtime calls on the CPU. Every allocation is recorded with its kind so copies
// can be checked against their direction and kernels against host pointers; device
// memory starts as 0xFF bytes (NaN floats, −1 integers), never as zeros, so code that
// reads memory it never wrote shows it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <string_view>
#include <vector>

#include "cudaemu/runtime.h"

struct CUstream_st {
  unsigned flags;
  bool eager = false;  // CUDAEMU_STREAMS=eager-even/odd: this stream's work runs when queued
};

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
  // Deferred streams: the stream it was last recorded on, and how many of that stream's
  // queued items must have run for it to be reached.
  cudaStream_t stream = nullptr;
  uint64_t mark = 0;
};

namespace cudaemu {
namespace {

constexpr size_t kDeviceBytes = size_t{16} << 30;  // what cudaMemGetInfo reports as total
// Device allocations of at least this size live in a memfd mapping, so another process can
// map them (CUDA IPC: the HBM tier's arena); smaller ones come from the heap, where
// AddressSanitizer knows their exact size.
constexpr size_t kShareableBytes = size_t{1} << 20;

enum class Origin { kHeap, kMemfd, kRegistered, kIpcMapping };

struct Range {
  size_t bytes;
  Memory kind;
  Origin origin;
  int fd = -1;  // kMemfd: kept open for cudaIpcGetMemHandle
};

// What cudaIpcGetMemHandle hands out: the owner's pid and the memfd's descriptor number,
// which another process of the same user opens through /proc.
struct IpcHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));
constexpr char kIpcMagic[8] = "cudaemu";

// CUDAEMU_STATS=1: at exit, what the process asked of the "device" — how many launches,
// waits (stream/device/event synchronizations; copies to the host that return only when
// done: every cudaMemcpy, and cudaMemcpyAsync into pageable memory) and copies
// each way: the host-device round trips a GPU would pay for, counted without one.
struct Stats {
  std::atomic<uint64_t> launches{0}, syncs{0}, h2d{0}, d2h{0}, h2d_bytes{0}, d2h_bytes{0};
  ~Stats() {
    if (std::getenv("CUDAEMU_STATS") == nullptr) return;
    std::fprintf(stderr,
                 "cudaemu stats: %llu launches, %llu waits for the device, %llu host-to-device "
                 "copies (%llu bytes), %llu device-to-host copies (%llu bytes)\n",
                 static_cast<unsigned long long>(launches.load()),
                 static_cast<unsigned long long>(syncs.load()),
                 static_cast<unsigned long long>(h2d.load()),
                 static_cast<unsigned long long>(h2d_bytes.load()),
                 static_cast<unsigned long long>(d2h.load()),
                 static_cast<unsigned long long>(d2h_bytes.load()));
  }
};
Stats g_stats;
// Whether this host thread queued device work since it last waited: a wait counts as a
// round trip only then (a synchronize right after a blocking copy costs nothing).
thread_local bool g_pending = false;

void Queued() { g_pending = true; }
void Wait() {
  if (g_pending) ++g_stats.syncs;
  g_pending = false;
}

// Each stream's work waits in its queue, in order, until something waits for it (Drain);
// with CUDAEMU_STREAMS=immediate (or SetDeferredStreams(false)) work runs when queued.
// CUDAEMU_STREAMS=eager-even (eager-odd): streams created 0th, 2nd, 4th… (1st, 3rd…) run
// their work when it is queued and the others lazily — a consumer stream can then run
// before its producer, so a missing cross-stream wait before a product shows too.
std::atomic<bool> g_defer{[] {
  const char* v = std::getenv("CUDAEMU_STREAMS");
  return v == nullptr || std::string_view(v) != "immediate";
}()};
const int g_eager_parity = [] {
  const char* v = std::getenv("CUDAEMU_STREAMS");
  if (v == nullptr) return -1;
  if (std::string_view(v) == "eager-even") return 0;
  if (std::string_view(v) == "eager-odd") return 1;
  return -1;
}();
std::atomic<uint64_t> g_streams_created{0};
bool DeferStreams() { return g_defer.load(std::memory_order_relaxed); }
struct Queue {
  std::deque<std::function<void()>> work;
  uint64_t queued = 0, done = 0;
};
std::recursive_mutex g_queue_mu;  // held while queued work runs (it may drain another stream)
std::map<cudaStream_t, Queue> g_queues;

// Runs `stream`'s queued work until `upto` items of it have run.
void Drain(cudaStream_t stream, uint64_t upto = UINT64_MAX) {
  std::lock_guard<std::recursive_mutex> lock(g_queue_mu);
  auto it = g_queues.find(stream);
  if (it == g_queues.end()) return;
  Queue& q = it->second;
  while (q.done < upto && !q.work.empty()) {
    std::function<void()> w = std::move(q.work.front());
    q.work.pop_front();
    ++q.done;
    w();
  }
}
void DrainAll() {
  std::lock_guard<std::recursive_mutex> lock(g_queue_mu);
  for (auto& [stream, q] : g_queues) Drain(stream);
}
// What a blocking call (cudaMemcpy, cudaMemset) waits for: the legacy default stream and
// the streams created without cudaStreamNonBlocking.
void DrainBlocking() {
  std::lock_guard<std::recursive_mutex> lock(g_queue_mu);
  for (auto& [stream, q] : g_queues) {
    if (stream == nullptr || (stream->flags & cudaStreamNonBlocking) == 0) Drain(stream);
  }
}

std::mutex g_mu;
std::map<uintptr_t, Range> g_ranges;
size_t g_device_in_use = 0;
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t Report(cudaError_t e, const char* fmt, auto... args) {
  std::fprintf(stderr, "cudaemu: ");
  std::fprintf(stderr, fmt, args...);
  std::fprintf(stderr, "\n");
  return e;
}

// The range holding [p, p + bytes), or end().
std::map<uintptr_t, Range>::iterator Find(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_ranges.upper_bound(a);
  if (it == g_ranges.begin()) return g_ranges.end();
  --it;
  if (a + bytes > it->first + it->second.bytes) return g_ranges.end();
  return it;
}

const char* KindName(Memory m) {
  switch (m) {
    case Memory::kDevice:
      return "device memory";
    case Memory::kPinnedHost:
      return "page-locked host memory";
    case Memory::kOther:
      return "ordinary host memory";
  }
  return "?";
}

void* MapMemfd(size_t bytes, int* fd_out) {
  const int fd = memfd_create("cudaemu-device", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return p;
}

void* Allocate(size_t bytes, Memory kind) {
  int fd = -1;
  void* p = kind == Memory::kDevice && bytes >= kShareableBytes
                ? MapMemfd(bytes, &fd)
                : ::operator new (bytes, std::align_val_t{256}, std::nothrow);
  if (p == nullptr) return nullptr;
  std::memset(p, 0xFF, bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  g_ranges[reinterpret_cast<uintptr_t>(p)] =
      Range{bytes, kind, fd >= 0 ? Origin::kMemfd : Origin::kHeap, fd};
  if (kind == Memory::kDevice) g_device_in_use += bytes;
  return p;
}

cudaError_t Release(void* p, Memory kind, const char* call) {
  if (p == nullptr) return cudaSuccess;
  DrainAll();  // freeing synchronizes the device
  Range range{};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_ranges.find(reinterpret_cast<uintptr_t>(p));
    const bool owned = it != g_ranges.end() &&
                       (it->second.origin == Origin::kHeap || it->second.origin == Origin::kMemfd);
    if (!owned || it->second.kind != kind) {
      return Report(cudaErrorInvalidValue, "%s(%p): not the start of a live allocation of %s", call,
                    p, KindName(kind));
    }
    range = it->second;
    if (kind == Memory::kDevice) g_device_in_use -= range.bytes;
    g_ranges.erase(it);
  }
  if (range.origin == Origin::kMemfd) {
    munmap(p, range.bytes);
    close(range.fd);
  } else {
    ::operator delete (p, std::align_val_t{256});
  }
  return cudaSuccess;
}

bool CopyDirectionHolds(const void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        const char* call) {
  if (kind == cudaMemcpyDefault) return true;
  const bool dst_dev = Classify(dst, bytes) == Memory::kDevice;
  const bool src_dev = Classify(src, bytes) == Memory::kDevice;
  const bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_dev == want_dst && src_dev == want_src) return true;
  static const char* const kKinds[] = {"HostToHost", "HostToDevice", "DeviceToHost",
                                       "DeviceToDevice"};
  Report(cudaErrorInvalidValue,
         "%s %s of %zu bytes: the destination %p is %s and the source %p is %s (a device range "
         "must lie inside one cudaMalloc allocation)",
         call, kKinds[kind], bytes, dst, dst_dev ? "device memory" : "not device memory", src,
         src_dev ? "device memory" : "not device memory");
  return false;
}

}  // namespace

Memory Classify(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Find(p, bytes);
  return it == g_ranges.end() ? Memory::kOther : it->second.kind;
}

void SetLastError(cudaError_t e) { g_last_error = e; }

Counts CountsSoFar() {
  return Counts{g_stats.launches.load(), g_stats.syncs.load(), g_stats.h2d.load(),
                g_stats.d2h.load()};
}

bool SetDeferredStreams(bool deferred) {
  DrainAll();
  return g_defer.exchange(deferred);
}

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  if (!DeferStreams() || (stream != nullptr && stream->eager)) {
    work();
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(g_queue_mu);
  Queue& q = g_queues[stream];
  q.work.push_back(std::move(work));
  ++q.queued;
}

void CountLaunch() {
  ++g_stats.launches;
  Queued();
}

void CheckKernelPointer(const char* kernel, int arg, const void* p) {
  if (Classify(p, 0) != Memory::kOther) return;
  std::fprintf(stderr,
               "cudaemu: kernel %s, argument %d: %p is neither device memory nor page-locked "
               "host memory (a GPU faults when it reads it)\n",
               kernel, arg, p);
  std::abort();
}

}  // namespace cudaemu

using cudaemu::Memory;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorMapBufferObjectFailed:
      return "cudaErrorMapBufferObjectFailed";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNotSupported:
      return "operation not supported (CPU emulation)";
    default:
      return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = cudaemu::g_last_error;
  cudaemu::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return cudaemu::g_last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulated on the CPU (cudaemu)");
  prop->totalGlobalMem = cudaemu::kDeviceBytes;
  prop->sharedMemPerBlock = 48 << 10;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  cudaemu::DrainAll();
  cudaemu::Wait();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(cudaemu::g_mu);
  *total_bytes = cudaemu::kDeviceBytes;
  *free_bytes = cudaemu::kDeviceBytes - cudaemu::g_device_in_use;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(cudaemu::g_mu);
    if (cudaemu::g_device_in_use + bytes > cudaemu::kDeviceBytes) return cudaErrorMemoryAllocation;
  }
  *p = cudaemu::Allocate(bytes, Memory::kDevice);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) { return cudaemu::Release(p, Memory::kDevice, "cudaFree"); }

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = cudaemu::Allocate(bytes > 0 ? bytes : 1, Memory::kPinnedHost);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void* p) {
  return cudaemu::Release(p, Memory::kPinnedHost, "cudaFreeHost");
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  if (p == nullptr || bytes == 0) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(cudaemu::g_mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = cudaemu::g_ranges.lower_bound(a);
  const bool overlaps_next = it != cudaemu::g_ranges.end() && it->first < a + bytes;
  const bool overlaps_prev =
      it != cudaemu::g_ranges.begin() && std::prev(it)->first + std::prev(it)->second.bytes > a;
  if (overlaps_next || overlaps_prev) return cudaErrorHostMemoryAlreadyRegistered;
  cudaemu::g_ranges[a] = cudaemu::Range{bytes, Memory::kPinnedHost, cudaemu::Origin::kRegistered};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(cudaemu::g_mu);
  auto it = cudaemu::g_ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == cudaemu::g_ranges.end() || it->second.origin != cudaemu::Origin::kRegistered) {
    return cudaErrorHostMemoryNotRegistered;
  }
  cudaemu::g_ranges.erase(it);
  return cudaSuccess;
}

namespace cudaemu {
namespace {

cudaError_t Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                 bool blocking, const char* call) {
  if (bytes == 0) return cudaSuccess;
  if (!CopyDirectionHolds(dst, src, bytes, kind, call)) return cudaErrorInvalidValue;
  const bool to_device = Classify(dst, bytes) == Memory::kDevice;
  const bool from_device = Classify(src, bytes) == Memory::kDevice;
  Queued();
  if (to_device && !from_device) {
    ++g_stats.h2d;
    g_stats.h2d_bytes += bytes;
  } else if (from_device && !to_device) {
    ++g_stats.d2h;
    g_stats.d2h_bytes += bytes;
    // cudaMemcpy to the host waits for the device, and so does cudaMemcpyAsync into
    // pageable memory (CUDA returns only once such a copy is done).
    if (blocking || Classify(dst, bytes) != Memory::kPinnedHost) Wait();
  }
  if (blocking) {
    DrainBlocking();
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (!to_device && !from_device) {  // host to host: done before the call returns
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (!from_device && Classify(src, bytes) != Memory::kPinnedHost) {
    // From pageable memory CUDA stages the bytes before returning: the caller may reuse
    // its buffer at once. (Page-locked sources are read when the copy runs.)
    std::vector<uint8_t> staged(static_cast<const uint8_t*>(src),
                                static_cast<const uint8_t*>(src) + bytes);
    Enqueue(stream,
            [dst, staged = std::move(staged)] { std::memcpy(dst, staged.data(), staged.size()); });
  } else {
    Enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  // Into pageable memory CUDA returns only once the copy is done.
  if (!to_device && Classify(dst, bytes) != Memory::kPinnedHost) Drain(stream);
  return cudaSuccess;
}

}  // namespace
}  // namespace cudaemu

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaemu::Copy(dst, src, bytes, kind, nullptr, /*blocking=*/true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return cudaemu::Copy(dst, src, bytes, kind, stream, /*blocking=*/false, "cudaMemcpyAsync");
}

namespace {

cudaError_t Memset(void* dst, int value, size_t bytes, cudaStream_t stream, bool blocking) {
  if (bytes == 0) return cudaSuccess;
  if (cudaemu::Classify(dst, bytes) != Memory::kDevice) {
    return cudaemu::Report(cudaErrorInvalidValue,
                           "cudaMemset of %zu bytes at %p: not inside one device allocation", bytes,
                           dst);
  }
  cudaemu::Queued();
  if (blocking) {  // after the work a blocking call waits for, and done when it returns
    cudaemu::DrainBlocking();
    std::memset(dst, value, bytes);
    return cudaSuccess;
  }
  cudaemu::Enqueue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  return Memset(dst, value, bytes, nullptr, /*blocking=*/true);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return Memset(dst, value, bytes, stream, /*blocking=*/false);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  const uint64_t n = cudaemu::g_streams_created++;
  *stream = new CUstream_st{
      flags, cudaemu::g_eager_parity >= 0 && static_cast<int>(n % 2) == cudaemu::g_eager_parity};
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {  // its queued work still runs, as on a GPU
    std::lock_guard<std::recursive_mutex> lock(cudaemu::g_queue_mu);
    cudaemu::Drain(stream);
    cudaemu::g_queues.erase(stream);
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaemu::Drain(stream);
  cudaemu::Wait();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st{};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  cudaemu::Drain(event->stream, event->mark);  // its record still runs; then it is gone
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidValue;
  std::lock_guard<std::recursive_mutex> lock(cudaemu::g_queue_mu);
  event->recorded = false;
  event->stream = stream;
  event->mark = cudaemu::g_queues[stream].queued + 1;
  cudaemu::Enqueue(stream, [event] {
    event->at = std::chrono::steady_clock::now();
    event->recorded = true;
  });
  return cudaSuccess;
}

// `stream`'s later work runs only after the work the event marks on its stream.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (event == nullptr || flags != 0) return cudaErrorInvalidValue;
  cudaemu::Enqueue(stream, [on = event->stream, mark = event->mark] { cudaemu::Drain(on, mark); });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidValue;
  cudaemu::Drain(event->stream, event->mark);
  cudaemu::Wait();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start->recorded || !end->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  std::lock_guard<std::mutex> lock(cudaemu::g_mu);
  auto it = cudaemu::g_ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == cudaemu::g_ranges.end() || it->second.kind != Memory::kDevice) {
    return cudaemu::Report(cudaErrorInvalidValue,
                           "cudaIpcGetMemHandle(%p): not the start of a device allocation", p);
  }
  if (it->second.origin != cudaemu::Origin::kMemfd) {
    return cudaemu::Report(cudaErrorNotSupported,
                           "cudaIpcGetMemHandle(%p): the emulation shares only allocations of "
                           "at least %zu bytes",
                           p, cudaemu::kShareableBytes);
  }
  cudaemu::IpcHandle h{};
  std::memcpy(h.magic, cudaemu::kIpcMagic, sizeof h.magic);
  h.pid = getpid();
  h.fd = it->second.fd;
  h.bytes = it->second.bytes;
  *handle = cudaIpcMemHandle_t{};
  std::memcpy(handle->reserved, &h, sizeof h);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned) {
  cudaemu::IpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof h);
  if (std::memcmp(h.magic, cudaemu::kIpcMagic, sizeof h.magic) != 0) {
    return cudaemu::Report(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: not an IPC handle");
  }
  if (h.pid == getpid()) {  // CUDA refuses to map an allocation into its own process
    return cudaemu::Report(cudaErrorInvalidValue,
                           "cudaIpcOpenMemHandle: the handle is this process's own");
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return cudaemu::Report(cudaErrorMapBufferObjectFailed,
                           "cudaIpcOpenMemHandle: cannot open %s (the exporting process is gone?)",
                           path);
  }
  void* m = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  std::lock_guard<std::mutex> lock(cudaemu::g_mu);
  cudaemu::g_ranges[reinterpret_cast<uintptr_t>(m)] =
      cudaemu::Range{h.bytes, Memory::kDevice, cudaemu::Origin::kIpcMapping};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* p) {
  cudaemu::DrainAll();  // nothing queued may touch the mapping once it is gone
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(cudaemu::g_mu);
    auto it = cudaemu::g_ranges.find(reinterpret_cast<uintptr_t>(p));
    if (it == cudaemu::g_ranges.end() || it->second.origin != cudaemu::Origin::kIpcMapping) {
      return cudaErrorInvalidValue;
    }
    bytes = it->second.bytes;
    cudaemu::g_ranges.erase(it);
  }
  munmap(p, bytes);
  return cudaSuccess;
}
