// The CUDA runtime API as far as kvcache's kernels and their host wrappers use it, run on
// the CPU: device memory is tracked host memory, streams and events are synchronous, and
// a launch runs every thread of every block to completion before it returns. Copies and
// launches check what a GPU would reject or fault on (a device range outside any
// allocation, a host pointer passed to a kernel, a block over 1024 threads, …), print
// why and fail as CUDA would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorHostMemoryAlreadyRegistered = 712,
  cudaErrorHostMemoryNotRegistered = 713,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

struct cudaIpcMemHandle_st {
  char reserved[64];
};
typedef struct cudaIpcMemHandle_st cudaIpcMemHandle_t;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major;
  int minor;
};

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

constexpr unsigned cudaStreamDefault = 0;
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostRegisterDefault = 0;
constexpr unsigned cudaHostRegisterPortable = 1;
constexpr unsigned cudaHostRegisterMapped = 2;
constexpr unsigned cudaHostRegisterReadOnly = 8;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;

const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* p);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// CUDA IPC between processes of one user: device allocations of 1 MiB and more are memfd
// mappings, and a handle names the owner's pid and descriptor (opened through /proc).
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p);
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* p);

namespace cudaemu {

// Where a pointer lies: in a cudaMalloc allocation, in page-locked host memory
// (cudaMallocHost/cudaHostRegister: a kernel may read it), or elsewhere.
enum class Memory { kDevice, kPinnedHost, kOther };
Memory Classify(const void* p, size_t bytes);

// Device work queued on `stream` (a launch, an async copy or memset, a cuBLAS product):
// held in the stream's queue, in order, until something waits for it — a synchronization
// of that stream or of the device, an event recorded after it (cudaEventSynchronize, or a
// stream that cudaStreamWaitEvent made wait), a blocking copy or memset for the legacy and
// blocking streams, a free. So results read before they are waited for, or used on
// another stream without an event, are wrong here as they can be on a GPU. With
// CUDAEMU_STREAMS=immediate every piece of work runs when it is queued.
void Enqueue(cudaStream_t stream, std::function<void()> work);
// Switches between the two (tests); runs what is queued first. Returns the previous mode.
bool SetDeferredStreams(bool deferred);

// Records a launch failure for cudaGetLastError on this host thread.
void SetLastError(cudaError_t e);
// Counts a launch for the CUDAEMU_STATS report.
void CountLaunch();

// The process's totals so far (what CUDAEMU_STATS=1 prints at exit): waits are the host
// blocking on the device after queued work — synchronizations, and copies to the host that
// return only when done.
struct Counts {
  uint64_t launches = 0, waits = 0, host_to_device = 0, device_to_host = 0;
};
Counts CountsSoFar();

}  // namespace cudaemu
