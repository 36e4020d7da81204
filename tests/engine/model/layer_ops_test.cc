// The model's per-token ops against naive references in double precision (or 128-bit
// integers for the hashes), on random inputs with fresh seeds.
#include "engine/model/layer_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "absl/numeric/int128.h"
#include "engine/cpu/gemm.h"
#include "gtest/gtest.h"
#include "tests/testing/random.h"
#include "tests/testing/seed.h"

namespace kvc::model {
namespace {

using ::kvc::testing::NormalFloats;

TEST(LayerOpsTest, PoolGroupIsAPerChannelSoftmaxWeightedSum) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int64_t ratio : {1, 2, 4}) {
    const int64_t dim = 64;
    const std::vector<float> kv = NormalFloats(rng, ratio * dim),
                             score = NormalFloats(rng, ratio * dim, 3);
    const std::vector<float> got = PoolGroup(kv.data(), score.data(), ratio, dim);
    for (int64_t ch = 0; ch < dim; ++ch) {
      double den = 0, num = 0;
      for (int64_t t = 0; t < ratio; ++t) den += std::exp(static_cast<double>(score[t * dim + ch]));
      for (int64_t t = 0; t < ratio; ++t)
        num += kv[t * dim + ch] * std::exp(static_cast<double>(score[t * dim + ch])) / den;
      EXPECT_NEAR(got[ch], num, 1e-5 * (1 + std::abs(num))) << "ratio " << ratio;
    }
  }
}

TEST(LayerOpsTest, AttendHeadMatchesSoftmaxWithASinkInTheDenominator) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int n : {1, 5, 24}) {
    const int64_t dim = 64;
    const std::vector<float> q = NormalFloats(rng, dim), k = NormalFloats(rng, n * dim);
    std::vector<const float*> keys;
    for (int t = 0; t < n; ++t) keys.push_back(&k[t * dim]);
    const float sink = NormalFloats(rng, 1)[0], scale = 0.125f;
    std::vector<float> o(dim);
    AttendHead(q.data(), keys, dim, sink, scale, o.data());
    std::vector<double> s(n);
    double den = std::exp(static_cast<double>(sink));
    for (int t = 0; t < n; ++t) {
      for (int64_t e = 0; e < dim; ++e) s[t] += static_cast<double>(q[e]) * k[t * dim + e];
      s[t] = std::exp(s[t] * scale);
      den += s[t];
    }
    for (int64_t e = 0; e < dim; ++e) {
      double ref = 0;
      for (int t = 0; t < n; ++t) ref += s[t] * k[t * dim + e] / den;
      EXPECT_NEAR(o[e], ref, 1e-5 * (1 + std::abs(ref))) << n << " keys";
    }
  }
  std::vector<float> o(8, 1.0f), q(8, 1.0f);
  AttendHead(q.data(), {}, 8, 0.0f, 1.0f, o.data());
  EXPECT_EQ(o, std::vector<float>(8, 0.0f)) << "no visible key: zero output";
}

TEST(LayerOpsTest, AttendHeadsVectorPathIsBitIdenticalToThePortableOne) {
  if (!cpu::Avx2FmaInUse()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  std::mt19937_64 rng(testing::FreshSeed());
  for (int64_t dim : {64, 128, 40, 13}) {
    for (int n : {1, 7, 8, 9, 31, 192}) {
      const std::vector<float> q = NormalFloats(rng, dim), k = NormalFloats(rng, n * dim);
      std::vector<const float*> keys;
      for (int t = 0; t < n; ++t) keys.push_back(&k[(n - 1 - t) * dim]);  // any order
      const float sink = NormalFloats(rng, 1)[0];
      std::vector<float> fast(dim), slow(dim);
      AttendHead(q.data(), keys, dim, sink, 0.125f, fast.data());
      cpu::UsePortableKernels(true);
      AttendHead(q.data(), keys, dim, sink, 0.125f, slow.data());
      cpu::UsePortableKernels(false);
      for (int64_t e = 0; e < dim; ++e)
        ASSERT_EQ(std::bit_cast<uint32_t>(fast[e]), std::bit_cast<uint32_t>(slow[e]))
            << "dim " << dim << ", " << n << " keys, element " << e;
    }
  }
}

// The heads of one query share the keys (MQA): AttendHeads — the vector path scores them
// together, eight keys transposed at a time — gives each head the bits AttendHead's portable
// path gives it alone, for any head count (groups of four and a remainder), dim (a multiple
// of eight or not) and key count.
TEST(LayerOpsTest, AttendHeadsTogetherIsBitIdenticalToEachHeadAlone) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int64_t heads : {1, 3, 4, 5, 9}) {
    for (int64_t dim : {64, 40, 13, 8, 3}) {
      for (int n : {0, 1, 8, 9, 31, 100}) {
        const std::vector<float> q = NormalFloats(rng, heads * dim), k = NormalFloats(rng, n * dim),
                                 sinks = NormalFloats(rng, heads);
        std::vector<const float*> keys;
        for (int t = 0; t < n; ++t) keys.push_back(&k[((t * 7) % n) * dim]);  // any order
        std::vector<float> together(heads * dim, 1.0f), alone(heads * dim, 2.0f);
        AttendHeads(q.data(), heads, keys, dim, sinks.data(), 0.125f, together.data());
        cpu::UsePortableKernels(true);
        for (int64_t h = 0; h < heads; ++h)
          AttendHead(&q[h * dim], keys, dim, sinks[h], 0.125f, &alone[h * dim]);
        cpu::UsePortableKernels(false);
        for (int64_t i = 0; i < heads * dim; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(together[i]), std::bit_cast<uint32_t>(alone[i]))
              << heads << " heads, dim " << dim << ", " << n << " keys, element " << i;
      }
    }
  }
}

