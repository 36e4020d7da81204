// DeviceMatmul (kernels/device_matmul.h) against the CPU, on random inputs (fresh seeds):
// the device GEMM equals the CPU GEMM bit for bit for odd shapes; groups of products with
// chained, pooled and finished results are the CPU backend's bits and the steps written
// out; the experts, the routed MoE block and the MoE sublayer after attention (on into the
// next layer's input, with another MoE call while its results are in flight) are the
// host's bits. Skipped, saying so, where there is no GPU; the
// <test>_emu build runs the same checks on the CPU emulation of CUDA (tests/cudaemu).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/cpu/engram.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/hyper_connections.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/swiglu.h"
#include "engine/model/layer_ops.h"
#include "engine/model/matmul.h"
#include "engine/spec/kv_codec.h"
#include "gtest/gtest.h"
#include "kernels/cuda_matmul.h"
#include "kernels/device_matmul.h"
#include "kernels/kv_dequant.h"
#include "tests/testing/random.h"
#include "tests/testing/same_bits.h"
#include "tests/testing/seed.h"
#if defined(KVC_CUDA_EMULATED)
#include "cudaemu/runtime.h"
#endif

namespace kvc::cuda {
namespace {

using ::kvc::testing::NormalFloats;
using ::kvc::testing::SameBits;

TEST(CudaGemmTest, RefusesInputOfTheWrongSize) {
  const cpu::PackedMatrix w(std::vector<float>(6, 1.0f), 2, 3);
  absl::StatusOr<std::vector<float>> y = GemmOnDevice(std::vector<float>(5, 1.0f), 2, w);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << y.status();
}

TEST(CudaGemmTest, EqualsTheCpuGemmBitForBit) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  // Shapes around the device tiles (32 × 64, depth 32) and the CPU panels (16).
  for (int64_t m : {1, 3, 33, 130}) {
    for (int64_t k : {1, 31, 32, 100}) {
      for (int64_t n : {1, 15, 17, 64, 200}) {
        const std::vector<float> x = NormalFloats(rng, m * k);
        const cpu::PackedMatrix w(NormalFloats(rng, n * k), n, k);
        std::vector<float> want(m * n);
        cpu::Gemm(x.data(), m, w, want.data());
        absl::StatusOr<std::vector<float>> got = GemmOnDevice(x, m, w);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(SameBits(*got, want)) << m << " × " << k << " · " << n;
      }
    }
  }
}

// A group whose later products take an earlier result RMS-normalized (the query path:
// q_a, then q_b and the indexer's q from the normalized low-rank query): the CPU backend's
// bits, with the normalization done once on the device for both chained products.
TEST(CudaGemmTest, ChainedProductsInAGroupAreTheCpusBits) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t m = 5, in = 48, mid = 40, out_b = 24, out_c = 33;
  const std::vector<float> x = NormalFloats(rng, m * in), norm = NormalFloats(rng, mid);
  const cpu::PackedMatrix wa(NormalFloats(rng, mid * in), mid, in),
      wb(NormalFloats(rng, out_b * mid), out_b, mid),
      wc(NormalFloats(rng, out_c * mid), out_c, mid), wd(NormalFloats(rng, 7 * in), 7, in);
  auto run = [&](const model::MatmulBackend& mm) {
    std::vector<float> a(m * mid), b(m * out_b), c(m * out_c), d(m * 7);
    const std::vector<model::GemmCall> calls = {{x.data(), m, &wa, a.data()},
                                                {nullptr, m, &wb, b.data(), 0, norm.data(), 1e-6},
                                                {x.data(), m, &wd, d.data()},
                                                {nullptr, m, &wc, c.data(), 0, norm.data(), 1e-6}};
    mm.GemmGroup(calls);
    std::vector<float> all = a;
    for (const std::vector<float>* v : {&b, &c, &d}) all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (const cpu::PackedMatrix* w : {&wa, &wb, &wc}) (*gpu)->Register(*w);  // wd: transient
  const std::vector<float> want = run(*model::MakeCpuMatmul());
  EXPECT_TRUE(SameBits(run(**gpu), want));
  // The chain is really normalized: without the norm the results differ.
  std::vector<float> a(m * mid), plain(m * out_b);
  cpu::Gemm(x.data(), m, wa, a.data());
  cpu::Gemm(a.data(), m, wb, plain.data());
  EXPECT_NE(std::memcmp(plain.data(), want.data() + m * mid, plain.size() * sizeof(float)), 0);
}

// A pooled chained input (the index keys of the compressor's entries that complete in the
// group): pending rows from the host, then this group's kv and score rows, pooled per group
// of `ratio` rows and normalized — the CPU backend's result is the steps written out
// (model::PoolGroup, cpu::RmsNorm, cpu::Gemm), and the device's is the CPU backend's bits.
TEST(CudaGemmTest, APooledChainedInputIsTheCompressorsSteps) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t in = 40, k = 24, out = 17, rows = 7, ratio = 4;
  const std::vector<float> x = NormalFloats(rng, rows * in), norm = NormalFloats(rng, k);
  const cpu::PackedMatrix wkv(NormalFloats(rng, k * in), k, in),
      wgate(NormalFloats(rng, k * in), k, in), wk(NormalFloats(rng, out * k), out, k);
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (const cpu::PackedMatrix* w : {&wkv, &wgate, &wk}) (*gpu)->Register(*w);
  for (int64_t pending : {0, 1, 3}) {
    const int64_t groups = (pending + rows) / ratio;
    const std::vector<float> pend_kv = NormalFloats(rng, pending * k),
                             pend_score = NormalFloats(rng, pending * k);
    auto run = [&](const model::MatmulBackend& mm) {
      std::vector<float> kv(rows * k), score(rows * k), keys(groups * out);
      model::GemmCall pooled{nullptr, groups, &wk, keys.data(), 0, norm.data(), 1e-6};
      pooled.pool_ratio = ratio;
      pooled.pool_pending = pending;
      pooled.score_of = 1;
      pooled.pool_kv = pend_kv.data();
      pooled.pool_score = pend_score.data();
      const std::vector<model::GemmCall> calls = {
          {x.data(), rows, &wkv, kv.data()}, {x.data(), rows, &wgate, score.data()}, pooled};
      mm.GemmGroup(calls);
      return keys;
    };
    // The steps one by one, as Compress and EmitEntries take them.
    std::vector<float> kv(rows * k), score(rows * k), latents(groups * k), want(groups * out);
    cpu::Gemm(x.data(), rows, wkv, kv.data());
    cpu::Gemm(x.data(), rows, wgate, score.data());
    std::vector<float> all_kv = pend_kv, all_score = pend_score;
    all_kv.insert(all_kv.end(), kv.begin(), kv.end());
    all_score.insert(all_score.end(), score.begin(), score.end());
    for (int64_t g = 0; g < groups; ++g) {
      const std::vector<float> l =
          model::PoolGroup(&all_kv[g * ratio * k], &all_score[g * ratio * k], ratio, k);
      cpu::RmsNorm(l.data(), norm.data(), k, 1e-6, &latents[g * k]);
    }
    cpu::Gemm(latents.data(), groups, wk, want.data());
    EXPECT_TRUE(SameBits(run(*model::MakeCpuMatmul()), want)) << pending << " pending, cpu";
    EXPECT_TRUE(SameBits(run(**gpu), want)) << pending << " pending, device";
  }
}

