// The engine with its matrix products, indexer and sparse attention on the GPU against the CPU
// engine, on random inputs (fresh seeds): the mini model's logits and pages are the CPU's
// bits through prefill (CED and full depth) and decode, also for two sequences at once; a
// decode step's waits are counted; exact resume is bit-identical to a cold run on the GPU.
// The matmul backend's own parts: device_matmul_test.cc.
// Skipped, saying so, where there is no GPU; the <test>_emu build runs the same checks on
// the CPU emulation of CUDA (tests/cudaemu).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda_attention.h"
#include "kernels/cuda_indexer.h"
#include "kernels/cuda_matmul.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops_kernel.cuh"
#include "tests/testing/same_bits.h"
#include "tests/testing/sanitizer.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"
#if defined(KVC_CUDA_EMULATED)
#include "cudaemu/runtime.h"
#endif

namespace kvc::cuda {
namespace {

using ::kvc::testing::SameBits;

TEST(CudaAttentionTest, AHeadDimensionOverTheKernelsIsRefusedAtLoad) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  ModelConfig config = *LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  const int64_t big = kMaxAttentionDim + 16;
  config.head_dim = big;
  absl::StatusOr<std::unique_ptr<model::AttentionBackend>> at = MakeCudaAttention();
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE((*at)->CheckShape(config.num_attention_heads, kMaxAttentionDim).ok());
  model::ModelOptions options;
  options.attention = *std::move(at);
  absl::StatusOr<std::unique_ptr<model::Model>> m =
      model::Model::Load(config, "/nonexistent/weights.safetensors", std::move(options));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(absl::StrCat("head_dim ", big)), std::string::npos)
      << m.status();
}

