// The global-KV kernels against their CPU twins on random inputs (fresh seeds): FP4
// quantization and indexer scores bit for bit, sparse attention over window rows and FP4
// pages within a relative error (CUDA's expf differs from glibc's by up to 2 ulp).
// Skipped, saying so, where there is no GPU;
// the <test>_emu build runs the same checks on the CPU emulation of CUDA (tests/cudaemu).
#include "kernels/kv_ops.h"

#include <cmath>
#include <cstring>
#include <random>

#include "engine/cpu/ops.h"
#include "engine/model/layer_ops.h"
#include "gtest/gtest.h"
#include "kernels/kv_dequant.h"
#include "tests/testing/random.h"
#include "tests/testing/seed.h"

namespace kvc::cuda {
namespace {

class KvOpsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0)
      GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  }
};

using ::kvc::testing::NormalFloats;

// The mini config's first Full layer, with `chunks` pages of random compressed rows
// quantized into it, and those rows dequantized (what the CPU attends to).
struct RandomPages {
  ModelConfig config;
  LayerSchedule schedule;
  ChunkLayout layout;
  int64_t layer = 0;
  std::vector<uint8_t> pages;
  std::vector<float> rows;        // dequantized, positions × head_dim
  std::vector<float> index_rows;  // dequantized index keys, positions × index_head_dim
};

RandomPages MakeRandomPages(std::mt19937_64& rng, int64_t chunks, float scale) {
  RandomPages r;
  r.config = *LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  r.schedule = *BuildLayerSchedule(r.config);
  r.layout = *BuildChunkLayout(r.config, r.schedule, 64);
  r.layer = r.schedule.FullLayers()[0];
  const int64_t dim = r.config.head_dim;
  const ChunkSection& mc = r.layout.Section(r.layer, SectionKind::kMainCodes);
  const ChunkSection& ms = r.layout.Section(r.layer, SectionKind::kMainScales);
  const int64_t idim = r.config.index_head_dim;
  const ChunkSection& ic = r.layout.Section(r.layer, SectionKind::kIndexCodes);
  const ChunkSection& is = r.layout.Section(r.layer, SectionKind::kIndexScales);
  r.pages.resize(chunks * r.layout.chunk_bytes);
  r.rows.resize(chunks * mc.positions * dim);
  r.index_rows.resize(chunks * ic.positions * idim);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const std::vector<float> x = NormalFloats(rng, mc.positions * dim, scale);
    std::span<uint8_t> pg(r.pages.data() + ch * r.layout.chunk_bytes, r.layout.chunk_bytes);
    Quantize(KvFormat::kMainKv, x, pg.subspan(mc.offset, mc.bytes),
             pg.subspan(ms.offset, ms.bytes));
    Dequantize(KvFormat::kMainKv, pg.subspan(mc.offset, mc.bytes), pg.subspan(ms.offset, ms.bytes),
               std::span<float>(r.rows.data() + ch * mc.positions * dim, mc.positions * dim));
    const std::vector<float> k = NormalFloats(rng, ic.positions * idim, scale);
    Quantize(KvFormat::kIndexK, k, pg.subspan(ic.offset, ic.bytes),
             pg.subspan(is.offset, is.bytes));
    Dequantize(
        KvFormat::kIndexK, pg.subspan(ic.offset, ic.bytes), pg.subspan(is.offset, is.bytes),
        std::span<float>(r.index_rows.data() + ch * ic.positions * idim, ic.positions * idim));
  }
  return r;
}

// The engine's indexer score of query q against one key: an fma chain per head over the
// dimension, then the rectified, weighted head sum in head order.
float ReferenceIndexScore(const std::vector<float>& qi, const std::vector<float>& w, int64_t q,
                          const float* key, int64_t heads, int64_t dim) {
  float sc = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    float d = 0.0f;
    for (int64_t i = 0; i < dim; ++i) d = std::fmaf(qi[(q * heads + h) * dim + i], key[i], d);
    sc += std::max(d, 0.0f) * w[q * heads + h];
  }
  return sc;
}

TEST_F(KvOpsCudaTest, QuantizeMatchesTheCpuCodecByteForByte) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (KvFormat f : {KvFormat::kMainKv, KvFormat::kIndexK}) {
    for (float scale : {1e-6f, 0.3f, 4.0f, 3000.0f}) {
      const std::vector<float> x = NormalFloats(rng, 512 * 64, scale);
      std::vector<uint8_t> cc(CodesBytes(f, x.size())), cs(ScalesBytes(f, x.size()));
      std::vector<uint8_t> gc(cc.size()), gs(cs.size());
      Quantize(f, x, cc, cs);
      ASSERT_TRUE(QuantizeOnDevice(f, x, gc, gs).ok());
      EXPECT_EQ(gc, cc) << SpecOf(f).name << " codes, values of scale " << scale;
      EXPECT_EQ(gs, cs) << SpecOf(f).name << " scales, values of scale " << scale;
    }
  }
}