// Results finished where they are (model::RowFinish): a window-like row normalized,
// turned and rounded to FP8, and the same product normalized and turned only (nothing
// rounds a difference away); a chained multi-head result turned and rounded to the index
// FP4; a product chained on a finished result (it reads the finished rows). The CPU
// backend's results are the steps written out (cpu::Gemm, cpu::RmsNorm, cpu::ApplyRope,
// FakeQuantize), and the device's are the CPU backend's bits.
TEST(CudaGemmTest, FinishedResultsAreTheCpusStepsBitForBit) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t in = 40, lo = 24, rows = 5, heads = 4, dim = 32, first = 1000 + rng() % 5000;
  const std::vector<float> x = NormalFloats(rng, rows * in), norm = NormalFloats(rng, dim),
                           lo_norm = NormalFloats(rng, lo), kv_norm = NormalFloats(rng, dim);
  const std::vector<double> freqs = cpu::RopeFrequencies(16, 10000, 0, 1, 32, 1);
  const cpu::PackedMatrix w_lo(NormalFloats(rng, lo * in), lo, in),
      w_kv(NormalFloats(rng, dim * in), dim, in),
      w_heads(NormalFloats(rng, heads * dim * lo), heads * dim, lo),
      w_on_kv(NormalFloats(rng, 9 * dim), 9, dim);
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (const cpu::PackedMatrix* w : {&w_lo, &w_kv, &w_heads, &w_on_kv}) (*gpu)->Register(*w);
  const model::RowFinish kv_finish{.norm = norm.data(),
                                   .eps = 1e-6,
                                   .rope_freqs = &freqs,
                                   .first_position = first,
                                   .round = KvFormat::kSwaKv};
  const model::RowFinish plain_finish{.norm = norm.data(),
                                      .eps = 1e-6,
                                      .rope_freqs = &freqs,
                                      .first_position = first,
                                      .round = std::nullopt};
  const model::RowFinish heads_finish{
      .heads = heads, .rope_freqs = &freqs, .first_position = first, .round = KvFormat::kIndexK};
  auto run = [&](const model::MatmulBackend& mm) {
    std::vector<float> lo_y(rows * lo), kv(rows * dim), qh(rows * heads * dim), on_kv(rows * 9),
        plain(rows * dim);
    std::vector<model::GemmCall> calls = {
        {x.data(), rows, &w_lo, lo_y.data()},
        {x.data(), rows, &w_kv, kv.data()},
        {nullptr, rows, &w_heads, qh.data(), /*input_of=*/0, lo_norm.data(), 1e-6},
        {nullptr, rows, &w_on_kv, on_kv.data(), /*input_of=*/1, kv_norm.data(), 1e-6},
        {x.data(), rows, &w_kv, plain.data()}};
    calls[1].finish = &kv_finish;
    calls[2].finish = &heads_finish;
    calls[4].finish = &plain_finish;
    mm.GemmGroup(calls);
    return std::vector<std::vector<float>>{kv, qh, on_kv, plain};
  };
  // The steps one by one.
  std::vector<float> lo_y(rows * lo), kv(rows * dim), lo_n(rows * lo), qh(rows * heads * dim),
      kv_n(rows * dim), on_kv(rows * 9);
  cpu::Gemm(x.data(), rows, w_lo, lo_y.data());
  cpu::Gemm(x.data(), rows, w_kv, kv.data());
  std::vector<float> plain = kv;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::RmsNorm(&plain[r * dim], norm.data(), dim, 1e-6, &plain[r * dim]);
    cpu::ApplyRope(&plain[r * dim], dim, freqs, first + r);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* k = &kv[r * dim];
    cpu::RmsNorm(k, norm.data(), dim, 1e-6, k);
    cpu::ApplyRope(k, dim, freqs, first + r);
    FakeQuantize(KvFormat::kSwaKv, std::span<float>(k, dim));
    cpu::RmsNorm(k, kv_norm.data(), dim, 1e-6, &kv_n[r * dim]);
    cpu::RmsNorm(&lo_y[r * lo], lo_norm.data(), lo, 1e-6, &lo_n[r * lo]);
  }
  cpu::Gemm(lo_n.data(), rows, w_heads, qh.data());
  for (int64_t v = 0; v < rows * heads; ++v) {
    cpu::ApplyRope(&qh[v * dim], dim, freqs, first + v / heads);
    FakeQuantize(KvFormat::kIndexK, std::span<float>(&qh[v * dim], dim));
  }
  cpu::Gemm(kv_n.data(), rows, w_on_kv, on_kv.data());
  const std::vector<std::vector<float>> want = {kv, qh, on_kv, plain};
  const std::unique_ptr<model::MatmulBackend> host = model::MakeCpuMatmul();
  for (const auto& [name, mm] : {std::pair{"cpu", host.get()}, std::pair{"device", gpu->get()}}) {
    const std::vector<std::vector<float>> got = run(*mm);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(SameBits(got[i], want[i])) << name << ", result " << i;
  }
}