TEST(LayerOpsTest, CandidateMaskKeepsTheBestBlocksAndTheNewest) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t cl = 1 + static_cast<int64_t>(rng() % 90), block = 1 + rng() % 8,
                  topk = 1 + rng() % 6;
    std::vector<float> scores = NormalFloats(rng, cl);
    for (float& v : scores) v = std::round(v * 2) / 2;  // ties between blocks
    const std::vector<uint8_t> mask = CandidateMask(scores, block, topk);
    // Reference: rank blocks by (newest first, then best score, then lower index).
    const int64_t nb = (cl + block - 1) / block;
    std::vector<int64_t> order(nb);
    std::iota(order.begin(), order.end(), 0);
    auto best = [&](int64_t b) {
      double m = -1e300;
      for (int64_t t = b * block; t < std::min(cl, (b + 1) * block); ++t)
        m = std::max<double>(m, scores[t]);
      return b == nb - 1 ? 1e300 : m;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return best(x) > best(y); });
    order.resize(std::min(nb, topk));
    for (int64_t t = 0; t < cl; ++t) {
      const bool kept = std::find(order.begin(), order.end(), t / block) != order.end();
      ASSERT_EQ(mask[t], kept ? 1 : 0) << "cl " << cl << " block " << block << " topk " << topk;
    }
  }
}

TEST(LayerOpsTest, RouteTokenPicksTheBiasedTopKAndNormalizesUnbiasedScores) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t n = 8 + rng() % 60, k = 1 + rng() % 6;
    const std::vector<float> logits = NormalFloats(rng, n, 2), bias = NormalFloats(rng, n, 0.3f);
    const auto got = RouteToken(logits, bias, k, true, 1.5f);
    std::vector<double> score(n);
    for (int64_t e = 0; e < n; ++e)
      score[e] = std::sqrt(std::log1p(std::exp(static_cast<double>(logits[e]))));
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return score[a] + bias[a] > score[b] + bias[b]; });
    order.resize(k);
    std::sort(order.begin(), order.end());
    double sum = 0;
    for (int64_t e : order) sum += score[e];
    ASSERT_EQ(got.size(), static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(got[i].first, order[i]);
      EXPECT_NEAR(got[i].second, score[order[i]] / sum * 1.5, 1e-5);
    }
  }
}

TEST(LayerOpsTest, EngramRowsFollowTheReferenceHash) {
  std::mt19937_64 rng(testing::FreshSeed());
  // The reference config's layer-1 multipliers (published vectors) and a few primes.
  const std::vector<int64_t> mult = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
  const std::vector<int64_t> primes = {16000057, 16000079, 16000081, 16000097, 16000111, 16000123};
  std::vector<int64_t> offsets(primes.size());
  for (size_t i = 1; i < primes.size(); ++i) offsets[i] = offsets[i - 1] + primes[i - 1];
  std::vector<uint32_t> tokens(40);
  for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % 129280);
  for (int64_t pos : {0, 1, 2, 3, 17, 39}) {
    const std::vector<int64_t> got = EngramRows(tokens, pos, mult, primes, offsets, 2, 2, 99092);
    ASSERT_EQ(got.size(), 6u);
    // Reference: 128-bit products truncated to int64 (numpy's wrapping), floor modulo.
    int64_t h = 0;
    for (int k = 0; k < 4; ++k) {
      const int64_t tok = (pos >= k ? tokens[pos - k] : 2) % 99092;
      const int64_t term =
          static_cast<int64_t>(absl::Int128Low64(absl::int128(tok) * absl::int128(mult[k])));
      h = k == 0 ? term : (h ^ term);
      if (k == 0) continue;
      for (int j = 0; j < 2; ++j) {
        const int slot = (k - 1) * 2 + j;
        const int64_t p = primes[slot];
        const int64_t m = ((h % p) + p) % p;
        EXPECT_EQ(got[slot], m + offsets[slot]) << "pos " << pos << " order " << k + 1;
      }
    }
  }
}

}  // namespace
}  // namespace kvc::model
