#include "kernels/kv_dequant.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/kv_dequant_kernel.cuh"

namespace kvc::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

absl::Status DequantizeOnDevice(KvFormat format, std::span<const uint8_t> codes,
                                std::span<const uint8_t> scales, std::span<float> out) {
  if (format == KvFormat::kSwaKv) {
    return absl::InvalidArgumentError("the swa format is never stored; no device dequantizer");
  }
  const int64_t n = static_cast<int64_t>(out.size());
  const int64_t block = SpecOf(format).scale_block;
  if (n % block != 0 || static_cast<int64_t>(codes.size()) != CodesBytes(format, n) ||
      static_cast<int64_t>(scales.size()) != ScalesBytes(format, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize ", n, " ", SpecOf(format).name, " values: got ", codes.size(),
                     " code bytes and ", scales.size(), " scale bytes"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  uint8_t* d_codes = nullptr;
  uint8_t* d_scales = nullptr;
  float* d_out = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_codes), codes.size()));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_scales), scales.size()));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_out), out.size_bytes()));
  CUDA_CHECK(cudaMemcpy(d_codes, codes.data(), codes.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_scales, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(LaunchDequantizeFp4(Fp4ScaleOf(format), static_cast<int>(block), d_codes, d_scales, n,
                                 d_out,
                                 /*stream=*/nullptr));
  CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size_bytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_codes));
  CUDA_CHECK(cudaFree(d_scales));
  CUDA_CHECK(cudaFree(d_out));
  return absl::OkStatus();
}

}  // namespace kvc::cuda
