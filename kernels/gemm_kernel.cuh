// Device-side launcher of the batch-invariant GEMM (C++17 for nvcc; gemm.cc wraps it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// y (m × n) = x (m × k) · Wᵀ with W in the CPU's panel layout (engine/cpu/gemm.h: panels
// of 16 output columns, each k-major, zero-padded), all device pointers. Every output is
// one __fmaf_rn chain over k in increasing order starting from +0 — the CPU GEMM's bits.
cudaError_t LaunchGemm(const float* x, int64_t m, int64_t k, const float* panels, int64_t n,
                       float* y, cudaStream_t stream);

}  // namespace kvc::cuda
