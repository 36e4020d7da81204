// Device code on the CPU: CUDA's qualifiers, built-in variables, barriers, warp shuffles,
// atomics and float intrinsics for kernels compiled by the host compiler, and the launch
// that runs them. Every CUDA thread of a block is a fiber on the launching host thread;
// the block's fibers run until each finishes or waits at a barrier (__syncthreads, a
// warp shuffle), the next pass resumes the released ones, in alternating order so that
// a missing barrier shows up whichever thread writes first. Blocks run one after
// another, so `__shared__` variables are statics shared by the block's fibers.
#pragma once

#include <math.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#include "cudaemu/runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// Every __shared__ variable lands in one ELF section, which the scheduler fills with
// garbage before each block, as a GPU leaves shared memory uninitialized.
#define __shared__ static __attribute__((section("cudaemu_shared")))

namespace cudaemu {

struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// The emulated thread running now; a call outside a kernel aborts naming the caller.
const ThreadContext& Self(const char* what);
void SyncThreads();
void SyncWarp(unsigned mask);
// Lane `src`'s `value` as handed to the same shuffle by every lane in `mask`.
uint64_t Shuffle(unsigned mask, uint64_t value, int src);
int Lane();
void* DynamicShared();

// False (with the error recorded for cudaGetLastError, and a message) when the launch
// configuration is one a GPU rejects.
bool CheckGrid(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes);
// Runs body once per thread of every block of a checked configuration.
void RunGrid(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes,
             const std::function<void()>& body);

// Aborts, naming the kernel and the argument, when a pointer argument points neither into
// device memory nor into page-locked host memory: on a GPU that is a fault when read.
void CheckKernelPointer(const char* kernel, int arg, const void* p);

template <typename T>
T* DynamicSharedAs() {
  return static_cast<T*>(DynamicShared());
}

template <typename... P>
auto Launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t shared_bytes = 0,
            cudaStream_t stream = nullptr) {
  return [=](auto&&... args) {
    static_assert(sizeof...(args) == sizeof...(P), "kernel argument count");
    const std::tuple<P...> params(static_cast<P>(args)...);
    int arg = 0;
    std::apply(
        [&](const auto&... v) {
          (
              [&] {
                if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>) {
                  if (v != nullptr) CheckKernelPointer(name, arg, v);
                }
                ++arg;
              }(),
              ...);
        },
        params);
    if (!CheckGrid(name, grid, block, shared_bytes)) return;
    CountLaunch();
    Enqueue(stream,
            [=] { RunGrid(name, grid, block, shared_bytes, [&] { std::apply(kernel, params); }); });
  };
}

template <typename To, typename From>
To BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &v, sizeof t);
  return t;
}

template <typename T>
T ShuffleValue(unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = Shuffle(mask, bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace cudaemu

#define threadIdx (::cudaemu::Self("threadIdx").thread_idx)
#define blockIdx (::cudaemu::Self("blockIdx").block_idx)
#define blockDim (::cudaemu::Self("blockDim").block_dim)
#define gridDim (::cudaemu::Self("gridDim").grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { ::cudaemu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cudaemu::SyncWarp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::cudaemu::Lane();
  return ::cudaemu::ShuffleValue(mask, v, (lane / width) * width + src % width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::cudaemu::Lane();
  const int src = lane ^ lane_mask;
  return ::cudaemu::ShuffleValue(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::cudaemu::Lane();
  const int src = lane + static_cast<int>(delta);
  return ::cudaemu::ShuffleValue(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::cudaemu::Lane();
  const int src = lane - static_cast<int>(delta);
  return ::cudaemu::ShuffleValue(mask, v, src >= 0 && src / width == lane / width ? src : lane);
}

// Fibers of one launch never run at the same time, so any read-modify-write would do;
// std::atomic_ref (relaxed, as CUDA's atomics are) tells ThreadSanitizer they are atomic.
template <typename T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}
template <typename T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v, std::memory_order_relaxed);
}
template <typename T>
T atomicCAS(T* p, T expected, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, v, std::memory_order_relaxed);
  return expected;  // the old value either way
}
template <typename T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (v > old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (v < old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}

// CUDA's integer min/max (device code calls them unqualified).
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
constexpr std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
constexpr std::common_type_t<A, B> max(A a, B b) {
  return a > b ? a : b;
}

// Correctly rounded single operations: the host compiler does not contract ISO C++
// expressions (the emulated sources are built with -ffp-contract=off), so each is one op.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline unsigned __float_as_uint(float v) { return ::cudaemu::BitCast<unsigned>(v); }
inline float __uint_as_float(unsigned v) { return ::cudaemu::BitCast<float>(v); }
inline int __float_as_int(float v) { return ::cudaemu::BitCast<int>(v); }
inline float __int_as_float(int v) { return ::cudaemu::BitCast<float>(v); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(unsigned v) { return v == 0 ? 32 : __builtin_clz(v); }
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
