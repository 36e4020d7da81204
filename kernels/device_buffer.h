// DeviceBuffer: a device allocation of n elements, optionally a copy of a host span,
// freed with the object (host wrappers of the kernels use it for their inputs and outputs);
// GrowingDeviceBuffer: reusable scratch for the engine's backends.
#pragma once

#include <cuda_runtime_api.h>

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

// Per-call scratch on the device that only grows: Reserve(n) gives room for n elements,
// reallocating (contents lost) when more than ever before is asked. The caller makes sure
// no queued work still uses the old allocation (the backends synchronize every call).
template <typename T>
class GrowingDeviceBuffer {
 public:
  GrowingDeviceBuffer() = default;
  ~GrowingDeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  GrowingDeviceBuffer(const GrowingDeviceBuffer&) = delete;
  GrowingDeviceBuffer& operator=(const GrowingDeviceBuffer&) = delete;
  T* Reserve(size_t n) {
    if (n > n_) {
      if (p_ != nullptr) CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
      n_ = n;
    }
    return p_;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host staging that only grows (contents lost when it does), for copies that
// must not wait: CUDA returns from a device-to-host copy into pageable memory only once it
// is done, so a backend that copies results into its callers' vectors directly waits once
// per result; staged here, all results of a call come back with one wait.
template <typename T>
class GrowingPinnedBuffer {
 public:
  GrowingPinnedBuffer() = default;
  ~GrowingPinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  GrowingPinnedBuffer(const GrowingPinnedBuffer&) = delete;
  GrowingPinnedBuffer& operator=(const GrowingPinnedBuffer&) = delete;
  T* Reserve(size_t n) {
    if (n > n_) {
      if (p_ != nullptr) CUDA_CHECK(cudaFreeHost(p_));
      p_ = nullptr;
      CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
      n_ = n;
    }
    return p_;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace kvc::cuda