class CudaEngineTest : public ::testing::Test {
 protected:
  static constexpr int64_t kChunk = 32;
  void SetUp() override {
    if (DeviceCount() == 0)
      GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
    LoadBoth(*LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"));
  }
  // The CPU engine and the CUDA one over `config`, with fresh random weights.
  void LoadBoth(const ModelConfig& config) {
    config_ = config;
    weights_ = dir_.File("model.safetensors");
    const uint64_t seed = testing::FreshSeed();
    ASSERT_TRUE(
        model::WriteRandomWeights(config_, *BuildLayerSchedule(config_), seed, weights_).ok());
    absl::StatusOr<std::unique_ptr<model::Model>> c = model::Model::Load(config_, weights_, kChunk);
    ASSERT_TRUE(c.ok()) << c.status();
    cpu_ = *std::move(c);
    absl::StatusOr<std::unique_ptr<model::MatmulBackend>> mm = MakeCudaMatmul();
    ASSERT_TRUE(mm.ok()) << mm.status();
    mirror_ = MakePageMirror();  // shared, as programs do
    absl::StatusOr<std::unique_ptr<model::AttentionBackend>> at = MakeCudaAttention(mirror_);
    ASSERT_TRUE(at.ok()) << at.status();
    model::ModelOptions options;
    options.chunk_tokens = kChunk;
    options.matmul = *std::move(mm);
    options.attention = *std::move(at);
    absl::StatusOr<std::unique_ptr<model::IndexerBackend>> ix = MakeCudaIndexer(mirror_);
    ASSERT_TRUE(ix.ok()) << ix.status();
    options.indexer = *std::move(ix);
    absl::StatusOr<std::unique_ptr<model::Model>> g =
        model::Model::Load(config_, weights_, std::move(options));
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = *std::move(g);
    ASSERT_STREQ(gpu_->matmul_backend(), "cuda");
    ASSERT_STREQ(gpu_->attention_backend(), "cuda");
    ASSERT_STREQ(gpu_->indexer_backend(), "cuda");
  }
  std::vector<uint32_t> Prompt(std::mt19937_64& rng, int64_t n) const {
    std::vector<uint32_t> t(n);
    for (uint32_t& v : t) v = static_cast<uint32_t>(rng() % config_.vocab_size);
    return t;
  }
  static uint32_t Argmax(const std::vector<float>& l) {
    return static_cast<uint32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  }

  testing::TempDir dir_;
  ModelConfig config_;
  std::string weights_;
  std::unique_ptr<model::Model> cpu_, gpu_;
  std::shared_ptr<PageMirror> mirror_;
};

#if defined(KVC_CUDA_EMULATED)
// On the emulation the host-device round trips can be counted: a decode step waits for
// the device twice — the bound — on a config whose first layer is no drafter's
// target. A layer's products go in groups (the query path's with the compressor's and the
// mixes'; the up-projections chained on the normalized low-rank query) through page-locked
// staging; attention's output stays on the device through the inverse RoPE, the output
// projection, the MoE sublayer (mHC, the norm, the router, the experts, SwiGLU, the sum)
// and on into the next layer's input, which its query path reads where it is. No layer
// but the last waits for its query path's products: its compressor's rows join the
// pending group where they land and the entries it completes are written into the pages
// on the device (AttentionBackend::WriteEntries); its query and window row stay on the
// device for attention; its indexer reads its queries and head weights (scaled in the
// product's finish) and the candidate pool where they are, and attention its selection;
// its mHC coefficients are made there; its window row lands in the ring with the next
// wait; a drafter's target's input mean comes with the step into it; the first layer's
// Engram products for later layers are read where they land. The last layer's products
// land before the pass's end reads them (one wait), and the logits with the drafter's
// rings are the other.
TEST_F(CudaEngineTest, ADecodeStepWaitsForTheLastLayerAndTheLogitsOnly) {
  std::mt19937_64 rng(testing::FreshSeed());
  model::Sequence b = gpu_->NewSequence();
  absl::StatusOr<std::vector<float>> lb =
      gpu_->Prefill(b, Prompt(rng, 300), model::PrefillMode::kCed);
  ASSERT_TRUE(lb.ok()) << lb.status();
  constexpr int kSteps = 8;
  const cudaemu::Counts before = cudaemu::CountsSoFar();
  for (int step = 0; step < kSteps; ++step) {
    lb = gpu_->Decode(b, Argmax(*lb));
    ASSERT_TRUE(lb.ok()) << lb.status();
  }
  const cudaemu::Counts after = cudaemu::CountsSoFar();
  const double waits = static_cast<double>(after.waits - before.waits) / kSteps;
  const int64_t layers = config_.num_hidden_layers;
  const LayerSchedule schedule = *BuildLayerSchedule(config_);
  // The waits a step may take: one for the logits, one for the last layer's query path
  // (its products land before the pass's end reads them), and one for the first layer's
  // if it is a drafter's target (its input's mean comes with no step into it). A
  // compressing layer has none: its rows join the pending group where they land, and the
  // entries it completes are written into the pages on the device.
  int64_t allowed = 2, compressing = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const LayerPlan& p = schedule.layers[l];
    allowed += p.is_dspark_target && l == 0;
    compressing += p.compress_ratio > 0 && p.mode == AttentionMode::kFull;
  }
  std::printf(
      "decode step: %.2f waits for the device, %.1f launches (%lld layers, %lld of them "
      "compressing; %lld waits allowed)\n",
      waits, static_cast<double>(after.launches - before.launches) / kSteps,
      static_cast<long long>(layers), static_cast<long long>(compressing),
      static_cast<long long>(allowed));
  EXPECT_GT(compressing, 0) << "the config has no compressing layer";
  EXPECT_GT(waits, 0.0);
  EXPECT_LE(waits, static_cast<double>(allowed));
}

// A prefill pass runs on the device whole too: the MoE block routed there at any batch the
// device routes (the slot products tiled by expert), Engram's products issued a layer
// ahead, compressed entries written into the pages there. So a pass of the layer loop
// waits twice (its last layer's query path, its end), and the decoder's compressor once:
// CED prefill is the encoder's pass, the decoder's compressor and the decoder's segment;
// full depth one pass.
TEST_F(CudaEngineTest, APrefillPassWaitsTwice) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 300);
  for (const model::PrefillMode mode : {model::PrefillMode::kCed, model::PrefillMode::kFullDepth}) {
    model::Sequence b = gpu_->NewSequence();
    const uint64_t before = cudaemu::CountsSoFar().waits;
    const absl::StatusOr<std::vector<float>> lb = gpu_->Prefill(b, prompt, mode);
    ASSERT_TRUE(lb.ok()) << lb.status();
    const uint64_t waits = cudaemu::CountsSoFar().waits - before;
    const bool ced = mode == model::PrefillMode::kCed;
    std::printf("prefill of %zu tokens (%s): %llu waits for the device\n", prompt.size(),
                ced ? "ced" : "full depth", static_cast<unsigned long long>(waits));
    EXPECT_LE(waits, ced ? 2u + 1u + 2u : 2u);
  }
}
#endif

