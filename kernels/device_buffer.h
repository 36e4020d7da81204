// DeviceBuffer: a device allocation of n elements, optionally a copy of a host span,
// freed with the object (host wrappers of the kernels use it for their inputs and outputs);
// GrowingDeviceBuffer / GrowingPinnedBuffer: reusable scratch for the engine's backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <vector>

#include "kernels/cuda_check.h"

namespace kvc::cuda {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) {
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> ToHost() const {
    std::vector<T> out(n_);
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Per-call scratch that only grows: Reserve(n) gives room for n elements, reallocating
// (contents lost) when more than ever before is asked. The caller makes sure no queued
// work still uses the old allocation (the backends synchronize every call).
//   - GrowingDeviceBuffer: device memory.
//   - GrowingPinnedBuffer: page-locked host staging, for copies that must not wait. CUDA
//     returns from a device-to-host copy into pageable memory only once it is done, so a
//     backend copying results into its callers' vectors directly waits once per result;
//     staged here, all results of a call come back with one wait.
enum class ScratchMemory { kDevice, kPinnedHost };

template <typename T, ScratchMemory kWhere>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  ~GrowingBuffer() {  // not checked: at process exit the CUDA runtime may be gone first
    if (p_ != nullptr) (void)Release();
  }
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  T* Reserve(size_t n) {
    if (n > n_) {
      if (p_ != nullptr) CUDA_CHECK(Release());
      p_ = nullptr;
      void** at = reinterpret_cast<void**>(&p_);
      CUDA_CHECK(kWhere == ScratchMemory::kDevice ? cudaMalloc(at, n * sizeof(T))
                                                  : cudaMallocHost(at, n * sizeof(T)));
      n_ = n;
    }
    return p_;
  }
  T* data() const { return p_; }  // as last reserved

 private:
  cudaError_t Release() {
    return kWhere == ScratchMemory::kDevice ? cudaFree(p_) : cudaFreeHost(p_);
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
using GrowingDeviceBuffer = GrowingBuffer<T, ScratchMemory::kDevice>;
template <typename T>
using GrowingPinnedBuffer = GrowingBuffer<T, ScratchMemory::kPinnedHost>;

// Typed regions carved one after another out of one allocation (8-byte aligned), so a
// call's inputs go up, or its results come back, in one copy: Take<T>(n) gives a region's
// offset, At<T>(base, offset) its address in a buffer of bytes() bytes.
class Carve {
 public:
  template <typename T>
  size_t Take(size_t n) {
    const size_t at = bytes_;
    bytes_ += (n * sizeof(T) + 7) / 8 * 8;
    return at;
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

template <typename T>
T* At(std::byte* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

}  // namespace kvc::cuda