// A MoE block's experts on the device (gather, gate and up products, SwiGlu, down products,
// the sum into each row in job order) against the host's: the same bits. Routed experts
// take random rows with random weights, the shared one every row; the limit is small, so
// the activation's min and clamp both act. The second case has more rows than one group of
// jobs holds (model::kExpertGroupRows), so the sums span groups.
TEST(CudaGemmTest, ExpertsOnTheDeviceAreTheHostsBits) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  struct Case {
    int64_t rows, D, I, experts;
  };
  for (const Case& k : {Case{9, 24, 20, 5}, Case{3000, 8, 6, 4}}) {
    std::vector<cpu::PackedMatrix> w;
    for (int64_t e = 0; e <= k.experts; ++e) {  // the last is the shared expert
      w.emplace_back(NormalFloats(rng, k.I * k.D), k.I, k.D);
      w.emplace_back(NormalFloats(rng, k.I * k.D), k.I, k.D);
      w.emplace_back(NormalFloats(rng, k.D * k.I), k.D, k.I);
    }
    std::vector<model::ExpertJob> jobs;
    std::bernoulli_distribution takes(0.6);
    std::uniform_real_distribution<float> weight(0.1f, 2.0f);
    for (int64_t e = 0; e <= k.experts; ++e) {
      model::ExpertJob j{&w[3 * e], &w[3 * e + 1], &w[3 * e + 2], {}, {}};
      for (int64_t r = 0; e < k.experts && r < k.rows; ++r) {
        if (!takes(rng)) continue;
        j.rows.push_back(r);
        j.weights.push_back(weight(rng));
      }
      if (e == k.experts || !j.rows.empty()) jobs.push_back(std::move(j));
    }
    const std::vector<float> x = NormalFloats(rng, k.rows * k.D);
    const float limit = 1.5f;
    std::vector<float> want(k.rows * k.D, NAN), got(k.rows * k.D, NAN);
    model::MakeCpuMatmul()->Experts(x.data(), k.rows, jobs, limit, want.data());
    absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (const cpu::PackedMatrix& m : w) (*gpu)->Register(m);
    (*gpu)->Experts(x.data(), k.rows, jobs, limit, got.data());
    EXPECT_TRUE(SameBits(got, want)) << k.rows << " rows, seed " << seed;
    EXPECT_FALSE(std::isnan(want[0]));
  }
}

