// Device-side launcher for FP4 dequantization. Kept free of abseil and C++20 so nvcc
// compiles it as C++17; kv_dequant.cc wraps it for the rest of the project.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// Scale encodings of the stored formats.
enum class Fp4Scale : int { kE4M3 = 0, kE8M0 = 1 };

// out[i] = e2m1(code i) × scale(i / scale_block), for n values (n even). All pointers are
// device pointers. Launch errors are reported by the returned cudaError_t.
cudaError_t LaunchDequantizeFp4(Fp4Scale scale, int scale_block, const uint8_t* codes,
                                const uint8_t* scales, int64_t n, float* out, cudaStream_t stream);

}  // namespace kvc::cuda
