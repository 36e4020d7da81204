// The per-row kernels against their CPU twins on random inputs (fresh seeds): RMSNorm bit
// for bit (double accumulation both sides), RoPE (the CPU's cos/sin handed in), compressor
// pooling and the mHC math (shared cpu::ExpF and engine/cpu/hyper_connections.h) too.
// Skipped, saying so, where there is no GPU;
// the <test>_emu build runs the same checks on the CPU emulation of CUDA (tests/cudaemu).
#include "kernels/row_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/cpu/exp.h"
#include "engine/cpu/hyper_connections.h"
#include "engine/cpu/ops.h"
#include "engine/model/layer_ops.h"
#include "gtest/gtest.h"
#include "kernels/kv_dequant.h"
#include "tests/testing/random.h"
#include "tests/testing/seed.h"

namespace kvc::cuda {
namespace {

class RowOpsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0)
      GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  }
};

using ::kvc::testing::NormalFloats;

TEST_F(RowOpsCudaTest, RmsNormMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t rows = 33, n = 256;
  const std::vector<float> x = NormalFloats(rng, rows * n, 3.0f), w = NormalFloats(rng, n, 1.0f);
  absl::StatusOr<std::vector<float>> got = RmsNormOnDevice(x, w, 1e-6);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<float> want(x.size());
  for (int64_t r = 0; r < rows; ++r) cpu::RmsNorm(&x[r * n], w.data(), n, 1e-6, &want[r * n]);
  EXPECT_EQ(*got, want);
}

TEST_F(RowOpsCudaTest, RopeMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t rows = 20, dim = 64;
  const std::vector<double> f = cpu::RopeFrequencies(16, 160000, 1024, 4, 32, 1);
  const std::vector<float> x = NormalFloats(rng, rows * dim, 1.0f);
  std::vector<int64_t> pos(rows);
  for (int64_t& p : pos) p = static_cast<int64_t>(rng() % 100000);
  for (bool inverse : {false, true}) {
    absl::StatusOr<std::vector<float>> got = RopeOnDevice(x, dim, f, pos, inverse);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<float> want = x;
    for (int64_t r = 0; r < rows; ++r) cpu::ApplyRope(&want[r * dim], dim, f, pos[r], inverse);
    EXPECT_EQ(*got, want) << "inverse " << inverse;
    EXPECT_NE(*got, x);
  }
}

TEST_F(RowOpsCudaTest, SwapOuterAxesTransposesTheTwoOuterAxes) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t outer = 3, middle = 5, inner = 7;
  const std::vector<float> x = NormalFloats(rng, outer * middle * inner, 1.0f);
  absl::StatusOr<std::vector<float>> got = SwapOuterAxesOnDevice(x, outer, middle);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<float> want(x.size());
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t b = 0; b < middle; ++b)
      for (int64_t c = 0; c < inner; ++c)
        want[(b * outer + a) * inner + c] = x[(a * middle + b) * inner + c];
  EXPECT_EQ(*got, want);
}

// The engine's exp has the same bits on both sides: a sweep of every 1021st float (NaNs,
// infinities, subnormal results included) and random values in the softmax range.
TEST_F(RowOpsCudaTest, ExpFIsTheSameOnTheDevice) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 1021) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float v;
    std::memcpy(&v, &bits, 4);
    x.push_back(v);
  }
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<float> r = NormalFloats(rng, 1 << 20, 20.0f);
  x.insert(x.end(), r.begin(), r.end());
  absl::StatusOr<std::vector<float>> got = ExpFOnDevice(x);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = cpu::ExpF(x[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan((*got)[i])) << x[i];
    } else {
      ASSERT_EQ(std::memcmp(&(*got)[i], &want, 4), 0)
          << "exp(" << x[i] << "): " << (*got)[i] << " vs " << want;
    }
  }
}