// A MoE block on the host: the gate, model::RouteToken, then the experts in job order.
std::vector<float> HostMoe(const model::MoeBlock& block, const std::vector<float>& x,
                           int64_t rows) {
  const int64_t E = static_cast<int64_t>(block.w1.size()) - 1, D = block.gate->in_features();
  const std::unique_ptr<model::MatmulBackend> cpu = model::MakeCpuMatmul();
  std::vector<float> logits(rows * E), out(rows * D, NAN);
  cpu->Gemm(x.data(), rows, *block.gate, logits.data());
  std::vector<model::ExpertJob> jobs(E);
  for (int64_t r = 0; r < rows; ++r) {
    for (const auto& [e, weight] :
         model::RouteToken(std::span(logits).subspan(r * E, E), block.gate_bias, block.top_k,
                           block.normalize, block.routed_scale)) {
      jobs[e].rows.push_back(r);
      jobs[e].weights.push_back(weight);
    }
  }
  for (int64_t e = 0; e < E; ++e)
    jobs[e] = {block.w1[e], block.w3[e], block.w2[e], jobs[e].rows, jobs[e].weights};
  std::erase_if(jobs, [](const model::ExpertJob& j) { return j.rows.empty(); });
  jobs.push_back({block.w1[E], block.w3[E], block.w2[E], {}, {}});
  cpu->Experts(x.data(), rows, jobs, block.limit, out.data());
  return out;
}

