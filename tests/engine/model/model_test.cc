// The engine on the mini config with random weights: exact resume is bit-identical to a
// cold run, pages are causal (a prefix's pages do not depend on what follows), bounded
// replay and CED stay close to their references, and bad input is refused precisely.
#include "engine/model/model.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/model/generate.h"
#include "engine/model/weights.h"
#include "engine/spec/kv_codec.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::model {
namespace {

constexpr int64_t kChunk = 32;  // small pages so short prompts span several

class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    config_ = new ModelConfig(*LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"));
    const LayerSchedule s = *BuildLayerSchedule(*config_);
    weights_ = dir_->File("mini.safetensors");
    ASSERT_TRUE(WriteRandomWeights(*config_, s, 7, weights_).ok());
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(*config_, weights_, kChunk);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete config_;
    delete dir_;
  }
  std::vector<uint32_t> Prompt(std::mt19937_64& rng, int64_t n) const {
    std::vector<uint32_t> t(n);
    for (uint32_t& v : t) v = static_cast<uint32_t>(rng() % config_->vocab_size);
    return t;
  }
  static std::vector<uint8_t> Pages(const Sequence& s, int64_t chunks) {
    std::vector<uint8_t> out;
    for (int64_t c = 0; c < chunks; ++c) {
      auto p = s.page(c);
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  }
  // Logits of the prompt's last position and of `steps` greedy decode steps.
  static std::vector<std::vector<float>> Continue(Sequence& s, std::vector<float> first,
                                                  int steps) {
    std::vector<std::vector<float>> all = {first};
    for (int i = 0; i < steps; ++i) {
      const uint32_t next = static_cast<uint32_t>(
          std::max_element(all.back().begin(), all.back().end()) - all.back().begin());
      absl::StatusOr<std::vector<float>> l = model_->Decode(s, next);
      EXPECT_TRUE(l.ok()) << l.status();
      all.push_back(*l);
    }
    return all;
  }

  static testing::TempDir* dir_;
  static ModelConfig* config_;
  static std::string weights_;
  static Model* model_;
};
testing::TempDir* ModelTest::dir_ = nullptr;
ModelConfig* ModelTest::config_ = nullptr;
std::string ModelTest::weights_;
Model* ModelTest::model_ = nullptr;

TEST_F(ModelTest, ExactResumeIsBitIdenticalToAColdRun) {
  std::mt19937_64 rng(testing::FreshSeed());
  // New inputs shorter than the window (8), not multiples of the compress ratio (2) or
  // candidate block (4), and longer ones; prefixes of one to several pages.
  for (int64_t cached : {32, 64, 160}) {
    for (int64_t fresh : {1, 3, 5, 7, 8, 13, 41}) {
      const std::vector<uint32_t> prompt = Prompt(rng, cached + fresh);
      Sequence cold = model_->NewSequence();
      absl::StatusOr<std::vector<float>> c = model_->Prefill(cold, prompt, PrefillMode::kCed);
      ASSERT_TRUE(c.ok()) << c.status();
      Sequence prefix = model_->NewSequence();
      ASSERT_TRUE(model_->Prefill(prefix, std::span(prompt).first(cached), PrefillMode::kCed).ok());
      ASSERT_EQ(prefix.complete_chunks(), cached / kChunk);
      Sequence warm = model_->NewSequence();
      absl::StatusOr<std::vector<float>> w =
          model_->Resume(warm, Pages(prefix, cached / kChunk), cached, prompt, ReplayMode::kExact);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_LT(warm.last_stats().encoder_tokens, cold.last_stats().encoder_tokens + 1);
      const auto a = Continue(cold, *c, 4), b = Continue(warm, *w, 4);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
            << "cached " << cached << ", new " << fresh << ", step " << i;
      }
    }
  }
}

