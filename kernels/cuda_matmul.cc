#include "kernels/cuda_matmul.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/device_matmul.h"
#include "kernels/gemm_kernel.cuh"
#include "kernels/kv_dequant.h"
#include "kernels/row_ops_kernel.cuh"

namespace kvc::cuda {
namespace {

// W (n × k, row-major [out][in]) back out of the CPU's panel layout, for cuBLAS.
std::vector<float> Unpack(const cpu::PackedMatrix& w) {
  const int64_t n = w.out_features(), k = w.in_features(), P = cpu::PackedMatrix::kPanel;
  std::vector<float> out(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float* panel = w.panel(r / P);
    for (int64_t c = 0; c < k; ++c) out[r * k + c] = panel[c * P + r % P];
  }
  return out;
}

void CublasCheck(cublasStatus_t s, const char* what) {
  KVC_CHECK(s == CUBLAS_STATUS_SUCCESS)
      << "cuBLAS " << what << " failed: status " << static_cast<int>(s);
}

// Our batch-invariant GEMM kernel over the CPU's panel layout.
class CudaMatmul final : public DeviceMatmul {
 public:
  const char* name() const override { return "cuda"; }

 protected:
  bool RoutesOnDevice() const override { return true; }
  std::span<const float> Layout(const cpu::PackedMatrix& w, std::vector<float>&) const override {
    return w.packed();
  }
  void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n, float* d_y,
              cudaStream_t stream) const override {
    CUDA_CHECK(LaunchGemm(d_x, m, k, d_w, n, d_y, stream));
  }
};

// cuBLAS SGEMM over row-major weights: faster, not batch invariant.
class CublasMatmul final : public DeviceMatmul {
 public:
  CublasMatmul() {
    CublasCheck(cublasCreate(&handle_), "create");
    CublasCheck(cublasSetStream(handle_, stream_), "set stream");
    CUDA_CHECK(cudaEventCreate(&input_ready_));
    CUDA_CHECK(cudaEventCreate(&result_ready_));
  }
  ~CublasMatmul() override {
    cudaEventDestroy(input_ready_);
    cudaEventDestroy(result_ready_);
    cublasDestroy(handle_);
  }
  const char* name() const override { return "cublas"; }
  bool batch_invariant() const override { return false; }

 protected:
  std::span<const float> Layout(const cpu::PackedMatrix& w,
                                std::vector<float>& storage) const override {
    storage = Unpack(w);
    return storage;
  }
  void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n, float* d_y,
              cudaStream_t stream) const override {
    if (k == 0) {
      CUDA_CHECK(cudaMemsetAsync(d_y, 0, static_cast<size_t>(m * n) * sizeof(float), stream));
      return;
    }
    // The handle stays on stream_ (its workspace must not serve two streams at once): a
    // product for another stream runs on stream_ between two event waits, in that stream's
    // order all the same.
    if (stream != stream_) {
      CUDA_CHECK(cudaEventRecord(input_ready_, stream));
      CUDA_CHECK(cudaStreamWaitEvent(stream_, input_ready_, 0));
    }
    // Row-major y (m × n) = x · Wᵀ is column-major yᵀ = W · xᵀ.
    const float one = 1.0f, zero = 0.0f;
    CublasCheck(
        cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                    static_cast<int>(k), &one, d_w, static_cast<int>(k), d_x, static_cast<int>(k),
                    &zero, d_y, static_cast<int>(n)),
        "sgemm");
    if (stream != stream_) {
      CUDA_CHECK(cudaEventRecord(result_ready_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(stream, result_ready_, 0));
    }
  }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t input_ready_ = nullptr, result_ready_ = nullptr;  // used with mu_ held
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCublasMatmul() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CublasMatmul>();
}

const DeviceProducts* LandingOn(const model::MatmulBackend* landing) {
  if (landing == nullptr) return nullptr;
  const auto* device = dynamic_cast<const DeviceProducts*>(landing);
  if (device == nullptr) landing->Settle();
  return device;
}

absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCudaMatmul() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaMatmul>();
}

absl::StatusOr<std::vector<float>> GemmOnDevice(std::span<const float> x, int64_t m,
                                                const cpu::PackedMatrix& w) {
  if (m < 0 || static_cast<int64_t>(x.size()) != m * w.in_features()) {
    return absl::InvalidArgumentError(absl::StrCat("gemm of ", m, " rows × ", w.in_features(),
                                                   " inputs: got ", x.size(), " values"));
  }
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::MatmulBackend> mm, MakeCudaMatmul());
  std::vector<float> y(static_cast<size_t>(m * w.out_features()));
  mm->Gemm(x.data(), m, w, y.data());
  return y;
}

}  // namespace kvc::cuda