// The whole MoE block on the device (gate, router, slots, the experts' products picking
// their weights per slot, SwiGlu, the sum) against routing on the host (model::RouteToken)
// and the host's experts: the same bits, for 1 to 5 rows; a product issued alongside
// (`also`) comes back too. Biases spread over the scores' range make the picks depend on
// them; some logits are equal, so ties between experts happen.
TEST(CudaGemmTest, RoutedMoeOnTheDeviceIsTheHostsBits) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const int64_t D = 24, I = 20, E = 7, k = 3, mix_out = 5;
  std::vector<cpu::PackedMatrix> w;
  for (int64_t e = 0; e <= E; ++e) {
    w.emplace_back(NormalFloats(rng, I * D), I, D);
    w.emplace_back(NormalFloats(rng, I * D), I, D);
    w.emplace_back(NormalFloats(rng, D * I), D, I);
  }
  std::vector<float> gate_w = NormalFloats(rng, E * D);
  std::copy(gate_w.begin(), gate_w.begin() + D, gate_w.begin() + D);  // experts 0 and 1 tie
  const cpu::PackedMatrix gate(gate_w, E, D), mix(NormalFloats(rng, mix_out * D), mix_out, D);
  std::vector<float> bias = NormalFloats(rng, E);
  bias[1] = bias[0];
  for (const bool normalize : {true, false}) {
    model::MoeBlock block{&gate, bias, {}, {}, {}, k, normalize, 2.5f, 1.5f};
    for (int64_t e = 0; e <= E; ++e) {
      block.w1.push_back(&w[3 * e]);
      block.w3.push_back(&w[3 * e + 1]);
      block.w2.push_back(&w[3 * e + 2]);
    }
    // Up to 5 rows; then enough that an expert's slots fill more than one of the slot
    // products' tiles (32 slots) and end inside one.
    for (int64_t rows : {1, 2, 3, 4, 5, 40, 150}) {
      const std::vector<float> x = NormalFloats(rng, rows * D);
      const std::vector<float> want = HostMoe(block, x, rows);
      std::vector<float> want_mix(rows * mix_out);
      model::MakeCpuMatmul()->Gemm(x.data(), rows, mix, want_mix.data());
      // The device, routing included, with the mixes product alongside.
      absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      for (const cpu::PackedMatrix& m : w) (*gpu)->Register(m);
      (*gpu)->Register(gate);
      (*gpu)->Register(mix);
      std::vector<float> got(rows * D, NAN), got_mix(rows * mix_out, NAN);
      const model::GemmCall also{x.data(), rows, &mix, got_mix.data()};
      ASSERT_TRUE((*gpu)->RoutedMoe(x.data(), rows, block, std::span(&also, 1), got.data()));
      EXPECT_TRUE(SameBits(got, want))
          << rows << " rows, normalize " << normalize << ", seed " << seed;
      EXPECT_TRUE(SameBits(got_mix, want_mix));
    }
    // Past the batch the device routes, or with a weight it does not hold, the backend
    // declines and the model routes on the host.
    absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    constexpr int64_t kPast = DeviceMatmul::kRoutedMoeRows + 1;
    std::vector<float> out(kPast * D);
    const std::vector<float> x = NormalFloats(rng, kPast * D);
    EXPECT_FALSE((*gpu)->RoutedMoe(x.data(), 1, block, {}, out.data()));  // nothing registered
    for (const cpu::PackedMatrix& m : w) (*gpu)->Register(m);
    (*gpu)->Register(gate);
    EXPECT_FALSE((*gpu)->RoutedMoe(x.data(), kPast, block, {}, out.data()));
    EXPECT_FALSE(model::MakeCpuMatmul()->RoutedMoe(x.data(), 1, block, {}, out.data()));
  }
}

// The MoE sublayer after attention on the device (DeviceProducts::MoeSublayerAfter):
// attention's output f, already on the device, goes into the stream by the mHC
// post-mixing, the block's input is the pre-mixing RMS-normalized, the next mixes' product
// rides along, then the routed block — against each step on the host: the same bits for
// the stream, the mixes and the block's output, for 1 to 4 rows; and on into the next
// layer's input (its Engram gated in), read by a later product where it is. Coefficients
// are random positive values (the math does not care where they came from).
// A MoE sublayer's weights (random): the routed block of E experts and the shared one, the
// mixes' product fn, the norms and the mHC constants.
struct SublayerWeights {
  static constexpr int64_t D = 16, I = 12, E = 6, k = 2, hc = 3, mix = (2 + hc) * hc;
  explicit SublayerWeights(std::mt19937_64& rng)
      : gate(NormalFloats(rng, E * D), E, D),
        fn(NormalFloats(rng, mix * hc * D), mix, hc * D),
        bias(NormalFloats(rng, E)),
        norm(NormalFloats(rng, D)),
        norm2(NormalFloats(rng, D)),
        base(NormalFloats(rng, mix)),
        scale(NormalFloats(rng, 3)),
        qw(NormalFloats(rng, hc * D)),
        kw(NormalFloats(rng, hc * D)) {
    for (int64_t e = 0; e <= E; ++e) {
      w.emplace_back(NormalFloats(rng, I * D), I, D);
      w.emplace_back(NormalFloats(rng, I * D), I, D);
      w.emplace_back(NormalFloats(rng, D * I), D, I);
    }
    block = {&gate, bias, {}, {}, {}, k, true, 1.5f, 2.0f};
    for (int64_t e = 0; e <= E; ++e) {
      block.w1.push_back(&w[3 * e]);
      block.w3.push_back(&w[3 * e + 1]);
      block.w2.push_back(&w[3 * e + 2]);
    }
  }
  void RegisterWith(model::MatmulBackend& mm) const {
    for (const cpu::PackedMatrix& m : w) mm.Register(m);
    mm.Register(gate);
    mm.Register(fn);
  }
  std::vector<cpu::PackedMatrix> w;
  const cpu::PackedMatrix gate, fn;
  const std::vector<float> bias, norm, norm2, base, scale, qw, kw;
  model::MoeBlock block;
};

