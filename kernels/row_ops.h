// Host wrappers of the per-row kernels (row_ops_kernel.cuh): copy in, launch on device 0,
// copy out. FailedPrecondition without a GPU; InvalidArgument for sizes that disagree.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::cuda {

struct HcOnDevice {
  std::vector<float> pre, post, comb;  // rows × hc, rows × hc, rows × hc × hc
};

[[nodiscard]] absl::StatusOr<std::vector<float>> RmsNormOnDevice(std::span<const float> x,
                                                                 std::span<const float> w,
                                                                 double eps);
[[nodiscard]] absl::StatusOr<std::vector<float>> RopeOnDevice(std::span<const float> x, int64_t dim,
                                                              std::span<const double> freqs,
                                                              std::span<const int64_t> pos,
                                                              bool inverse);
// y[b][a][c] = x[a][b][c] for x of outer × middle × (x.size() / (outer · middle)).
[[nodiscard]] absl::StatusOr<std::vector<float>> SwapOuterAxesOnDevice(std::span<const float> x,
                                                                       int64_t outer,
                                                                       int64_t middle);
[[nodiscard]] absl::StatusOr<std::vector<float>> PoolGroupsOnDevice(std::span<const float> kv,
                                                                    std::span<const float> score,
                                                                    int64_t ratio, int64_t dim);
[[nodiscard]] absl::StatusOr<HcOnDevice> HcCoefficientsOnDevice(std::span<const float> mixes,
                                                                std::span<const float> base,
                                                                std::span<const float> scale,
                                                                int hc, int iters, float eps);

// mixes (rows of mix values) each by cpu::HcScaleMixesRow with its row of x (rows of n).
[[nodiscard]] absl::StatusOr<std::vector<float>> HcScaleMixesOnDevice(std::span<const float> x,
                                                                      int64_t n,
                                                                      std::span<const float> mixes);
// cpu::HcPre of every row: X rows of hc × d, a rows of hc.
[[nodiscard]] absl::StatusOr<std::vector<float>> HcPreOnDevice(std::span<const float> X,
                                                               std::span<const float> a, int64_t hc,
                                                               int64_t d);
// cpu::HcMeanAt of every row: X rows of hc × d, the result rows of d side by side with
// `gap` floats after each (the layer loop writes them into a wider row).
[[nodiscard]] absl::StatusOr<std::vector<float>> HcMeanOnDevice(std::span<const float> X,
                                                                int64_t hc, int64_t d, int64_t gap);
// cpu::HcPost of every row: f rows of d, R rows of hc × d, post rows of hc, comb of hc × hc.
[[nodiscard]] absl::StatusOr<std::vector<float>> HcPostOnDevice(std::span<const float> f,
                                                                std::span<const float> R,
                                                                std::span<const float> post,
                                                                std::span<const float> comb,
                                                                int64_t hc, int64_t d);

// Engram's gating of every row of X (rows of hc × d) with KV (rows of (hc + 1) × d) and
// qw, kw (hc × d): X with each copy plus its gate times the row's value.
[[nodiscard]] absl::StatusOr<std::vector<float>> EngramGateOnDevice(std::span<const float> X,
                                                                    std::span<const float> KV,
                                                                    std::span<const float> qw,
                                                                    std::span<const float> kw,
                                                                    int64_t hc, int64_t d);

// cpu::ExpF of every value, computed on the device.
[[nodiscard]] absl::StatusOr<std::vector<float>> ExpFOnDevice(std::span<const float> x);

}  // namespace kvc::cuda