TEST_F(CudaEngineTest, LogitsAndPagesAreTheCpuEnginesBits) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (model::PrefillMode mode : {model::PrefillMode::kCed, model::PrefillMode::kFullDepth}) {
    const std::vector<uint32_t> prompt = Prompt(rng, 150);
    model::Sequence a = cpu_->NewSequence(), b = gpu_->NewSequence();
    absl::StatusOr<std::vector<float>> la = cpu_->Prefill(a, prompt, mode);
    absl::StatusOr<std::vector<float>> lb = gpu_->Prefill(b, prompt, mode);
    ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << " " << lb.status();
    EXPECT_TRUE(SameBits(*la, *lb)) << "prefill";
    const PageMirror::Stats before = mirror_->stats();
    for (int step = 0; step < 4; ++step) {
      const uint32_t next = Argmax(*la);
      la = cpu_->Decode(a, next);
      lb = gpu_->Decode(b, next);
      ASSERT_TRUE(la.ok() && lb.ok());
      EXPECT_TRUE(SameBits(*la, *lb)) << "decode step " << step;
      // The entries the step wrote on the device reached the host's pages with its end.
      EXPECT_EQ(mirror_->stats().awaiting_host, 0) << "decode step " << step;
      // The drafter reads its target layers' inputs (their copies' mean, made on the device
      // with the step into each) through the rings the pass's end fills.
      absl::StatusOr<std::vector<uint32_t>> da = cpu_->Draft(a, Argmax(*la)),
                                            db = gpu_->Draft(b, Argmax(*lb));
      ASSERT_TRUE(da.ok() && db.ok()) << da.status() << " " << db.status();
      EXPECT_EQ(*da, *db) << "draft after decode step " << step;
    }
    // Decode steps reuse the pages already on the device: far more reused than uploaded.
    const PageMirror::Stats after = mirror_->stats();
    EXPECT_GT(after.reused_pages - before.reused_pages,
              after.uploaded_pages - before.uploaded_pages);
    ASSERT_EQ(a.complete_chunks(), b.complete_chunks());
    for (int64_t c = 0; c < a.complete_chunks(); ++c) {
      EXPECT_TRUE(std::ranges::equal(a.page(c), b.page(c))) << "page " << c;
    }
  }
}

// The model is shared by threads (one sequence each): two sequences decoded at once on the
// device backends — their results handed between streams and left pending between calls —
// each give the CPU engine's bits.
// Longer compressor groups than mini's (ratios 4 and 8 where it has 2, as the reference
// has 4): a decode step's row joins several pending ones before an entry completes, a
// prefill leaves some pending, and an entry's page holds 8 or 4 entries of the layer. The
// entries the device writes keep the CPU's bits.
TEST_F(CudaEngineTest, LongerCompressorGroupsAreTheCpuEnginesBits) {
  ModelConfig config = config_;
  config.compress_ratios = {0, 0, 4, 4, 8, 8, 1, 1, 1, 1, 1, 1, 0};
  ASSERT_EQ(config.compress_ratios.size(), config_.compress_ratios.size());
  LoadBoth(config);
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 150);  // 6 rows of an 8-group pending
  model::Sequence a = cpu_->NewSequence(), b = gpu_->NewSequence();
  absl::StatusOr<std::vector<float>> la = cpu_->Prefill(a, prompt, model::PrefillMode::kCed);
  absl::StatusOr<std::vector<float>> lb = gpu_->Prefill(b, prompt, model::PrefillMode::kCed);
  ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << " " << lb.status();
  EXPECT_TRUE(SameBits(*la, *lb)) << "prefill";
  for (int step = 0; step < 10; ++step) {  // across two 8-groups' ends
    const uint32_t next = Argmax(*la);
    la = cpu_->Decode(a, next);
    lb = gpu_->Decode(b, next);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_TRUE(SameBits(*la, *lb)) << "decode step " << step;
  }
}

TEST_F(CudaEngineTest, TwoSequencesDecodedAtOnceAreEachTheCpusBits) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint32_t> prompts[2] = {Prompt(rng, 90), Prompt(rng, 120)};
  constexpr int kSteps = 6;
  std::vector<std::vector<float>> got[2], want[2];
  auto run = [&](const model::Model& m, int i, std::vector<std::vector<float>>& out) {
    model::Sequence s = m.NewSequence();
    absl::StatusOr<std::vector<float>> l = m.Prefill(s, prompts[i], model::PrefillMode::kCed);
    for (int step = 0; step < kSteps && l.ok(); ++step) {
      out.push_back(*l);
      l = m.Decode(s, Argmax(*l));
    }
    if (l.ok()) out.push_back(*l);
  };
  for (int i = 0; i < 2; ++i) run(*cpu_, i, want[i]);
  std::thread other([&] { run(*gpu_, 1, got[1]); });
  run(*gpu_, 0, got[0]);
  other.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i << ", seed " << seed;
    for (size_t t = 0; t < got[i].size(); ++t)
      EXPECT_TRUE(SameBits(got[i][t], want[i][t])) << "sequence " << i << " step " << t;
  }
}