// Attention's output f on the device, uploaded on a stream of its own and handed over with
// an event (as the attention backend does).
class HandedOver {
 public:
  explicit HandedOver(const std::vector<float>& f) {
    EXPECT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&ready_), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&read_), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_f_), f.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(
        cudaMemcpyAsync(d_f_, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
        cudaSuccess);
  }
  ~HandedOver() {
    EXPECT_EQ(cudaStreamWaitEvent(stream_, read_, 0), cudaSuccess);  // d_f free again
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    cudaFree(d_f_);
    cudaEventDestroy(read_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  void Sublayer(const DeviceProducts& products, int64_t rows, const model::MoeSublayer& s) const {
    EXPECT_EQ(cudaEventRecord(ready_, stream_), cudaSuccess);
    products.MoeSublayerAfter(d_f_, ready_, read_, rows, s);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, read_ = nullptr;
  float* d_f_ = nullptr;
};

TEST(CudaGemmTest, MoeSublayerOnTheDeviceIsTheHostsSteps) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const SublayerWeights sw(rng);
  constexpr int64_t D = SublayerWeights::D, E = SublayerWeights::E, hc = SublayerWeights::hc,
                    mix = SublayerWeights::mix;
  const auto& [w, gate, fn, bias, norm, norm2, base, scale, qw, kw, block] = sw;
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const auto* products = dynamic_cast<const DeviceProducts*>(gpu->get());
  ASSERT_NE(products, nullptr);
  auto positive = [&](int64_t n) {
    std::vector<float> v = NormalFloats(rng, n);
    for (float& x : v) x = std::abs(x) + 0.1f;
    return v;
  };
  for (int64_t rows = 1; rows <= 4; ++rows) {
    const std::vector<float> f = NormalFloats(rng, rows * D), R = NormalFloats(rng, rows * hc * D);
    const std::vector<float> post = positive(rows * hc), comb = positive(rows * hc * hc),
                             pre = positive(rows * hc);
    // The host's steps.
    std::vector<float> want_X(rows * hc * D), xin(rows * D), want_mixes(rows * mix);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcCoefficients c;
      c.post.assign(post.begin() + r * hc, post.begin() + (r + 1) * hc);
      c.comb.assign(comb.begin() + r * hc * hc, comb.begin() + (r + 1) * hc * hc);
      cpu::HcPost(&f[r * D], &R[r * hc * D], c, hc, D, &want_X[r * hc * D]);
      cpu::HcPre(&want_X[r * hc * D], &pre[r * hc], hc, D, &xin[r * D]);
      cpu::RmsNorm(&xin[r * D], norm.data(), D, 1e-6, &xin[r * D]);
    }
    model::MakeCpuMatmul()->Gemm(want_X.data(), rows, fn, want_mixes.data());
    const std::vector<float> want = HostMoe(block, xin, rows);
    // The device, f uploaded on a stream of its own and handed over with an event.
    std::vector<float> got_X(rows * hc * D, NAN), got_mixes(rows * mix, NAN), got(rows * D, NAN);
    const model::MoeSublayer sub{
        hc,   R.data(), post.data(), comb.data(),  pre.data(),       norm,
        1e-6, &fn,      block,       got_X.data(), got_mixes.data(), got.data()};
    if (rows == 1) {
      EXPECT_FALSE(products->RunsMoeSublayer(rows, sub));  // nothing registered yet
      sw.RegisterWith(**gpu);
    }
    ASSERT_TRUE(products->RunsMoeSublayer(rows, sub));
    EXPECT_FALSE(products->RunsMoeSublayer(DeviceMatmul::kRoutedMoeRows + 1, sub));
    const HandedOver handed(f);
    handed.Sublayer(*products, rows, sub);
    EXPECT_TRUE(SameBits(got_X, want_X)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(SameBits(got_mixes, want_mixes)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(SameBits(got, want)) << rows << " rows, seed " << seed;
    EXPECT_FALSE(std::isnan(got[0]));

    // On into the next layer (MoeSublayer::Next): the host's coefficients from the mixes,
    // the stream after the layer, the next attention input. The results land with the
    // backend's next group, whose product reads the next input where it is.
    std::vector<float> want_X2(rows * hc * D), want_pre2(rows * hc), want_in2(rows * D);
    const std::vector<float> engram_kv = NormalFloats(rng, rows * (hc + 1) * D);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> m(want_mixes.begin() + r * mix, want_mixes.begin() + (r + 1) * mix);
      cpu::HcScaleMixesRow(&want_X[r * hc * D], hc * D, m.data(), mix);
      const cpu::HcCoefficients c = cpu::HcFromMixes(m, base, scale, hc, 3, 1e-6);
      cpu::HcPost(&want[r * D], &want_X[r * hc * D], c, hc, D, &want_X2[r * hc * D]);
      for (int64_t j = 0; j < hc; ++j) {  // the next layer's Engram, gated in
        float* h = &want_X2[(r * hc + j) * D];
        const float* K = &engram_kv[(r * (hc + 1) + j) * D];
        const float* V = &engram_kv[(r * (hc + 1) + hc) * D];
        cpu::EngramAdd(h, cpu::EngramGate(h, &qw[j * D], &kw[j * D], K, D), V, D);
      }
      std::copy(c.pre.begin(), c.pre.end(), want_pre2.begin() + r * hc);
      cpu::HcPre(&want_X2[r * hc * D], c.pre.data(), hc, D, &want_in2[r * D]);
      cpu::RmsNorm(&want_in2[r * D], norm2.data(), D, 1e-6, &want_in2[r * D]);
    }
    std::vector<float> want_probe(rows * E);
    model::MakeCpuMatmul()->Gemm(want_in2.data(), rows, gate, want_probe.data());
    std::vector<float> X2(rows * hc * D, NAN), pre2(rows * hc, NAN), in2(rows * D, NAN),
        probe(rows * E, NAN), untouched(rows * hc * D, NAN);
    model::MoeSublayer::Next next;
    next.base = base;
    next.scale = scale;
    next.iters = 3;
    next.hc_eps = 1e-6;
    next.norm = norm2;
    next.stream = X2.data();
    next.pre = pre2.data();
    next.input = in2.data();
    next.engram_kv = engram_kv.data();
    next.engram_qw = qw;
    next.engram_kw = kw;
    model::MoeSublayer into = sub;
    into.stream = untouched.data();
    into.next = &next;
    handed.Sublayer(*products, rows, into);
    // Another MoE call while those results are in flight, on unrelated rows: it takes
    // buffers of its own (a call reusing the sublayer's would overwrite its staged
    // results) and waits once, for itself — not first for them.
    const std::vector<float> other = NormalFloats(rng, rows * D);
    const std::vector<float> want_other = HostMoe(block, other, rows);
    std::vector<float> got_other(rows * D, NAN);
#if defined(KVC_CUDA_EMULATED)
    const uint64_t waits_before = cudaemu::CountsSoFar().waits;
#endif
    ASSERT_TRUE((*gpu)->RoutedMoe(other.data(), rows, block, {}, got_other.data()));
#if defined(KVC_CUDA_EMULATED)
    EXPECT_EQ(cudaemu::CountsSoFar().waits - waits_before, 1u) << rows << " rows";
#endif
    EXPECT_TRUE(SameBits(got_other, want_other)) << rows << " rows, seed " << seed;
    const model::GemmCall reader{in2.data(), rows, &gate, probe.data()};
    (*gpu)->GemmGroup(std::span(&reader, 1));
    EXPECT_TRUE(SameBits(X2, want_X2)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(SameBits(pre2, want_pre2)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(SameBits(in2, want_in2)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(SameBits(probe, want_probe)) << rows << " rows, seed " << seed;
    EXPECT_TRUE(std::isnan(untouched[0]));  // only the next layer's values are results
  }
}

// The attention sublayer's coefficients made on the device from its mixes (MoeSublayer::
// coefficients), with R and the mixes results of earlier groups still landing
// (GemmGroupLater): the bits of the host's coefficients handed over, and one wait for the
// groups and the sublayer together.
TEST(CudaGemmTest, CoefficientsFromMixesStillLandingAreTheHostsAndCostNoWait) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const SublayerWeights sw(rng);
  constexpr int64_t D = SublayerWeights::D, hc = SublayerWeights::hc, mix = SublayerWeights::mix,
                    A = 8;
  // R = a · Wrᵀ, a product: so R too can be a result still landing.
  const cpu::PackedMatrix wr(NormalFloats(rng, hc * D * A), hc * D, A);
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> gpu = MakeCudaMatmul();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const auto& products = dynamic_cast<const DeviceProducts&>(**gpu);
  sw.RegisterWith(**gpu);
  (*gpu)->Register(wr);
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> tight = MakeCudaMatmul();
  ASSERT_TRUE(tight.ok()) << tight.status();
  sw.RegisterWith(**tight);
  (*tight)->Register(wr);
  dynamic_cast<DeviceMatmul&>(**tight).LimitInFlight(1);
  const std::unique_ptr<model::MatmulBackend> cpu = model::MakeCpuMatmul();
  for (int64_t rows : {1, 2, 9}) {
    const std::vector<float> a = NormalFloats(rng, rows * A), f = NormalFloats(rng, rows * D);
    // The host's coefficients, handed over.
    std::vector<float> R(rows * hc * D), mixes(rows * mix), post, comb, pre;
    cpu->Gemm(a.data(), rows, wr, R.data());
    cpu->Gemm(R.data(), rows, sw.fn, mixes.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> m(mixes.begin() + r * mix, mixes.begin() + (r + 1) * mix);
      cpu::HcScaleMixesRow(&R[r * hc * D], hc * D, m.data(), mix);
      const cpu::HcCoefficients c = cpu::HcFromMixes(m, sw.base, sw.scale, hc, 3, 1e-6);
      post.insert(post.end(), c.post.begin(), c.post.end());
      comb.insert(comb.end(), c.comb.begin(), c.comb.end());
      pre.insert(pre.end(), c.pre.begin(), c.pre.end());
    }
    std::vector<float> want_X(rows * hc * D, NAN), want_mixes(rows * mix, NAN), want(rows * D, NAN);
    const model::MoeSublayer handed{
        hc,   R.data(), post.data(), comb.data(),   pre.data(),        sw.norm,
        1e-6, &sw.fn,   sw.block,    want_X.data(), want_mixes.data(), want.data()};
    HandedOver(f).Sublayer(products, rows, handed);
    ASSERT_FALSE(std::isnan(want[0]));
    // On the device from the mixes, R and the mixes landing from two groups: with no wait
    // between them, or — a backend allowed almost nothing in flight (LimitInFlight) — with
    // a wait before each call that would add to what is still landing; the same bits.
    auto on_device = [&](const model::MatmulBackend& backend, uint64_t waits) {
      const auto& device = dynamic_cast<const DeviceProducts&>(backend);
      std::vector<float> R_landing(rows * hc * D, NAN), mixes_landing(rows * mix, NAN);
      std::vector<float> got_X(rows * hc * D, NAN), got_mixes(rows * mix, NAN), got(rows * D, NAN);
#if defined(KVC_CUDA_EMULATED)
      const uint64_t waits_before = cudaemu::CountsSoFar().waits;
#endif
      const model::GemmCall first{a.data(), rows, &wr, R_landing.data()};
      backend.GemmGroupLater(std::span(&first, 1));
      const model::GemmCall second{R_landing.data(), rows, &sw.fn, mixes_landing.data()};
      backend.GemmGroupLater(std::span(&second, 1));
      if (waits == 1) {  // nothing landed yet
        EXPECT_TRUE(std::isnan(R_landing[0]) && std::isnan(mixes_landing[0]));
      }
      const model::MoeSublayer::Coefficients from{mixes_landing.data(), sw.base, sw.scale, 3, 1e-6};
      model::MoeSublayer own = handed;
      own.R = R_landing.data();
      own.post = own.comb = own.pre = nullptr;
      own.coefficients = &from;
      own.stream = got_X.data();
      own.mixes = got_mixes.data();
      own.out = got.data();
      HandedOver(f).Sublayer(device, rows, own);
#if defined(KVC_CUDA_EMULATED)
      EXPECT_EQ(cudaemu::CountsSoFar().waits - waits_before, waits) << rows << " rows";
#else
      (void)waits;
#endif
      EXPECT_TRUE(SameBits(R_landing, R)) << rows << " rows, seed " << seed;
      EXPECT_TRUE(SameBits(mixes_landing, mixes)) << rows << " rows, seed " << seed;
      EXPECT_TRUE(SameBits(got_X, want_X)) << rows << " rows, seed " << seed;
      EXPECT_TRUE(SameBits(got_mixes, want_mixes)) << rows << " rows, seed " << seed;
      EXPECT_TRUE(SameBits(got, want)) << rows << " rows, seed " << seed;
    };
    on_device(**gpu, 1);
    on_device(**tight, 3);
  }
}

}  // namespace
}  // namespace kvc::cuda
