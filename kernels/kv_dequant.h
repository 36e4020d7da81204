// FP4 global-KV dequantization on the GPU: the CUDA twin of kvc::Dequantize for the two
// stored formats (main KV: E2M1 + E4M3 per 16; index K: E2M1 + E8M0 per 32). Output is
// bit-identical to the CPU codec (both compute value(code) × scale in fp32, which is
// exact).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/spec/kv_codec.h"
#include "kernels/kv_dequant_kernel.cuh"

namespace kvc::cuda {

// The scale encoding of a stored format (main: E4M3; index: E8M0).
inline Fp4Scale Fp4ScaleOf(KvFormat format) {
  return format == KvFormat::kMainKv ? Fp4Scale::kE4M3 : Fp4Scale::kE8M0;
}

// Number of usable CUDA devices; 0 when there is no GPU or no driver (never aborts).
int DeviceCount();

// Dequantizes n values whose codes and scales are in host memory, on device 0: copies
// in, runs the kernel, copies out. FailedPrecondition without a GPU; InvalidArgument for
// the SWA format (never stored, so no device twin) or mismatched buffer sizes.
[[nodiscard]] absl::Status DequantizeOnDevice(KvFormat format, std::span<const uint8_t> codes,
                                              std::span<const uint8_t> scales,
                                              std::span<float> out);

}  // namespace kvc::cuda
