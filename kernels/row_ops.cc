#include "kernels/row_ops.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu/ops.h"

#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_dequant.h"
#include "kernels/row_ops_kernel.cuh"

namespace kvc::cuda {

absl::StatusOr<std::vector<float>> RmsNormOnDevice(std::span<const float> x,
                                                   std::span<const float> w, double eps) {
  const int64_t n = static_cast<int64_t>(w.size());
  if (n == 0 || x.size() % n != 0) return absl::InvalidArgumentError("rows of x must match w");
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dx(x), dw(w), out(x.size());
  CUDA_CHECK(LaunchRmsNorm(dx.get(), dw.get(), static_cast<int64_t>(x.size()) / n, n, eps,
                           out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> RopeOnDevice(std::span<const float> x, int64_t dim,
                                                std::span<const double> freqs,
                                                std::span<const int64_t> pos, bool inverse) {
  const int64_t half = static_cast<int64_t>(freqs.size()), rows = static_cast<int64_t>(pos.size());
  if (dim <= 0 || 2 * half > dim || static_cast<int64_t>(x.size()) != dim * rows) {
    return absl::InvalidArgumentError("rope: rows × dim must match the positions");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dx(x), dt(cpu::RopeTurns(freqs, pos, inverse));
  CUDA_CHECK(LaunchTurnTails(dx.get(), rows, 1, dim, dt.get(), half, nullptr));
  return dx.ToHost();
}

absl::StatusOr<std::vector<float>> SwapOuterAxesOnDevice(std::span<const float> x, int64_t outer,
                                                         int64_t middle) {
  if (outer <= 0 || middle <= 0 || x.size() % (outer * middle) != 0) {
    return absl::InvalidArgumentError("swap: x must be outer × middle × inner values");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t inner = static_cast<int64_t>(x.size()) / (outer * middle);
  DeviceBuffer<float> dx(x), out(x.size());
  CUDA_CHECK(LaunchSwapOuterAxes(dx.get(), outer, middle, inner, out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> PoolGroupsOnDevice(std::span<const float> kv,
                                                      std::span<const float> score, int64_t ratio,
                                                      int64_t dim) {
  if (ratio <= 0 || dim <= 0 || kv.size() != score.size() || kv.size() % (ratio * dim) != 0) {
    return absl::InvalidArgumentError("pool: kv and score must be whole groups of ratio × dim");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t groups = static_cast<int64_t>(kv.size()) / (ratio * dim);
  DeviceBuffer<float> dk(kv), ds(score), out(groups * dim);
  CUDA_CHECK(LaunchPoolGroups(dk.get(), ds.get(), groups, ratio, dim, out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<HcOnDevice> HcCoefficientsOnDevice(std::span<const float> mixes,
                                                  std::span<const float> base,
                                                  std::span<const float> scale, int hc, int iters,
                                                  float eps) {
  const int64_t width = static_cast<int64_t>(2 + hc) * hc;
  if (hc <= 0 || static_cast<int64_t>(base.size()) != width || scale.size() != 3 ||
      mixes.size() % width != 0) {
    return absl::InvalidArgumentError(
        "hc: mixes must be rows of (2+hc)·hc, base (2+hc)·hc, scale 3");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(mixes.size()) / width;
  DeviceBuffer<float> dm(mixes), db(base), dsc(scale), pre(rows * hc), post(rows * hc),
      comb(rows * hc * hc);
  CUDA_CHECK(LaunchHcCoefficients(dm.get(), db.get(), dsc.get(), rows, hc, iters, eps, pre.get(),
                                  post.get(), comb.get(), nullptr));
  return HcOnDevice{pre.ToHost(), post.ToHost(), comb.ToHost()};
}

absl::StatusOr<std::vector<float>> HcScaleMixesOnDevice(std::span<const float> x, int64_t n,
                                                        std::span<const float> mixes) {
  if (n <= 0 || x.size() % n != 0 || x.empty() || mixes.size() % (x.size() / n) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hc scale: x of ", x.size(),
                                                   " values is not rows of n = ", n,
                                                   " matched by the ", mixes.size(), " mixes"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  DeviceBuffer<float> dx(x), dm(mixes);
  CUDA_CHECK(LaunchHcScaleMixes(dx.get(), rows, n, dm.get(),
                                static_cast<int64_t>(mixes.size()) / rows, nullptr));
  return dm.ToHost();
}

absl::StatusOr<std::vector<float>> HcPreOnDevice(std::span<const float> X, std::span<const float> a,
                                                 int64_t hc, int64_t d) {
  if (hc <= 0 || d <= 0 || a.size() % hc != 0 || X.size() != a.size() * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("hc pre: X of ", X.size(), " values and a of ", a.size(),
                     " are not rows of hc × d and hc (hc = ", hc, ", d = ", d, ")"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(a.size()) / hc;
  DeviceBuffer<float> dX(X), da(a), out(rows * d);
  CUDA_CHECK(LaunchHcPre(dX.get(), da.get(), rows, hc, d, out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> HcMeanOnDevice(std::span<const float> X, int64_t hc, int64_t d,
                                                  int64_t gap) {
  if (hc <= 0 || d <= 0 || gap < 0 || X.size() % (hc * d) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hc mean: X of ", X.size(),
                                                   " values is not rows of hc × d (hc = ", hc,
                                                   ", d = ", d, "), or a gap of ", gap));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(X.size()) / (hc * d);
  const std::vector<float> filler(static_cast<size_t>(rows * (d + gap)), -1.0f);
  DeviceBuffer<float> dX(X), out{std::span<const float>(filler)};
  CUDA_CHECK(LaunchHcMean(dX.get(), rows, hc, d, out.get(), d + gap, nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> HcPostOnDevice(std::span<const float> f,
                                                  std::span<const float> R,
                                                  std::span<const float> post,
                                                  std::span<const float> comb, int64_t hc,
                                                  int64_t d) {
  if (hc <= 0 || d <= 0 || post.size() % hc != 0 || f.size() * hc != R.size() ||
      f.size() != post.size() / hc * d || comb.size() != post.size() * hc) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hc post: f of ", f.size(), ", R of ", R.size(), ", post of ", post.size(), ", comb of ",
        comb.size(), " values are not rows of d, hc × d, hc, hc × hc (hc = ", hc, ", d = ", d,
        ")"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(post.size()) / hc;
  DeviceBuffer<float> df(f), dR(R), dp(post), dc(comb), out(R.size());
  CUDA_CHECK(LaunchHcPost(df.get(), dR.get(), dp.get(), dc.get(), rows, hc, d, out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> EngramGateOnDevice(std::span<const float> X,
                                                      std::span<const float> KV,
                                                      std::span<const float> qw,
                                                      std::span<const float> kw, int64_t hc,
                                                      int64_t d) {
  const int64_t n = hc * d;
  if (hc <= 0 || d <= 0 || X.size() % n != 0 || KV.size() / (n + d) != X.size() / n ||
      KV.size() % (n + d) != 0 || static_cast<int64_t>(qw.size()) != n ||
      static_cast<int64_t>(kw.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram gate: X of ", X.size(), ", KV of ", KV.size(), ", qw of ", qw.size(),
                     ", kw of ", kw.size(), " values are not rows of hc × d, (hc + 1) × d and ",
                     "hc × d each (hc = ", hc, ", d = ", d, ")"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t rows = static_cast<int64_t>(X.size()) / n;
  DeviceBuffer<float> dX(X), dKV(KV), dq(qw), dk(kw);
  CUDA_CHECK(LaunchEngramGate(dX.get(), dKV.get(), dq.get(), dk.get(), rows, hc, d, nullptr));
  return dX.ToHost();
}

absl::StatusOr<std::vector<float>> ExpFOnDevice(std::span<const float> x) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dx(x), out(x.size());
  CUDA_CHECK(LaunchExpF(dx.get(), static_cast<int64_t>(x.size()), out.get(), nullptr));
  return out.ToHost();
}

}  // namespace kvc::cuda