TEST_F(RowOpsCudaTest, PoolGroupsMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t groups = 17, ratio = 2, dim = 64;
  const std::vector<float> kv = NormalFloats(rng, groups * ratio * dim, 1.0f),
                           score = NormalFloats(rng, groups * ratio * dim, 3.0f);
  absl::StatusOr<std::vector<float>> got = PoolGroupsOnDevice(kv, score, ratio, dim);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<float> want =
        model::PoolGroup(&kv[g * ratio * dim], &score[g * ratio * dim], ratio, dim);
    for (int64_t c = 0; c < dim; ++c) {
      ASSERT_EQ(std::memcmp(&(*got)[g * dim + c], &want[c], 4), 0)  // ExpF on both sides
          << "group " << g << " channel " << c << ": " << (*got)[g * dim + c] << " vs " << want[c];
    }
  }
}

// Bit for bit: the two sides share engine/cpu/hyper_connections.h. Any bit that differs
// fails (on a GPU: a library expf or a contraction by either compiler).
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
        << what << " [" << i << "]: " << got[i] << " vs " << want[i];
  }
}

TEST_F(RowOpsCudaTest, HcCoefficientsMatchTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int hc = 4, rows = 9, width = (2 + hc) * hc;
  const std::vector<float> m = NormalFloats(rng, rows * width, 1.0f),
                           base = NormalFloats(rng, width, 1.0f);
  const std::vector<float> scale = {0.7f, 1.1f, 0.9f};
  for (int iters : {1, 20}) {
    absl::StatusOr<HcOnDevice> got = HcCoefficientsOnDevice(m, base, scale, hc, iters, 1e-6f);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<float> pre, post, comb;
    for (int r = 0; r < rows; ++r) {
      const cpu::HcCoefficients want =
          cpu::HcFromMixes(std::span(m).subspan(r * width, width), base, scale, hc, iters, 1e-6);
      pre.insert(pre.end(), want.pre.begin(), want.pre.end());
      post.insert(post.end(), want.post.begin(), want.post.end());
      comb.insert(comb.end(), want.comb.begin(), want.comb.end());
    }
    ExpectSameBits(got->pre, pre, "pre");
    ExpectSameBits(got->post, post, "post");
    ExpectSameBits(got->comb, comb, "comb");
    // Sinkhorn converged: every column of comb sums to ~1 (the kernel did the iterations).
    if (iters == 20) {
      for (int k = 0; k < hc; ++k) {
        float s = 0;
        for (int j = 0; j < hc; ++j) s += got->comb[j * hc + k];
        EXPECT_NEAR(s, 1.0f, 1e-4f);
      }
    }
  }
}

// The mixes' scale, the pre-mixing and the post-mixing, as the layer loop computes them
// (engine/model/model_layers.cc): hc copies of width d per row.
TEST_F(RowOpsCudaTest, HcScalePreAndPostMatchTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t hc = 4, d = 96, rows = 5, mix = (2 + hc) * hc;
  const std::vector<float> X = NormalFloats(rng, rows * hc * d, 2.0f),
                           mixes = NormalFloats(rng, rows * mix, 30.0f),
                           a = NormalFloats(rng, rows * hc, 1.0f),
                           f = NormalFloats(rng, rows * d, 1.5f),
                           post = NormalFloats(rng, rows * hc, 1.0f),
                           comb = NormalFloats(rng, rows * hc * hc, 0.5f);

  absl::StatusOr<std::vector<float>> scaled = HcScaleMixesOnDevice(X, hc * d, mixes);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  std::vector<float> want = mixes;
  for (int64_t r = 0; r < rows; ++r) {
    const float rs = cpu::HcMixesScale(&X[r * hc * d], hc * d);
    EXPECT_NE(rs, 1.0f);
    for (int64_t j = 0; j < mix; ++j) want[r * mix + j] *= rs;
  }
  ExpectSameBits(*scaled, want, "scaled mixes");

  absl::StatusOr<std::vector<float>> pre = HcPreOnDevice(X, a, hc, d);
  ASSERT_TRUE(pre.ok()) << pre.status();
  want.assign(rows * d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) cpu::HcPre(&X[r * hc * d], &a[r * hc], hc, d, &want[r * d]);
  ExpectSameBits(*pre, want, "pre-mixing");

  // The copies' mean (what the drafter reads), into rows with a gap left untouched.
  absl::StatusOr<std::vector<float>> mean = HcMeanOnDevice(X, hc, d, /*gap=*/3);
  ASSERT_TRUE(mean.ok()) << mean.status();
  want.assign(rows * (d + 3), -1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      float m = 0.0f;  // the copies summed in order, then divided: as the layer loop did
      for (int64_t k = 0; k < hc; ++k) m += X[(r * hc + k) * d + i];
      want[r * (d + 3) + i] = m / static_cast<float>(hc);
    }
  }
  ExpectSameBits(*mean, want, "mean of the copies");

  absl::StatusOr<std::vector<float>> after = HcPostOnDevice(f, X, post, comb, hc, d);
  ASSERT_TRUE(after.ok()) << after.status();
  want.assign(rows * hc * d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::HcCoefficients c;
    c.post.assign(post.begin() + r * hc, post.begin() + (r + 1) * hc);
    c.comb.assign(comb.begin() + r * hc * hc, comb.begin() + (r + 1) * hc * hc);
    cpu::HcPost(&f[r * d], &X[r * hc * d], c, hc, d, &want[r * hc * d]);
  }
  ExpectSameBits(*after, want, "post-mixing");
  EXPECT_NE(*after, X);
}