// A backend that runs the CPU GEMM, counts what the model asks of it, and adds `nudge` to
// every output (0: the CPU's bits).
class CountingMatmul final : public MatmulBackend {
 public:
  struct Counts {
    std::atomic<int64_t> registered{0}, weight_calls{0}, transient_calls{0};
  };
  CountingMatmul(float nudge, Counts* counts, bool invariant = true)
      : nudge_(nudge), counts_(counts), invariant_(invariant) {}
  const char* name() const override { return "counting"; }
  bool batch_invariant() const override { return invariant_; }
  void Register(const cpu::PackedMatrix& w) override {
    EXPECT_TRUE(weights_.insert(w.packed().data()).second) << "a weight registered twice";
    ++counts_->registered;
  }
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    ++(weights_.contains(w.packed().data()) ? counts_->weight_calls : counts_->transient_calls);
    cpu::GemmSerial(x, m, w, y);
    for (int64_t i = 0; i < m * w.out_features(); ++i) y[i] += nudge_;
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }

 private:
  const float nudge_;
  Counts* counts_;
  const bool invariant_;
  std::set<const float*> weights_;  // written only before the model runs
};

TEST_F(ModelTest, EveryMatrixProductGoesThroughTheMatmulBackend) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 100);
  Sequence ref = model_->NewSequence();
  absl::StatusOr<std::vector<float>> want = model_->Prefill(ref, prompt, PrefillMode::kCed);
  ASSERT_TRUE(want.ok()) << want.status();
  for (float nudge : {0.0f, 1e-3f}) {
    CountingMatmul::Counts counts;
    ModelOptions options;
    options.chunk_tokens = kChunk;
    options.matmul = std::make_unique<CountingMatmul>(nudge, &counts);
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(*config_, weights_, std::move(options));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_STREQ((*m)->matmul_backend(), "counting");
    Sequence s = (*m)->NewSequence();
    absl::StatusOr<std::vector<float>> got = (*m)->Prefill(s, prompt, PrefillMode::kCed);
    ASSERT_TRUE(got.ok()) << got.status();
    const bool same = std::memcmp(got->data(), want->data(), want->size() * sizeof(float)) == 0;
    EXPECT_EQ(same, nudge == 0.0f) << "nudge " << nudge;
    EXPECT_GT(counts.registered.load(), 4 * config_->num_hidden_layers);
    EXPECT_GT(counts.weight_calls.load(), 0);
    EXPECT_GT(counts.transient_calls.load(), 0);  // the indexer's keys
  }
}

TEST_F(ModelTest, ExactReplayIsRefusedWithABackendThatIsNotBatchInvariant) {
  std::mt19937_64 rng(testing::FreshSeed());
  CountingMatmul::Counts counts;
  ModelOptions options;
  options.chunk_tokens = kChunk;
  options.matmul = std::make_unique<CountingMatmul>(0.0f, &counts, /*invariant=*/false);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(*config_, weights_, std::move(options));
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<uint32_t> prompt = Prompt(rng, 70);
  Sequence prefix = (*m)->NewSequence();
  ASSERT_TRUE((*m)->Prefill(prefix, std::span(prompt).first(64), PrefillMode::kCed).ok());
  const std::vector<uint8_t> pages = Pages(prefix, 2);
  Sequence exact = (*m)->NewSequence(), bounded = (*m)->NewSequence();
  absl::StatusOr<std::vector<float>> r = (*m)->Resume(exact, pages, 64, prompt, ReplayMode::kExact);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("batch-invariant"), std::string::npos) << r.status();
  EXPECT_TRUE((*m)->Resume(bounded, pages, 64, prompt, ReplayMode::kBounded).ok());
}

// An attention backend that serves no shape: Model::Load must pass its refusal on before
// it reads any weight.
class RefusingAttention final : public AttentionBackend {
 public:
  const char* name() const override { return "refusing"; }
  absl::Status CheckShape(int64_t heads, int64_t dim) const override {
    return absl::InvalidArgumentError(absl::StrCat("no room for ", heads, " heads of ", dim));
  }
  void Attend(const AttentionBatch&) const override { ADD_FAILURE() << "attended"; }
};

TEST_F(ModelTest, AShapeTheAttentionBackendCannotServeIsRefusedAtLoad) {
  ModelOptions options;
  options.chunk_tokens = kChunk;
  options.attention = std::make_unique<RefusingAttention>();
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Load(*config_, "/nonexistent/weights.safetensors", std::move(options));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(
                absl::StrCat(config_->num_attention_heads, " heads of ", config_->head_dim)),
            std::string::npos)
      << m.status();
}

