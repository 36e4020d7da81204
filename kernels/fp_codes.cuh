// Device-side FP4/FP8 element and scale codes, shared by the kernels: the CPU codec's own
// definitions (engine/spec/fp_codes.h, compiled for host and device), under the names the
// kernels use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/spec/fp_codes.h"

namespace kvc::cuda {

__device__ __forceinline__ float E2M1Value(uint32_t code) { return fp::DecodeE2M1(code); }
__device__ __forceinline__ float E4M3Value(uint32_t code) { return fp::DecodeE4M3(code); }
__device__ __forceinline__ float E8M0Value(uint32_t code) { return fp::DecodeE8M0(code); }

}  // namespace kvc::cuda
