#include "kernels/fp_codes.cuh"
#include "kernels/kv_dequant_kernel.cuh"

namespace kvc::cuda {
namespace {

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