// What a device backend's page cache relies on: a page version names one content. Every
// (version → bytes) seen is remembered; a version seen again must come with the same bytes.
class VersionLedger {
 public:
  void Check(std::span<const std::vector<uint8_t>> pages, std::span<const uint64_t> versions) {
    std::lock_guard lock(mu_);
    EXPECT_EQ(pages.size(), versions.size());
    for (size_t p = 0; p < pages.size() && p < versions.size(); ++p) {
      uint64_t h = 1469598103934665603ull;  // FNV-1a
      for (uint8_t b : pages[p]) h = (h ^ b) * 1099511628211ull;
      auto [it, fresh] = seen_.emplace(versions[p], h);
      if (!fresh && it->second != h) ++stale;
      ++checked;
    }
  }
  int64_t stale = 0, checked = 0;

 private:
  std::mutex mu_;
  std::map<uint64_t, uint64_t> seen_;
};

// An attention backend that runs the CPU's, checks what the model hands it — every listed
// compressed row equals its FP4 copy in the pages dequantized (the GPU reads the pages) —
// and adds `nudge` to every output (0: the CPU's bits).
class CheckingAttention final : public AttentionBackend {
 public:
  CheckingAttention(float nudge, VersionLedger* ledger) : nudge_(nudge), ledger_(ledger) {}
  const char* name() const override { return "checking"; }
  void Attend(const AttentionBatch& b) const override {
    ++calls;
    if (!b.pages.empty()) ledger_->Check(b.pages, b.page_versions);
    for (int32_t e : b.entries) {
      if (e >= 0) {
        EXPECT_LT(static_cast<int64_t>(e + 1) * b.dim,
                  static_cast<int64_t>(b.window.size()) + b.fresh_rows * b.dim + 1);
        continue;
      }
      ++compressed_rows;
      const int64_t j = -static_cast<int64_t>(e) - 1;
      const ChunkSection& codes = b.layout->Section(b.layer, SectionKind::kMainCodes);
      const ChunkSection& scales = b.layout->Section(b.layer, SectionKind::kMainScales);
      const std::vector<uint8_t>& page = b.pages[j / codes.positions];
      const int64_t local = j % codes.positions;
      std::vector<float> row(b.dim);
      Dequantize(KvFormat::kMainKv,
                 std::span(page).subspan(codes.offset + local * b.dim / 2, b.dim / 2),
                 std::span(page).subspan(scales.offset + local * b.dim / 16, b.dim / 16), row);
      if (std::memcmp(row.data(), b.compressed + j * b.dim, b.dim * sizeof(float)) != 0)
        ++mismatched_rows;
    }
    MakeCpuAttention()->Attend(b);
    for (int64_t i = 0; i < b.queries * b.heads * b.dim; ++i) b.out[i] += nudge_;
  }
  mutable std::atomic<int64_t> calls{0}, compressed_rows{0}, mismatched_rows{0};

 private:
  const float nudge_;
  VersionLedger* ledger_;
};

TEST_F(ModelTest, AttentionGoesThroughItsBackendWithPagesMatchingTheRows) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 120);
  Sequence ref = model_->NewSequence();
  absl::StatusOr<std::vector<float>> want = model_->Prefill(ref, prompt, PrefillMode::kCed);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_STREQ(model_->attention_backend(), "cpu");
  for (float nudge : {0.0f, 1e-3f}) {
    VersionLedger ledger;
    auto checking = std::make_unique<CheckingAttention>(nudge, &ledger);
    const CheckingAttention* seen = checking.get();
    ModelOptions options;
    options.chunk_tokens = kChunk;
    options.attention = std::move(checking);
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(*config_, weights_, std::move(options));
    ASSERT_TRUE(m.ok()) << m.status();
    Sequence s = (*m)->NewSequence();
    absl::StatusOr<std::vector<float>> got = (*m)->Prefill(s, prompt, PrefillMode::kCed);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE((*m)->Decode(s, 7).ok());
    EXPECT_EQ(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)) == 0,
              nudge == 0.0f)
        << "nudge " << nudge;
    // Resume a second sequence from this one's pages, then decode both: versions stay
    // unique to one content across sequences, writes and imports.
    Sequence warm = (*m)->NewSequence();
    std::vector<uint8_t> pages = Pages(s, 2);
    ASSERT_TRUE((*m)->Resume(warm, pages, 2 * kChunk, prompt, ReplayMode::kExact).ok());
    for (uint32_t t : {3u, 9u}) ASSERT_TRUE((*m)->Decode(warm, t).ok() && (*m)->Decode(s, t).ok());
    EXPECT_GT(seen->calls.load(), config_->num_hidden_layers);
    EXPECT_GT(seen->compressed_rows.load(), 0);
    EXPECT_EQ(seen->mismatched_rows.load(), 0);
    EXPECT_GT(ledger.checked, 0);
    EXPECT_EQ(ledger.stale, 0) << "a page version came back with other bytes";
  }
}