// Engram's gating on the device against the gate written out as plain double arithmetic
// (the layer loop's formula before it moved into engine/cpu/engram.h): the same bits.
TEST_F(RowOpsCudaTest, EngramGateMatchesTheFormulaBitForBit) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const int64_t hc = 3, d = 80, rows = 4;
  const std::vector<float> X = NormalFloats(rng, rows * hc * d, 1.5f),
                           KV = NormalFloats(rng, rows * (hc + 1) * d, 1.0f),
                           qw = NormalFloats(rng, hc * d, 1.0f),
                           kw = NormalFloats(rng, hc * d, 1.0f);
  absl::StatusOr<std::vector<float>> got = EngramGateOnDevice(X, KV, qw, kw, hc, d);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<float> want = X;
  for (int64_t r = 0; r < rows; ++r) {
    const float* V = &KV[(r * (hc + 1) + hc) * d];
    for (int64_t k = 0; k < hc; ++k) {
      float* h = &want[(r * hc + k) * d];
      const float* K = &KV[(r * (hc + 1) + k) * d];
      double dot = 0, hh = 0, kk = 0;
      for (int64_t i = 0; i < d; ++i) {
        dot += static_cast<double>(h[i]) * qw[k * d + i] * kw[k * d + i] * K[i];
        hh += static_cast<double>(h[i]) * h[i];
        kk += static_cast<double>(K[i]) * K[i];
      }
      const double s = dot / std::sqrt(hh / d + 1e-20) / std::sqrt(kk / d + 1e-20) /
                       std::sqrt(static_cast<double>(d));
      const float g = cpu::SigmoidF(
          static_cast<float>((s >= 0 ? 1.0 : -1.0) * std::sqrt(std::max(std::abs(s), 1e-6))));
      for (int64_t i = 0; i < d; ++i) h[i] += g * V[i];
    }
  }
  ExpectSameBits(*got, want, "engram gate");
  EXPECT_NE(*got, X) << "seed " << seed;
  EXPECT_EQ(EngramGateOnDevice(X, KV, qw, std::span(kw).first(5), hc, d).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowOpsCudaArgsTest, BadShapesAreRefused) {
  std::vector<float> x(10), w(3);
  EXPECT_EQ(RmsNormOnDevice(x, w, 1e-6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolGroupsOnDevice(x, w, 2, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SwapOuterAxesOnDevice(x, 3, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HcScaleMixesOnDevice(x, 4, w).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HcPreOnDevice(x, w, 3, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(HcPreOnDevice(x, w, 3, 4).status().message().find("X of 10 values"), std::string::npos)
      << HcPreOnDevice(x, w, 3, 4).status();
  EXPECT_EQ(HcPostOnDevice(w, x, w, x, 3, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvc::cuda