// Rounding to a format and back (the window KV row's FP8, the index query's FP4) is the
// CPU codec's, bit for bit: values of every magnitude, and blocks with NaN, inf and zeros.
TEST_F(KvOpsCudaTest, FakeQuantizeMatchesTheCpuCodecBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (KvFormat f : {KvFormat::kSwaKv, KvFormat::kIndexK, KvFormat::kMainKv}) {
    for (float scale : {1e-9f, 1e-6f, 0.3f, 4.0f, 3000.0f, 1e30f}) {
      std::vector<float> x = NormalFloats(rng, 64 * 64, scale);
      x[3] = NAN;                                       // block 0: a NaN
      x[40] = INFINITY;                                 // block 1: inf
      std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // a block of zeros
      x[200] = -INFINITY;
      std::vector<float> want = x;
      FakeQuantize(f, want);
      absl::StatusOr<std::vector<float>> got = FakeQuantizeOnDevice(f, x);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::memcmp(&(*got)[i], &want[i], 4), 0)
            << SpecOf(f).name << ", values of scale " << scale << ", element " << i << ": "
            << (*got)[i] << " vs the CPU's " << want[i];
      }
    }
  }
  EXPECT_FALSE(FakeQuantizeOnDevice(KvFormat::kSwaKv, std::vector<float>(33, 1.0f)).ok());
}

// Scores of `queries` random queries (heads × dim) against `positions` random keys, FP4
// rounded as the pages hold them when `fp4`, each the CPU's bits.
void ExpectIndexerScoresAreTheCpus(std::mt19937_64& rng, int64_t queries, int64_t heads,
                                   int64_t dim, int64_t positions, bool fp4) {
  std::vector<float> keys = NormalFloats(rng, positions * dim, 1.0f);
  std::vector<float> qi = NormalFloats(rng, queries * heads * dim, 1.0f);
  if (fp4) {
    FakeQuantize(KvFormat::kIndexK, keys);
    FakeQuantize(KvFormat::kIndexK, qi);
  }
  const std::vector<float> w = NormalFloats(rng, queries * heads, 0.2f);
  std::vector<int32_t> visible(queries);
  for (int32_t& v : visible) v = static_cast<int32_t>(rng() % (positions + 1));
  absl::StatusOr<std::vector<float>> got = IndexerScoresOnDevice(qi, w, keys, visible, heads, dim);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t q = 0; q < queries; ++q) {
    for (int64_t t = 0; t < positions; ++t) {
      const float want =
          t < visible[q] ? ReferenceIndexScore(qi, w, q, &keys[t * dim], heads, dim) : -INFINITY;
      ASSERT_EQ(std::memcmp(&(*got)[q * positions + t], &want, 4), 0) << q << "," << t;
    }
  }
}

TEST_F(KvOpsCudaTest, IndexerScoresMatchTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  ExpectIndexerScoresAreTheCpus(rng, /*queries=*/37, /*heads=*/4, /*dim=*/32, /*positions=*/300,
                                /*fp4=*/true);
}

// A prefill of more than 65535 queries is more than one launch can count in grid.y: the
// launchers go in slices, and every query — those past the first slice included — gets
// its own scores (small heads and keys keep this quick).
TEST_F(KvOpsCudaTest, ALaunchOfMoreQueriesThanGridYHoldsCoversEveryQuery) {
  std::mt19937_64 rng(testing::FreshSeed());
  ExpectIndexerScoresAreTheCpus(rng, /*queries=*/65535 + 700, /*heads=*/1, /*dim=*/4,
                                /*positions=*/3, /*fp4=*/false);
}

