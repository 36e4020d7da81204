#include "kernels/kv_dequant_kernel.cuh"

namespace kvc::cuda {
namespace {

__device__ __forceinline__ float E2M1Value(uint32_t code) {
  // Magnitudes of codes 0..7; bit 3 is the sign (code 8 is -0).
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 7u];
  return (code & 8u) ? -v : v;
}

__device__ __forceinline__ float E4M3Value(uint32_t code) {
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 7;
  float v;
  if (exp == 0xF && mant == 7) {
    v = __int_as_float(0x7FC00000);  // NaN
  } else if (exp == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(static_cast<float>(8 + mant), exp - 10);
  }
  return (code & 0x80u) ? -v : v;
}

__device__ __forceinline__ float E8M0Value(uint32_t code) {
  if (code == 0xFF) return __int_as_float(0x7FC00000);
  return ldexpf(1.0f, static_cast<int>(code) - 127);
}

// One thread per code byte (two values): the low nibble is the even element.
__global__ void DequantizeFp4Kernel(Fp4Scale scale, int scale_block, const uint8_t* codes,
                                    const uint8_t* scales, int64_t pairs, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const uint32_t byte = codes[i];
  const int64_t even = 2 * i;
  // scale_block is even, so both elements of a byte share one scale.
  const uint32_t sc = scales[even / scale_block];
  const float s = scale == Fp4Scale::kE4M3 ? E4M3Value(sc) : E8M0Value(sc);
  out[even] = E2M1Value(byte & 0xFu) * s;
  out[even + 1] = E2M1Value(byte >> 4) * s;
}

}  // namespace

cudaError_t LaunchDequantizeFp4(Fp4Scale scale, int scale_block, const uint8_t* codes,
                                const uint8_t* scales, int64_t n, float* out, cudaStream_t stream) {
  const int64_t pairs = n / 2;
  if (pairs == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  DequantizeFp4Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      scale, scale_block, codes, scales, pairs, out);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
