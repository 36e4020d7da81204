#include "kernels/cuda_matmul.h"

#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/gemm_kernel.cuh"
#include "kernels/kv_dequant.h"

namespace kvc::cuda {
namespace {

// A device allocation that only grows (per-call scratch).
class Scratch {
 public:
  ~Scratch() {
    if (p_ != nullptr) cudaFree(p_);
  }
  float* Reserve(size_t n) {
    if (n > n_) {
      if (p_ != nullptr) CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(float)));
      n_ = n;
    }
    return p_;
  }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

class CudaMatmul final : public model::MatmulBackend {
 public:
  CudaMatmul() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaMatmul() override {
    for (auto& [key, p] : weights_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  void Register(const cpu::PackedMatrix& w) override {
    std::lock_guard lock(mu_);
    const std::span<const float> packed = w.packed();
    if (packed.empty() || weights_.contains(packed.data())) return;
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), packed.size_bytes()));
    CUDA_CHECK(cudaMemcpy(d, packed.data(), packed.size_bytes(), cudaMemcpyHostToDevice));
    weights_.emplace(packed.data(), d);
  }

  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    const int64_t k = w.in_features(), n = w.out_features();
    if (m == 0 || n == 0) return;
    std::lock_guard lock(mu_);
    const std::span<const float> packed = w.packed();
    const float* d_w = nullptr;
    if (auto it = weights_.find(packed.data()); it != weights_.end()) {
      d_w = it->second;
    } else {  // transient (e.g. the indexer's keys): copied up for this call
      float* t = w_.Reserve(packed.size());
      CUDA_CHECK(
          cudaMemcpyAsync(t, packed.data(), packed.size_bytes(), cudaMemcpyHostToDevice, stream_));
      d_w = t;
    }
    float* d_x = x_.Reserve(static_cast<size_t>(m * k));
    float* d_y = y_.Reserve(static_cast<size_t>(m * n));
    CUDA_CHECK(cudaMemcpyAsync(d_x, x, static_cast<size_t>(m * k) * sizeof(float),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(LaunchGemm(d_x, m, k, d_w, n, d_y, stream_));
    CUDA_CHECK(cudaMemcpyAsync(y, d_y, static_cast<size_t>(m * n) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }

 private:
  mutable std::mutex mu_;  // one call at a time on the stream and the scratch buffers
  cudaStream_t stream_ = nullptr;
  std::unordered_map<const float*, float*> weights_;  // host panels → device copy
  mutable Scratch x_, y_, w_;
};

}  // namespace

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
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> mm = MakeCudaMatmul();
  if (!mm.ok()) return mm.status();
  std::vector<float> y(static_cast<size_t>(m * w.out_features()));
  (*mm)->Gemm(x.data(), m, w, y.data());
  return y;
}

}  // namespace kvc::cuda