// An indexer backend that runs the CPU's and checks what the model hands it: every visible
// index key equals its FP4 copy in the pages dequantized (the GPU scores from the pages),
// and the candidate pool is produced by one layer and applied by others.
class CheckingIndexer final : public IndexerBackend {
 public:
  explicit CheckingIndexer(VersionLedger* ledger) : ledger_(ledger) {}
  const char* name() const override { return "checking"; }
  void Select(const IndexerBatch& b) const override {
    ++calls;
    ledger_->Check(b.pages, b.page_versions);
    (b.pool_use == PoolUse::kProduce ? produced
     : b.pool_use == PoolUse::kApply ? applied
                                     : plain)++;
    const int64_t max_cl = (b.first_position + b.queries) / b.ratio;
    const ChunkSection& codes = b.layout->Section(b.layer, SectionKind::kIndexCodes);
    const ChunkSection& scales = b.layout->Section(b.layer, SectionKind::kIndexScales);
    std::vector<float> row(b.dim);
    for (int64_t t = 0; t < max_cl; ++t) {
      const std::vector<uint8_t>& page = b.pages[t / codes.positions];
      const int64_t local = t % codes.positions;
      Dequantize(KvFormat::kIndexK,
                 std::span(page).subspan(codes.offset + local * b.dim / 2, b.dim / 2),
                 std::span(page).subspan(scales.offset + local * b.dim / 32, b.dim / 32), row);
      if (std::memcmp(row.data(), b.keys + t * b.dim, b.dim * sizeof(float)) != 0) ++mismatched;
    }
    MakeCpuIndexer()->Select(b);
  }
  mutable std::atomic<int64_t> calls{0}, produced{0}, applied{0}, plain{0}, mismatched{0};

 private:
  VersionLedger* ledger_;
};

TEST_F(ModelTest, TheIndexerGoesThroughItsBackendWithPagesMatchingTheKeys) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 120);
  Sequence ref = model_->NewSequence();
  absl::StatusOr<std::vector<float>> want = model_->Prefill(ref, prompt, PrefillMode::kFullDepth);
  ASSERT_TRUE(want.ok()) << want.status();
  VersionLedger ledger;
  auto checking = std::make_unique<CheckingIndexer>(&ledger);
  const CheckingIndexer* seen = checking.get();
  ModelOptions options;
  options.chunk_tokens = kChunk;
  options.indexer = std::move(checking);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(*config_, weights_, std::move(options));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_STREQ((*m)->indexer_backend(), "checking");
  Sequence s = (*m)->NewSequence();
  absl::StatusOr<std::vector<float>> got = (*m)->Prefill(s, prompt, PrefillMode::kFullDepth);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)), 0);
  std::printf("indexer calls: %ld producing the pool, %ld applying it, %ld plain\n",
              static_cast<long>(seen->produced.load()), static_cast<long>(seen->applied.load()),
              static_cast<long>(seen->plain.load()));
  EXPECT_GT(seen->produced.load(), 0);
  EXPECT_GT(seen->applied.load(), 0);
  EXPECT_EQ(seen->mismatched.load(), 0);
  for (uint32_t t : {3u, 9u, 27u}) ASSERT_TRUE((*m)->Decode(s, t).ok());  // new entries, same pages
  EXPECT_GT(ledger.checked, 0);
  EXPECT_EQ(ledger.stale, 0) << "a page version came back with other bytes";
}

