#include "kernels/cuda_matmul.h"

#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/gemm_kernel.cuh"
#include "kernels/kv_dequant.h"

namespace kvc::cuda {
namespace {

using Scratch = GrowingDeviceBuffer<float>;

// The group's results, staged back to back in `staged`, into the callers' outputs.
void CopyResults(std::span<const model::GemmCall> calls, const float* staged) {
  size_t at = 0;
  for (const model::GemmCall& c : calls) {
    const size_t n = static_cast<size_t>(c.m * c.w->out_features());
    if (n == 0) continue;
    std::memcpy(c.y, staged + at, n * sizeof(float));
    at += n;
  }
}

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
    const model::GemmCall call{x, m, &w, y};
    GemmGroup(std::span(&call, 1));
  }
  // Copies every input up, launches every product and copies every result back on one
  // stream, then waits once.
  void GemmGroup(std::span<const model::GemmCall> calls) const override {
    std::lock_guard lock(mu_);
    size_t xs = 0, ys = 0, ws = 0;
    for (const model::GemmCall& c : calls) {
      xs += static_cast<size_t>(c.m * c.w->in_features());
      ys += static_cast<size_t>(c.m * c.w->out_features());
      if (!weights_.contains(c.w->packed().data())) ws += c.w->packed().size();
    }
    float* d_x = x_.Reserve(xs);
    float* d_y = y_.Reserve(ys);
    float* d_t = w_.Reserve(ws);
    // Inputs and results pass through page-locked staging: the copies are truly
    // asynchronous, and the group costs one wait however many products it has.
    float* h_x = hx_.Reserve(xs);
    float* h_y = hy_.Reserve(ys);
    size_t xo = 0, yo = 0, wo = 0;
    for (const model::GemmCall& c : calls) {
      const int64_t k = c.w->in_features(), n = c.w->out_features();
      if (c.m == 0 || n == 0) continue;
      const std::span<const float> packed = c.w->packed();
      const float* d_w = nullptr;
      if (auto it = weights_.find(packed.data()); it != weights_.end()) {
        d_w = it->second;
      } else {  // transient (e.g. the indexer's keys): copied up for this call
        CUDA_CHECK(cudaMemcpyAsync(d_t + wo, packed.data(), packed.size_bytes(),
                                   cudaMemcpyHostToDevice, stream_));
        d_w = d_t + wo;
        wo += packed.size();
      }
      const size_t x_bytes = static_cast<size_t>(c.m * k) * sizeof(float);
      std::memcpy(h_x + xo, c.x, x_bytes);
      CUDA_CHECK(cudaMemcpyAsync(d_x + xo, h_x + xo, x_bytes, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(LaunchGemm(d_x + xo, c.m, k, d_w, n, d_y + yo, stream_));
      CUDA_CHECK(cudaMemcpyAsync(h_y + yo, d_y + yo, static_cast<size_t>(c.m * n) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
      xo += static_cast<size_t>(c.m * k);
      yo += static_cast<size_t>(c.m * n);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CopyResults(calls, h_y);
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }

 private:
  mutable std::mutex mu_;  // one call at a time on the stream and the scratch buffers
  cudaStream_t stream_ = nullptr;
  std::unordered_map<const float*, float*> weights_;  // host panels → device copy
  mutable Scratch x_, y_, w_;
  mutable GrowingPinnedBuffer<float> hx_, hy_;
};

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
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS %s failed: status %d\n", what, static_cast<int>(s));
    std::abort();
  }
}

class CublasMatmul final : public model::MatmulBackend {
 public:
  CublasMatmul() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CublasCheck(cublasCreate(&handle_), "create");
    CublasCheck(cublasSetStream(handle_, stream_), "set stream");
  }
  ~CublasMatmul() override {
    for (auto& [key, p] : weights_) cudaFree(p);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cublas"; }
  bool batch_invariant() const override { return false; }

  void Register(const cpu::PackedMatrix& w) override {
    std::lock_guard lock(mu_);
    if (w.out_features() == 0 || weights_.contains(w.packed().data())) return;
    const std::vector<float> rows = Unpack(w);
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), rows.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
    weights_.emplace(w.packed().data(), d);
  }
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    const model::GemmCall call{x, m, &w, y};
    GemmGroup(std::span(&call, 1));
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }
  void GemmGroup(std::span<const model::GemmCall> calls) const override {
    std::lock_guard lock(mu_);
    size_t xs = 0, ys = 0, ws = 0;
    std::vector<std::vector<float>> transient(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      const model::GemmCall& c = calls[i];
      xs += static_cast<size_t>(c.m * c.w->in_features());
      ys += static_cast<size_t>(c.m * c.w->out_features());
      if (!weights_.contains(c.w->packed().data()) && c.w->out_features() > 0) {
        transient[i] = Unpack(*c.w);
        ws += transient[i].size();
      }
    }
    float* d_x = x_.Reserve(xs);
    float* d_y = y_.Reserve(ys);
    float* d_t = w_.Reserve(ws);
    // Inputs and results pass through page-locked staging: the copies are truly
    // asynchronous, and the group costs one wait however many products it has.
    float* h_x = hx_.Reserve(xs);
    float* h_y = hy_.Reserve(ys);
    size_t xo = 0, yo = 0, wo = 0;
    const float one = 1.0f, zero = 0.0f;
    for (size_t i = 0; i < calls.size(); ++i) {
      const model::GemmCall& c = calls[i];
      const int64_t k = c.w->in_features(), n = c.w->out_features();
      if (c.m == 0 || n == 0) continue;
      const float* d_w = nullptr;
      if (transient[i].empty()) {
        d_w = weights_.at(c.w->packed().data());
      } else {
        CUDA_CHECK(cudaMemcpyAsync(d_t + wo, transient[i].data(),
                                   transient[i].size() * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_));
        d_w = d_t + wo;
        wo += transient[i].size();
      }
      const size_t x_bytes = static_cast<size_t>(c.m * k) * sizeof(float);
      std::memcpy(h_x + xo, c.x, x_bytes);
      CUDA_CHECK(cudaMemcpyAsync(d_x + xo, h_x + xo, x_bytes, cudaMemcpyHostToDevice, stream_));
      if (k == 0) {
        CUDA_CHECK(
            cudaMemsetAsync(d_y + yo, 0, static_cast<size_t>(c.m * n) * sizeof(float), stream_));
      } else {
        // Row-major y (m × n) = x · Wᵀ is column-major yᵀ = W · xᵀ.
        CublasCheck(
            cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                        static_cast<int>(c.m), static_cast<int>(k), &one, d_w, static_cast<int>(k),
                        d_x + xo, static_cast<int>(k), &zero, d_y + yo, static_cast<int>(n)),
            "sgemm");
      }
      CUDA_CHECK(cudaMemcpyAsync(h_y + yo, d_y + yo, static_cast<size_t>(c.m * n) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
      xo += static_cast<size_t>(c.m * k);
      yo += static_cast<size_t>(c.m * n);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CopyResults(calls, h_y);
  }

 private:
  mutable std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::unordered_map<const float*, float*> weights_;  // host panels → device rows
  mutable Scratch x_, y_, w_;
  mutable GrowingPinnedBuffer<float> hx_, hy_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCublasMatmul() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CublasMatmul>();
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
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> mm = MakeCudaMatmul();
  if (!mm.ok()) return mm.status();
  std::vector<float> y(static_cast<size_t>(m * w.out_features()));
  (*mm)->Gemm(x.data(), m, w, y.data());
  return y;
}

}  // namespace kvc::cuda