TEST_F(KvOpsCudaTest, SparseAttentionOverWindowAndFp4PagesMatchesTheCpu) {
  std::mt19937_64 rng(testing::FreshSeed());
  const RandomPages rp = MakeRandomPages(rng, 3, 2.0f);
  const ChunkLayout& layout = rp.layout;
  const std::vector<uint8_t>& pages = rp.pages;
  const std::vector<float>& compressed = rp.rows;
  const int64_t layer = rp.layer, dim = rp.config.head_dim, heads = rp.config.num_attention_heads;
  const int64_t rows = static_cast<int64_t>(compressed.size()) / dim;
  const int64_t window_rows = 20, queries = 9;
  const std::vector<float> window = NormalFloats(rng, window_rows * dim, 1.0f);
  const std::vector<float> q = NormalFloats(rng, queries * heads * dim, 0.3f),
                           sink = NormalFloats(rng, heads, 1.0f);
  std::vector<int32_t> offsets = {0}, list;
  for (int64_t i = 0; i < queries; ++i) {
    // 0 keys included; the last query has more keys than the twin stages at once (4096).
    const int64_t n = i == queries - 1 ? 9000 : static_cast<int64_t>(rng() % 24);
    for (int64_t k = 0; k < n; ++k) {
      list.push_back(rng() % 2 ? static_cast<int32_t>(rng() % window_rows)
                               : -static_cast<int32_t>(rng() % rows) - 1);
    }
    offsets.push_back(static_cast<int32_t>(list.size()));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (AttentionKernel kernel : {AttentionKernel::kTwin, AttentionKernel::kTiled}) {
    SCOPED_TRACE(kernel == AttentionKernel::kTwin ? "twin kernel" : "tiled kernel");
    absl::StatusOr<std::vector<float>> got = SparseAttentionOnDevice(
        q, heads, dim, window, pages, layout, layer, offsets, list, sink, scale, kernel);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<float> want(dim);
    for (int64_t i = 0; i < queries; ++i) {
      std::vector<const float*> keys;
      for (int32_t k = offsets[i]; k < offsets[i + 1]; ++k) {
        keys.push_back(list[k] >= 0 ? &window[list[k] * dim] : &compressed[(-list[k] - 1) * dim]);
      }
      for (int64_t h = 0; h < heads; ++h) {
        model::AttendHead(&q[(i * heads + h) * dim], keys, dim, sink[h], scale, want.data());
        for (int64_t e = 0; e < dim; ++e) {
          // The twin is the CPU op's arithmetic (ExpF on both sides): the same bits. The
          // tiled kernel sums in another order: within float rounding.
          if (kernel == AttentionKernel::kTwin) {
            ASSERT_EQ(std::memcmp(&(*got)[(i * heads + h) * dim + e], &want[e], 4), 0)
                << (*got)[(i * heads + h) * dim + e] << " vs " << want[e];
          }
          EXPECT_NEAR((*got)[(i * heads + h) * dim + e], want[e],
                      1e-5f * (1.0f + std::abs(want[e])))
              << "query " << i << " head " << h;
        }
      }
    }
  }
}

TEST_F(KvOpsCudaTest, IndexerReadingFp4PagesMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(testing::FreshSeed());
  const RandomPages rp = MakeRandomPages(rng, 3, 1.0f);
  const int64_t heads = rp.config.index_n_heads, dim = rp.config.index_head_dim;
  const int64_t positions = static_cast<int64_t>(rp.index_rows.size()) / dim, queries = 11;
  std::vector<float> qi = NormalFloats(rng, queries * heads * dim, 1.0f);
  FakeQuantize(KvFormat::kIndexK, qi);
  const std::vector<float> w = NormalFloats(rng, queries * heads, 0.2f);
  std::vector<int32_t> visible(queries);
  for (int32_t& v : visible) v = static_cast<int32_t>(rng() % (positions + 1));
  // Full: every position.
  absl::StatusOr<std::vector<float>> got = PagedIndexerScoresOnDevice(
      qi, w, rp.pages, rp.layout, rp.layer, visible, heads, dim, positions);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t q = 0; q < queries; ++q) {
    for (int64_t t = 0; t < positions; ++t) {
      const float want = t < visible[q]
                             ? ReferenceIndexScore(qi, w, q, &rp.index_rows[t * dim], heads, dim)
                             : -INFINITY;
      ASSERT_EQ(std::memcmp(&(*got)[q * positions + t], &want, 4), 0) << q << "," << t;
    }
  }
  // Reindex: listed positions only (a candidate pool), in list order.
  const int64_t per_query = 13;
  std::vector<int32_t> list(queries * per_query);
  for (int32_t& t : list) t = static_cast<int32_t>(rng() % positions);
  got = PagedIndexerScoresAtOnDevice(qi, w, rp.pages, rp.layout, rp.layer, list, heads, dim);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t q = 0; q < queries; ++q) {
    for (int64_t i = 0; i < per_query; ++i) {
      const int32_t t = list[q * per_query + i];
      const float want = ReferenceIndexScore(qi, w, q, &rp.index_rows[t * dim], heads, dim);
      ASSERT_EQ(std::memcmp(&(*got)[q * per_query + i], &want, 4), 0) << q << "," << t;
    }
  }
}