TEST_F(ModelTest, PagesOfAPrefixDoNotDependOnWhatFollows) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 150);
  Sequence whole = model_->NewSequence(), part = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(whole, prompt, PrefillMode::kCed).ok());
  ASSERT_TRUE(model_->Prefill(part, std::span(prompt).first(64), PrefillMode::kCed).ok());
  EXPECT_EQ(whole.complete_chunks(), 150 / kChunk);
  ASSERT_EQ(part.complete_chunks(), 2);
  for (int64_t c = 0; c < 2; ++c) {
    ASSERT_EQ(whole.page(c).size(), static_cast<size_t>(model_->layout().chunk_bytes));
    EXPECT_TRUE(std::equal(whole.page(c).begin(), whole.page(c).end(), part.page(c).begin()))
        << "page " << c;
  }
  // A page is not all zeros: it holds quantized rows with non-zero scales.
  EXPECT_GT(
      std::count_if(whole.page(0).begin(), whole.page(0).end(), [](uint8_t b) { return b != 0; }),
      static_cast<long>(whole.page(0).size() / 2));
  // Full depth writes the same encoder-layer rows (the decoder's differ: CED computes them
  // from the encoder output, full depth from the same output, so they agree too).
  Sequence deep = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(deep, prompt, PrefillMode::kFullDepth).ok());
  EXPECT_TRUE(std::equal(whole.page(1).begin(), whole.page(1).end(), deep.page(1).begin()));
}

// Bounded replay vs cold, CED vs full depth: how close, over a suite of prompts. The
// bounds are what docs/model.md reports, with margin.
TEST_F(ModelTest, BoundedReplayAndCedStayCloseToTheirReferences) {
  std::mt19937_64 rng(testing::FreshSeed());
  int agree_bounded = 0, agree_ced = 0, total = 0;
  double max_bounded = 0, max_ced = 0, sum_bounded = 0, sum_ced = 0;
  int64_t logits = 0;
  // 20 prompts: with 10, one run of a full ctest failed a bound by chance (the lowest
  // agreement of 30 runs was 65 %); twice the prompts halve each figure's variance.
  for (int i = 0; i < 20; ++i) {
    const int64_t cached = 64 + 32 * (i % 3), fresh = 3 + 11 * (i % 10);
    const std::vector<uint32_t> prompt = Prompt(rng, cached + fresh);
    Sequence cold = model_->NewSequence(), deep = model_->NewSequence(),
             prefix = model_->NewSequence(), warm = model_->NewSequence();
    const auto c = Continue(cold, *model_->Prefill(cold, prompt, PrefillMode::kCed), 3);
    const auto d = Continue(deep, *model_->Prefill(deep, prompt, PrefillMode::kFullDepth), 3);
    ASSERT_TRUE(model_->Prefill(prefix, std::span(prompt).first(cached), PrefillMode::kCed).ok());
    absl::StatusOr<std::vector<float>> w =
        model_->Resume(warm, Pages(prefix, cached / kChunk), cached, prompt, ReplayMode::kBounded);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(warm.last_stats().replayed_tokens, config_->sliding_window);
    const auto b = Continue(warm, *w, 3);
    for (size_t s = 0; s < c.size(); ++s) {
      auto argmax = [](const std::vector<float>& v) {
        return std::max_element(v.begin(), v.end()) - v.begin();
      };
      agree_bounded += argmax(b[s]) == argmax(c[s]);
      agree_ced += argmax(c[s]) == argmax(d[s]);
      ++total;
      for (size_t k = 0; k < c[s].size(); ++k) {
        const double db = std::abs(b[s][k] - c[s][k]), dc = std::abs(c[s][k] - d[s][k]);
        max_bounded = std::max(max_bounded, db);
        max_ced = std::max(max_ced, dc);
        sum_bounded += db;
        sum_ced += dc;
        ++logits;
      }
    }
  }
  const double mean_bounded = sum_bounded / logits, mean_ced = sum_ced / logits;
  std::printf(
      "bounded vs cold: top-1 %d/%d, mean |dlogit| %.4f, max %.4f; CED vs full depth: "
      "top-1 %d/%d, mean |dlogit| %.4f, max %.4f\n",
      agree_bounded, total, mean_bounded, max_bounded, agree_ced, total, mean_ced, max_ced);
  EXPECT_GT(max_bounded, 0.0) << "bounded replay is an approximation; equal logits mean it "
                                 "replayed everything";
  EXPECT_GE(agree_bounded, total * 3 / 5);
  EXPECT_GE(agree_ced, total * 3 / 5);
  EXPECT_LT(mean_bounded, 0.5);
  EXPECT_LT(mean_ced, 0.5);
  EXPECT_LT(max_bounded, 10.0);
  EXPECT_LT(max_ced, 10.0);
}

