// The sampler (engine/model/generate.h) against its definition: softmax at a temperature,
// cut to the top-p nucleus, on random logits with fresh seeds.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/model/generate.h"
#include "gtest/gtest.h"
#include "tests/testing/random.h"
#include "tests/testing/seed.h"

namespace kvc::model {
namespace {

using ::kvc::testing::NormalFloats;

// The probabilities the definition gives, in double, and the nucleus: the fewest most
// likely tokens whose probability reaches top_p.
std::vector<double> Reference(const std::vector<float>& logits, double temperature, double top_p,
                              std::set<uint32_t>* nucleus) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp((logits[i] - top) / temperature);
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= sum;
  std::vector<uint32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
  double mass = 0;
  std::vector<double> q(p.size(), 0.0);
  for (uint32_t t : order) {
    if (mass >= top_p) break;
    nucleus->insert(t);
    q[t] = p[t];
    mass += p[t];
  }
  for (double& x : q) x /= mass;
  return q;
}

TEST(SamplingTest, FrequenciesFollowTheTemperedNucleus) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (const auto& [temperature, top_p] :
       std::vector<std::pair<double, double>>{{1.0, 1.0}, {0.7, 0.9}, {1.5, 0.5}}) {
    const std::vector<float> logits = NormalFloats(rng, 12, 2);
    std::set<uint32_t> nucleus;
    const std::vector<double> want = Reference(logits, temperature, top_p, &nucleus);
    Sampler s({.temperature = temperature, .top_p = top_p, .seed = rng()});
    const int draws = 40000;
    std::vector<int> count(logits.size(), 0);
    for (int i = 0; i < draws; ++i) ++count[s.Next(logits)];
    for (size_t t = 0; t < logits.size(); ++t) {
      if (!nucleus.count(t)) {
        EXPECT_EQ(count[t], 0) << "token " << t << " is outside the nucleus, T " << temperature;
        continue;
      }
      // Five standard deviations of a binomial count.
      const double sd = std::sqrt(draws * want[t] * (1 - want[t]));
      EXPECT_NEAR(count[t], draws * want[t], 5 * sd + 1)
          << "token " << t << " T " << temperature << " top-p " << top_p;
    }
  }
}

TEST(SamplingTest, SameSeedSameTokensAndSeedsDiffer) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<float> logits = NormalFloats(rng, 64);
  const uint64_t seed = rng();
  Sampler a({.temperature = 1.0, .seed = seed}), b({.temperature = 1.0, .seed = seed}),
      c({.temperature = 1.0, .seed = seed + 1});
  std::vector<uint32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.Next(logits));
    tb.push_back(b.Next(logits));
    tc.push_back(c.Next(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplingTest, GreedyAndATinyNucleusAreTheArgmax) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = NormalFloats(rng, 40, 3);
    const uint32_t best = Argmax(logits);
    EXPECT_EQ(Sampler({.temperature = 0}).Next(logits), best);
    EXPECT_EQ(Sampler({.temperature = 1.0, .top_p = 1e-9, .seed = rng()}).Next(logits), best);
  }
}

TEST(SamplingTest, BadOptionsNameTheFlag) {
  EXPECT_TRUE(CheckSampling({.temperature = 0.8, .top_p = 0.95}).ok());
  const absl::Status t = CheckSampling({.temperature = -1});
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.message().find("--temperature"), std::string::npos) << t;
  EXPECT_NE(CheckSampling({.temperature = NAN}).message().find("--temperature"), std::string::npos);
  for (double p : {0.0, 1.5, -0.1}) {
    const absl::Status s = CheckSampling({.temperature = 1, .top_p = p});
    EXPECT_NE(s.message().find("--top-p"), std::string::npos) << p << ": " << s;
  }
}

}  // namespace
}  // namespace kvc::model
