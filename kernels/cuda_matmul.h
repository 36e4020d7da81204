// The engine's matrix products on the GPU (model::MatmulBackend): weights resident in
// device memory from Register on, activations copied up and results copied back per call.
// Each output is the same fma chain as on the CPU (gemm_kernel.cuh), so a model with this
// backend computes the CPU engine's bits — logits, pages, exact resume — only faster
// where the matrices are large.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/gemm.h"
#include "engine/model/matmul.h"

namespace kvc::cuda {

// What another CUDA backend needs to run the engine's products on data already on the
// device, with MakeCudaMatmul's bits: the device copy of a registered weight, in the panel
// layout LaunchGemm (gemm_kernel.cuh) reads. MakeCudaMatmul's backend is one (cuBLAS's
// keeps row-major copies, and its bits are its own).
class ResidentPanels {
 public:
  // Null when `w` was not registered. Valid as long as the backend lives.
  virtual const float* DevicePanels(const cpu::PackedMatrix& w) const = 0;

 protected:
  ~ResidentPanels() = default;
};

// FailedPrecondition without a GPU.
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCudaMatmul();

// The throughput alternative: cuBLAS SGEMM (FP32, the library's default math mode), a
// group's products issued back to back on one stream with one wait. Not batch invariant
// (cuBLAS picks kernels by shape), so logits differ from the CPU's in the last bits and
// the model refuses exact replay with it. FailedPrecondition without a GPU.
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCublasMatmul();

// One GEMM on device 0 (tests, benchmarks): x is m × w.in_features().
[[nodiscard]] absl::StatusOr<std::vector<float>> GemmOnDevice(std::span<const float> x, int64_t m,
                                                              const cpu::PackedMatrix& w);

}  // namespace kvc::cuda