TEST_F(ModelTest, TheBoundedReplaysLengthCanBeChosen) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t cached = 160, win = config_->sliding_window;
  const std::vector<uint32_t> prompt = Prompt(rng, cached + 21);
  Sequence prefix = model_->NewSequence(), cold = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(prefix, std::span(prompt).first(cached), PrefillMode::kCed).ok());
  const std::vector<uint8_t> pages = Pages(prefix, cached / kChunk);
  const std::vector<float> ced = *model_->Prefill(cold, prompt, PrefillMode::kCed);
  auto resume = [&](int64_t replay_tokens, int64_t* replayed) {
    Sequence s = model_->NewSequence();
    absl::StatusOr<std::vector<float>> l =
        model_->Resume(s, pages, cached, prompt, ReplayMode::kBounded, replay_tokens);
    EXPECT_TRUE(l.ok()) << l.status();
    *replayed = s.last_stats().replayed_tokens;
    return l.ok() ? *l : std::vector<float>{};
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  int64_t replayed = -1;
  const std::vector<float> model_rule = resume(-1, &replayed);
  EXPECT_EQ(replayed, win);
  EXPECT_TRUE(same_bits(model_rule, resume(win, &replayed))) << "-1 is the model's window";
  const std::vector<float> none = resume(0, &replayed);
  EXPECT_EQ(replayed, 0);
  EXPECT_FALSE(same_bits(none, model_rule)) << "no replay loses the encoder's window";
  // Replaying every cached token recomputes what a cold CED prefill computes, bit for bit.
  EXPECT_TRUE(same_bits(resume(cached, &replayed), ced));
  EXPECT_EQ(replayed, cached);
  Sequence s = model_->NewSequence();
  EXPECT_EQ(model_->Resume(s, pages, cached, prompt, ReplayMode::kBounded, -2).status().code(),
            absl::StatusCode::kInvalidArgument);
  Sequence t = model_->NewSequence();
  absl::Status st = model_->Resume(t, pages, cached, prompt, ReplayMode::kExact, 8).status();
  EXPECT_NE(st.message().find("with bounded replay only"), std::string::npos) << st;
}

TEST_F(ModelTest, BadInputIsRefusedWithTheReason) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 100);
  Sequence prefix = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(prefix, std::span(prompt).first(64), PrefillMode::kCed).ok());
  const std::vector<uint8_t> pages = Pages(prefix, 2);
  auto resume = [&](std::span<const uint8_t> p, int64_t cached, std::span<const uint32_t> t) {
    Sequence s = model_->NewSequence();
    return model_->Resume(s, p, cached, t, ReplayMode::kExact).status();
  };
  absl::Status s = resume(pages, 48, prompt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of the chunk size 32"), std::string::npos) << s;
  s = resume(pages, 64, std::span(prompt).first(64));
  EXPECT_NE(s.message().find("must be shorter than the prompt"), std::string::npos) << s;
  s = resume(std::span(pages).first(pages.size() - 1), 64, prompt);
  EXPECT_NE(s.message().find("chunks need"), std::string::npos) << s;
  std::vector<uint8_t> bad = pages;
  const ChunkSection& scales = model_->layout().sections[1];  // a main-scales section
  ASSERT_EQ(scales.kind, SectionKind::kMainScales);
  bad[scales.offset] = 0x7F;  // E4M3 NaN
  s = resume(bad, 64, prompt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  std::vector<uint32_t> oov = prompt;
  oov[10] = static_cast<uint32_t>(config_->vocab_size);
  Sequence t = model_->NewSequence();
  s = model_->Prefill(t, oov, PrefillMode::kCed).status();
  EXPECT_NE(s.message().find("token 10 is 512, outside the vocabulary"), std::string::npos) << s;
  EXPECT_EQ(model_->Decode(t, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ModelTest, WeightsThatDoNotMatchTheConfigAreRefused) {
  ModelConfig other = *config_;
  other.hidden_size = 128;
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(other, weights_, kChunk);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor \"embed.weight\" has shape [512, 256]; the config "
                                      "needs [512, 128]"),
            std::string::npos)
      << m.status();
  // A truncated file.
  const std::string cut = dir_->File("cut.safetensors");
  {
    std::ifstream in(weights_, std::ios::binary);
    std::string head(1000, '\0');
    in.read(head.data(), 1000);
    std::ofstream(cut, std::ios::binary) << head;
  }
  m = Model::Load(*config_, cut, kChunk);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("> file"), std::string::npos) << m.status();
}