TEST_F(CudaEngineTest, ExactResumeIsBitIdenticalToAColdRunOnTheGpu) {
  std::mt19937_64 rng(testing::FreshSeed());
  // Under a sanitizer (the emulated device, ~5× slower) the middle case is left out: it
  // crosses no boundary the other two do not.
  const std::vector<int64_t> fresh_tokens =
      testing::kUnderSanitizer ? std::vector<int64_t>{1, 41} : std::vector<int64_t>{1, 7, 41};
  for (int64_t cached : {32, 96}) {
    for (int64_t fresh : fresh_tokens) {
      const std::vector<uint32_t> prompt = Prompt(rng, cached + fresh);
      model::Sequence cold = gpu_->NewSequence(), prefix = gpu_->NewSequence();
      absl::StatusOr<std::vector<float>> c = gpu_->Prefill(cold, prompt, model::PrefillMode::kCed);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE(
          gpu_->Prefill(prefix, std::span(prompt).first(cached), model::PrefillMode::kCed).ok());
      std::vector<uint8_t> pages;
      for (int64_t p = 0; p < cached / kChunk; ++p) {
        pages.insert(pages.end(), prefix.page(p).begin(), prefix.page(p).end());
      }
      model::Sequence warm = gpu_->NewSequence();
      absl::StatusOr<std::vector<float>> w =
          gpu_->Resume(warm, pages, cached, prompt, model::ReplayMode::kExact);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_TRUE(SameBits(*c, *w)) << "cached " << cached << ", new " << fresh;
      const uint32_t next = Argmax(*c);
      c = gpu_->Decode(cold, next);
      w = gpu_->Decode(warm, next);
      ASSERT_TRUE(c.ok() && w.ok());
      EXPECT_TRUE(SameBits(*c, *w)) << "decode after resume, cached " << cached;
    }
  }
}

// cuBLAS as the matmul backend: logits within float rounding of the CPU engine's (not
// the same bits: cuBLAS sums in its own order), the same greedy tokens, and exact replay
// refused because its rows are not batch invariant.
TEST_F(CudaEngineTest, CublasBackendIsCloseAndRefusesExactReplay) {
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> mm = MakeCublasMatmul();
  ASSERT_TRUE(mm.ok()) << mm.status();
  model::ModelOptions options;
  options.chunk_tokens = kChunk;
  options.matmul = *std::move(mm);
  // As `--backend cublas` has them: attention (with its output projection queued on
  // cuBLAS) and the indexer on the device too.
  absl::StatusOr<std::unique_ptr<model::AttentionBackend>> at = MakeCudaAttention(mirror_);
  absl::StatusOr<std::unique_ptr<model::IndexerBackend>> ix = MakeCudaIndexer(mirror_);
  ASSERT_TRUE(at.ok() && ix.ok());
  options.attention = *std::move(at);
  options.indexer = *std::move(ix);
  absl::StatusOr<std::unique_ptr<model::Model>> blas =
      model::Model::Load(config_, weights_, std::move(options));
  ASSERT_TRUE(blas.ok()) << blas.status();
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 150);
  model::Sequence a = cpu_->NewSequence(), b = (*blas)->NewSequence();
  absl::StatusOr<std::vector<float>> la = cpu_->Prefill(a, prompt, model::PrefillMode::kCed);
  absl::StatusOr<std::vector<float>> lb = (*blas)->Prefill(b, prompt, model::PrefillMode::kCed);
  ASSERT_TRUE(la.ok() && lb.ok());
  float scale = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < la->size(); ++i) {
    scale = std::max(scale, std::abs((*la)[i]));
    diff = std::max(diff, std::abs((*la)[i] - (*lb)[i]));
  }
  std::printf("cuBLAS vs CPU logits: max |diff| %.3g of max |logit| %.3g\n", diff, scale);
  EXPECT_LT(diff, 1e-3f * scale);
  EXPECT_EQ(Argmax(*la), Argmax(*lb));
  std::vector<uint8_t> pages;
  for (int64_t p = 0; p < 2; ++p) pages.insert(pages.end(), b.page(p).begin(), b.page(p).end());
  model::Sequence warm = (*blas)->NewSequence();
  absl::StatusOr<std::vector<float>> w =
      (*blas)->Resume(warm, pages, 2 * kChunk, prompt, model::ReplayMode::kExact);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
}

}  // namespace
}  // namespace kvc::cuda