TEST_F(KvOpsCudaTest, PagesUploadedToTheDeviceServeAttentionAsIs) {
  std::mt19937_64 rng(testing::FreshSeed());
  const RandomPages rp = MakeRandomPages(rng, 4, 1.5f);
  const ChunkLayout& layout = rp.layout;
  const std::vector<uint8_t>& pages = rp.pages;
  const int64_t layer = rp.layer, dim = rp.config.head_dim, heads = rp.config.num_attention_heads;
  const ChunkSection& mc = layout.Section(layer, SectionKind::kMainCodes);
  absl::StatusOr<std::unique_ptr<DevicePages>> dev = DevicePages::Create(layout, 8);
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_TRUE(DevicePages::RegisterHost(pages).ok());
  ASSERT_TRUE((*dev)->UploadAsync(2, pages).ok());
  ASSERT_TRUE((*dev)->Synchronize().ok());
  DevicePages::UnregisterHost(pages);
  std::vector<uint8_t> back(pages.size());
  ASSERT_TRUE((*dev)->Download(2, back).ok());
  EXPECT_EQ(back, pages);
  EXPECT_FALSE((*dev)->UploadAsync(7, pages).ok()) << "past the capacity";
  // Attention reading pages 2..5 on the device equals attention over the uploaded copy.
  const std::vector<float> window = NormalFloats(rng, 4 * dim, 1.0f),
                           q = NormalFloats(rng, 2 * heads * dim, 0.3f),
                           sink = NormalFloats(rng, heads, 1.0f);
  const std::vector<int32_t> offsets = {0, 3, 5};
  const std::vector<int32_t> on_device = {0, -1 - 2 * static_cast<int32_t>(mc.positions), 2,
                                          -1 - 2 * static_cast<int32_t>(mc.positions) - 5, 3};
  const std::vector<int32_t> on_host = {0, -1, 2, -6, 3};
  absl::StatusOr<std::vector<float>> a = SparseAttentionOnDevice(
      q, heads, dim, window, **dev, 6, layer, offsets, on_device, sink, 0.125f);
  absl::StatusOr<std::vector<float>> b = SparseAttentionOnDevice(
      q, heads, dim, window, pages, layout, layer, offsets, on_host, sink, 0.125f);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

// Scores with many exact ties (a few distinct values) and some −inf, rows of varying
// visible length (0 and all included): what the selections must get exactly right.
std::vector<float> TiedScores(std::mt19937_64& rng, int64_t n) {
  std::vector<float> s = NormalFloats(rng, n, 2.0f);
  for (float& v : s) v = rng() % 9 == 0 ? -INFINITY : std::round(v * 2.0f) / 2.0f;
  return s;
}

TEST_F(KvOpsCudaTest, TopKSelectsTheCpusPositions) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t queries = 9, ld = 3000;  // rows longer than one pass of a block
  const std::vector<float> scores = TiedScores(rng, queries * ld);
  std::vector<int32_t> counts = {0, static_cast<int32_t>(ld)};
  while (static_cast<int64_t>(counts.size()) < queries)
    counts.push_back(static_cast<int32_t>(rng() % (ld + 1)));
  for (int64_t k : {1, 7, 512, 5000}) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> got = TopKOnDevice(scores, ld, counts, k);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t q = 0; q < queries; ++q) {
      const std::vector<int32_t> want =
          cpu::TopKAscending(std::span(scores).subspan(q * ld, counts[q]), k);
      EXPECT_EQ((*got)[q], want) << "k " << k << ", row " << q << " of " << counts[q];
    }
  }
}

TEST_F(KvOpsCudaTest, CandidatePoolHoldsTheCpusPositions) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t queries = 7, ld = 2500, block = 4;
  const std::vector<float> scores = TiedScores(rng, queries * ld);
  std::vector<int32_t> counts = {1, static_cast<int32_t>(ld)};
  while (static_cast<int64_t>(counts.size()) < queries)
    counts.push_back(static_cast<int32_t>(1 + rng() % ld));
  for (int64_t topk_blocks : {1, 16, 700}) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> got =
        CandidatePoolOnDevice(scores, ld, counts, block, topk_blocks);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t q = 0; q < queries; ++q) {
      const std::vector<uint8_t> mask =
          model::CandidateMask(std::span(scores).subspan(q * ld, counts[q]), block, topk_blocks);
      std::vector<int32_t> want;
      for (size_t t = 0; t < mask.size(); ++t)
        if (mask[t]) want.push_back(static_cast<int32_t>(t));
      EXPECT_EQ((*got)[q], want) << topk_blocks << " blocks, row " << q << " of " << counts[q];
    }
  }
}