TEST_F(ModelTest, ExtendingSeveralTokensEqualsDecodingThemOneByOne) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 70), more = Prompt(rng, 9);
  Sequence one = model_->NewSequence(), many = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(one, prompt, PrefillMode::kCed).ok());
  ASSERT_TRUE(model_->Prefill(many, prompt, PrefillMode::kCed).ok());
  std::vector<std::vector<float>> singles;
  for (uint32_t t : more) singles.push_back(*model_->Decode(one, t));
  absl::StatusOr<std::vector<std::vector<float>>> batch = model_->Extend(many, more);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (size_t i = 0; i < more.size(); ++i) {
    ASSERT_EQ(std::memcmp(singles[i].data(), (*batch)[i].data(), singles[i].size() * 4), 0) << i;
  }
  EXPECT_EQ(many.complete_chunks(), one.complete_chunks());
  for (int64_t c = 0; c < one.complete_chunks(); ++c) {
    EXPECT_TRUE(std::equal(one.page(c).begin(), one.page(c).end(), many.page(c).begin()));
  }
}

TEST_F(ModelTest, RollbackUndoesTokensExactly) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Prompt(rng, 61), more = Prompt(rng, 6);
  Sequence a = model_->NewSequence(), b = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(a, prompt, PrefillMode::kCed).ok());
  ASSERT_TRUE(model_->Prefill(b, prompt, PrefillMode::kCed).ok());
  // a: run 6 tokens (crossing a compressor group and a page boundary at 64), roll back,
  // run the first 2. b: run the first 2. Then both decode the same token.
  const SequenceCheckpoint cp = model_->Checkpoint(a);
  ASSERT_TRUE(model_->Extend(a, more).ok());
  model_->Rollback(a, cp);
  EXPECT_EQ(a.length(), 61);
  ASSERT_TRUE(model_->Extend(a, std::span(more).first(2)).ok());
  ASSERT_TRUE(model_->Extend(b, std::span(more).first(2)).ok());
  const std::vector<float> la = *model_->Decode(a, more[5]), lb = *model_->Decode(b, more[5]);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}

TEST_F(ModelTest, DSparkGreedyOutputEqualsPlainGreedy) {
  ASSERT_TRUE(model_->has_drafter());
  std::mt19937_64 rng(testing::FreshSeed());
  for (int64_t n : {40, 97}) {
    const std::vector<uint32_t> prompt = Prompt(rng, n);
    Sequence plain = model_->NewSequence(), spec = model_->NewSequence();
    absl::StatusOr<std::vector<float>> p0 = model_->Prefill(plain, prompt, PrefillMode::kCed);
    absl::StatusOr<std::vector<float>> s0 = model_->Prefill(spec, prompt, PrefillMode::kCed);
    ASSERT_TRUE(p0.ok() && s0.ok());
    // Drafting leaves the sequence as it was.
    const std::vector<uint32_t> d1 = *model_->Draft(spec, Argmax(*s0));
    EXPECT_EQ(d1.size(), static_cast<size_t>(config_->dspark_block_size));
    EXPECT_EQ(*model_->Draft(spec, Argmax(*s0)), d1);
    absl::StatusOr<Generation> a = GenerateGreedy(*model_, plain, *p0, 30, false);
    absl::StatusOr<Generation> b = GenerateGreedy(*model_, spec, *s0, 30, true);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->tokens, b->tokens);
    for (size_t i = 0; i < a->logits.size(); ++i) {
      ASSERT_EQ(std::memcmp(a->logits[i].data(), b->logits[i].data(), a->logits[i].size() * 4), 0)
          << "step " << i;
    }
    EXPECT_GT(b->drafted, 0);
    EXPECT_LE(b->main_passes, 29);  // never more main passes than plain decoding
    // Per depth: each depth's kept count is at most the one before it, and they sum to
    // the proposals kept.
    ASSERT_EQ(static_cast<int64_t>(b->kept_at_depth.size()), config_->dspark_block_size);
    int64_t sum = 0;
    for (size_t d = 0; d < b->kept_at_depth.size(); ++d) {
      EXPECT_LE(b->kept_at_depth[d], d == 0 ? b->main_passes : b->kept_at_depth[d - 1]) << d;
      sum += b->kept_at_depth[d];
    }
    EXPECT_EQ(sum, b->accepted);
  }
}

// Another shape (configs/tiny.json: other widths, window 16, ratio-2 and ratio-1 Full
// layers in the encoder and decoder, 1-of-4 experts, a 2-gram Engram, a 3-token DSpark
// block): exact resume and lossless DSpark hold there too.
TEST(ModelShapesTest, ExactResumeAndDSparkOnTheTinyConfig) {
  testing::TempDir dir;
  const ModelConfig c = *LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/tiny.json");
  const std::string w = dir.File("tiny.safetensors");
  ASSERT_TRUE(WriteRandomWeights(c, *BuildLayerSchedule(c), 11, w).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(c, w, 32);
  ASSERT_TRUE(m.ok()) << m.status();
  std::mt19937_64 rng(testing::FreshSeed());
  for (auto [cached, fresh] : {std::pair{32, 1}, {64, 9}, {96, 15}, {128, 70}}) {
    std::vector<uint32_t> prompt(cached + fresh);
    for (uint32_t& t : prompt) t = static_cast<uint32_t>(rng() % c.vocab_size);
    Sequence cold = (*m)->NewSequence(), prefix = (*m)->NewSequence(), warm = (*m)->NewSequence();
    const std::vector<float> a = *(*m)->Prefill(cold, prompt, PrefillMode::kCed);
    ASSERT_TRUE((*m)->Prefill(prefix, std::span(prompt).first(cached), PrefillMode::kCed).ok());
    std::vector<uint8_t> pages;
    for (int64_t k = 0; k < cached / 32; ++k)
      pages.insert(pages.end(), prefix.page(k).begin(), prefix.page(k).end());
    absl::StatusOr<std::vector<float>> b =
        (*m)->Resume(warm, pages, cached, prompt, ReplayMode::kExact);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(std::memcmp(a.data(), b->data(), a.size() * 4), 0) << cached << "+" << fresh;
    const Generation plain = *GenerateGreedy(**m, cold, a, 12, false);
    const Generation spec = *GenerateGreedy(**m, warm, *b, 12, true);
    EXPECT_EQ(plain.tokens, spec.tokens) << cached << "+" << fresh;
  }
}

TEST(EngramTest, ReferencePrimesMatchThePublishedVectors) {
  absl::StatusOr<ModelConfig> c =
      LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  // EngramPrimes also checks each layer's sum against engram_num_embeddings
  // (384006168 and 384016682).
  absl::StatusOr<std::vector<std::vector<int64_t>>> p = EngramPrimes(*c);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  ASSERT_EQ((*p)[0].size(), 24u);
  EXPECT_EQ((*p)[0][0], 16000057);
  EXPECT_EQ((*p)[0][1], 16000079);
  EXPECT_EQ((*p)[0][2], 16000081);
  EXPECT_EQ((*p)[1].back(), 16000889);
  int64_t sum0 = 0, sum1 = 0;
  for (int64_t v : (*p)[0]) sum0 += v;
  for (int64_t v : (*p)[1]) sum1 += v;
  EXPECT_EQ(sum0, 384006168);
  EXPECT_EQ(sum1, 384016682);
}

}  // namespace
}  // namespace kvc::model