// The lists the CUDA attention builds from a selection held on the device are the ones the
// model builds on the host: each query's own entries, then its selected rows as −j−1.
TEST_F(KvOpsCudaTest, ASelectionAppendedOnTheDeviceGivesTheHostsEntryLists) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int64_t queries = 1 + static_cast<int64_t>(rng() % 40),
                k = 1 + static_cast<int64_t>(rng() % 60);
  std::vector<int32_t> offsets = {0}, entries;
  std::vector<std::vector<int32_t>> lists(queries), picked(queries), positions(queries);
  for (int64_t q = 0; q < queries; ++q) {
    const int64_t own = static_cast<int64_t>(rng() % 130);  // window rows; 0 happens too
    for (int64_t i = 0; i < own; ++i) entries.push_back(static_cast<int32_t>(rng() % 1000));
    offsets.push_back(static_cast<int32_t>(entries.size()));
    // A candidate pool of ascending positions, and an ascending pick of up to k of them.
    for (int32_t t = 0; t < 3000; ++t)
      if (rng() % 8 == 0) lists[q].push_back(t);
    for (int32_t i = 0; i < static_cast<int32_t>(lists[q].size()); ++i) {
      if (static_cast<int64_t>(picked[q].size()) < k && rng() % 3 == 0) {
        picked[q].push_back(i);
        positions[q].push_back(lists[q][i]);
      }
    }
  }
  std::vector<int32_t> want_offsets = {0}, want;
  for (int64_t q = 0; q < queries; ++q) {
    want.insert(want.end(), entries.begin() + offsets[q], entries.begin() + offsets[q + 1]);
    for (int32_t j : positions[q]) want.push_back(-j - 1);
    want_offsets.push_back(static_cast<int32_t>(want.size()));
  }
  for (bool over_lists : {false, true}) {
    absl::StatusOr<EntryLists> got = AppendSelectionOnDevice(
        offsets, entries, over_lists ? picked : positions, k, over_lists ? &lists : nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->offsets, want_offsets) << (over_lists ? "over lists" : "positions");
    EXPECT_EQ(got->entries, want) << (over_lists ? "over lists" : "positions");
  }
  // Bad shapes are refused, naming what is wrong.
  std::vector<std::vector<int32_t>> too_many(queries, std::vector<int32_t>(k + 1, 0));
  absl::StatusOr<EntryLists> bad = AppendSelectionOnDevice(offsets, entries, too_many, k);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("more than k"), std::string::npos) << bad.status();
}

TEST(KvOpsCudaArgsTest, BadArgumentsAreRefusedWithoutTouchingTheDevice) {
  std::vector<float> x(33);
  std::vector<uint8_t> codes(16), scales(2);
  EXPECT_EQ(QuantizeOnDevice(KvFormat::kMainKv, x, codes, scales).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeOnDevice(KvFormat::kSwaKv, x, codes, scales).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> qi(10), w(2), keys(64);
  std::vector<int32_t> visible = {5};
  EXPECT_EQ(IndexerScoresOnDevice(qi, w, keys, visible, 2, 32).status().code(),
            absl::StatusCode::kInvalidArgument);
  const ModelConfig c = *LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  const LayerSchedule sched = *BuildLayerSchedule(c);
  const ChunkLayout layout = *BuildChunkLayout(c, sched, 64);
  const int64_t layer = sched.FullLayers()[0];
  std::vector<uint8_t> pages(layout.chunk_bytes);
  std::vector<float> q64(64), w2(2);
  EXPECT_EQ(PagedIndexerScoresOnDevice(q64, w2, pages, layout, layer, std::vector<int32_t>{1}, 2,
                                       32, 1 << 20)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // more positions than the pages hold
  EXPECT_EQ(
      PagedIndexerScoresAtOnDevice(q64, w2, pages, layout, layer, std::vector<int32_t>{-3}, 2, 32)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedIndexerScoresOnDevice(q64, w2, std::vector<uint8_t>(7), layout, layer,
                                       std::vector<int32_t>{1}, 2, 32, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // not whole chunks
  // A head dimension over the kernels' limit is refused, naming it.
  const int64_t big = kMaxAttentionDim + 16;
  const std::vector<int32_t> offsets = {0, 0};
  const absl::StatusOr<std::vector<float>> a =
      SparseAttentionOnDevice(std::vector<float>(big), 1, big, std::vector<float>(), pages, layout,
                              layer, offsets, std::vector<int32_t>(), std::vector<float>(1), 1.0f);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find(std::to_string(big)), std::string::npos) << a.status();
}

}  // namespace
}  // namespace kvc::cuda
