// The engine resuming from the real kvcached on loopback: multi-turn sessions equal the
// same sessions without a cache (exact replay, bit for bit), a restart between turns
// resumes from SSD with byte-exact pages, and every fault falls back to a cold prefill
// that says why.
#include "serve/cache_connector.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "client/client.h"
#include "client/stats.h"
#include "engine/model/generate.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "serve/session.h"
#include "storage/slot_format.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::serve {
namespace {

using ::kvc::testing::Daemon;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

class ConnectorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    config_json_ = new std::string(ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"));
    const ModelConfig c = *ParseModelConfig(*config_json_);
    const std::string w = dir_->File("mini.safetensors");
    ASSERT_TRUE(model::WriteRandomWeights(c, *BuildLayerSchedule(c), 5, w).ok());
    model_ = model::Model::Load(c, w)->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete config_json_;
    delete dir_;
  }
  ConnectorOptions Options(const std::string& address) const {
    ConnectorOptions o;
    o.client.address = address;
    o.client.timeout_ms = 5000;
    o.model_config_json = *config_json_;
    o.model_id = "mini-test";
    o.replay = model::ReplayMode::kExact;
    return o;
  }
  std::vector<uint32_t> Tokens(std::mt19937_64& rng, int64_t n) const {
    std::vector<uint32_t> t(n);
    for (uint32_t& v : t) v = static_cast<uint32_t>(rng() % 512);
    return t;
  }
  // A session without any cache: the reference.
  std::vector<std::vector<uint32_t>> ColdSession(const std::vector<std::vector<uint32_t>>& turns,
                                                 int64_t generate) const {
    std::vector<uint32_t> context;
    std::vector<std::vector<uint32_t>> out;
    for (const auto& t : turns) {
      context.insert(context.end(), t.begin(), t.end());
      model::Sequence s = model_->NewSequence();
      auto l = model_->Prefill(s, context, model::PrefillMode::kCed);
      EXPECT_TRUE(l.ok());
      auto g = model::GenerateGreedy(*model_, s, *l, generate, false);
      out.push_back(g->tokens);
      context.insert(context.end(), g->tokens.begin(), g->tokens.end());
    }
    return out;
  }

  TempDir data_;
  static TempDir* dir_;
  static std::string* config_json_;
  static model::Model* model_;
};
TempDir* ConnectorTest::dir_ = nullptr;
std::string* ConnectorTest::config_json_ = nullptr;
model::Model* ConnectorTest::model_ = nullptr;

TEST_F(ConnectorTest, SessionThroughTheCacheEqualsTheSessionWithoutIt) {
  std::mt19937_64 rng(testing::FreshSeed());
  Daemon d(data_.File("kvcached"));
  const std::vector<std::vector<uint32_t>> turns = {Tokens(rng, 700), Tokens(rng, 300),
                                                    Tokens(rng, 5), Tokens(rng, 420)};
  const auto reference = ColdSession(turns, 12);
  auto cache = CacheConnector::Create(*model_, Options(d.address()));
  ASSERT_TRUE(cache->connected()) << cache->connect_error();
  std::vector<uint32_t> context;
  for (size_t i = 0; i < turns.size(); ++i) {
    if (i == 2) {  // "the next day": the daemon restarts, the RAM tier is gone
      cache->Drain();
      cache.reset();
      d.Restart(SIGTERM);
      cache = CacheConnector::Create(*model_, Options(d.address()));
      ASSERT_TRUE(cache->connected());
    }
    context.insert(context.end(), turns[i].begin(), turns[i].end());
    absl::StatusOr<TurnResult> t = RunTurn(*model_, *cache, context, 12);
    ASSERT_TRUE(t.ok()) << t.status();
    cache->Drain();
    EXPECT_EQ(t->generated, reference[i]) << "turn " << i;
    EXPECT_TRUE(t->report.warnings.empty()) << t->report.warnings[0];
    if (i > 0) {
      EXPECT_GT(t->report.reused_tokens, 0) << "turn " << i;
      EXPECT_EQ(t->report.reused_tokens % 256, 0);
      EXPECT_LT(t->report.encoder_tokens, static_cast<int64_t>(context.size()));
    }
    if (i == 2) {
      EXPECT_EQ(t->report.tier, "ssd");
    }
    context.insert(context.end(), t->generated.begin(), t->generated.end());
  }
}

// Bounded replay (the model's own) through the cache stays within the engine's bounds of
// the same turns prefilled without a cache (docs/model.md): same contexts turn by turn,
// the first logits of each compared.
TEST_F(ConnectorTest, BoundedSessionStaysWithinTheEngineBounds) {
  std::mt19937_64 rng(testing::FreshSeed());
  Daemon d(data_.File("kvcached"));
  ConnectorOptions o = Options(d.address());
  o.replay = model::ReplayMode::kBounded;
  auto cache = CacheConnector::Create(*model_, o);
  std::vector<uint32_t> context;
  int agree = 0, turns = 0;
  double sum = 0, worst = 0;
  int64_t n = 0;
  for (int64_t fresh : {600, 40, 300, 7, 250, 90}) {
    const std::vector<uint32_t> t = Tokens(rng, fresh);
    context.insert(context.end(), t.begin(), t.end());
    model::Sequence cold = model_->NewSequence(), warm = model_->NewSequence();
    const std::vector<float> a = *model_->Prefill(cold, context, model::PrefillMode::kCed);
    TurnReport r;
    absl::StatusOr<std::vector<float>> b = cache->Prefill(warm, context, &r);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(r.warnings.empty());
    if (turns > 0) {
      EXPECT_GT(r.reused_tokens, 0);
    }
    cache->StoreNewChunks(warm);
    cache->Drain();
    agree += model::Argmax(a) == model::Argmax(*b);
    for (size_t k = 0; k < a.size(); ++k) {
      const double dk = std::abs(a[k] - (*b)[k]);
      sum += dk;
      worst = std::max(worst, dk);
      ++n;
    }
    ++turns;
  }
  std::printf("bounded session vs cold: top-1 %d/%d, mean |dlogit| %.4f, max %.4f\n", agree, turns,
              sum / n, worst);
  EXPECT_LT(sum / n, 0.5);
  EXPECT_LT(worst, 10.0);
  EXPECT_GE(agree, turns / 2);
}

TEST_F(ConnectorTest, FetchedPagesAreByteExactAfterARestart) {
  std::mt19937_64 rng(testing::FreshSeed());
  Daemon d(data_.File("kvcached"));
  const std::vector<uint32_t> prompt = Tokens(rng, 1100);
  model::Sequence cold = model_->NewSequence();
  ASSERT_TRUE(model_->Prefill(cold, prompt, model::PrefillMode::kCed).ok());
  {
    auto cache = CacheConnector::Create(*model_, Options(d.address()));
    cache->StoreNewChunks(cold);
    EXPECT_EQ(cache->Drain(), 4);
  }
  d.Restart(SIGKILL);  // durable stores survive a crash
  auto cache = CacheConnector::Create(*model_, Options(d.address()));
  const std::vector<storage::ChunkKey> keys = cache->client()->Keys(*cache->ns(), prompt);
  ASSERT_EQ(keys.size(), 4u);
  std::vector<uint8_t> pages(4 * model_->layout().chunk_bytes);
  ASSERT_EQ(*cache->client()->Fetch(*cache->ns(), keys, pages), 4u);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(std::memcmp(pages.data() + c * model_->layout().chunk_bytes, cold.page(c).data(),
                          model_->layout().chunk_bytes),
              0)
        << "chunk " << c;
  }
}

TEST_F(ConnectorTest, FaultsFallBackToAColdPrefillAndSaySo) {
  std::mt19937_64 rng(testing::FreshSeed());
  const std::vector<uint32_t> prompt = Tokens(rng, 1200);
  model::Sequence ref = model_->NewSequence();
  const std::vector<float> cold = *model_->Prefill(ref, prompt, model::PrefillMode::kCed);
  TurnReport r;
  // Service down: cold, with a warning.
  {
    ConnectorOptions o = Options("127.0.0.1:1");
    o.client.timeout_ms = 500;
    auto cache = CacheConnector::Create(*model_, o);
    EXPECT_FALSE(cache->connected());
    model::Sequence s = model_->NewSequence();
    absl::StatusOr<std::vector<float>> l = cache->Prefill(s, prompt, &r);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(*l, cold);
    ASSERT_EQ(r.warnings.size(), 1u);
    EXPECT_NE(r.warnings[0].find("cache unavailable"), std::string::npos) << r.warnings[0];
  }
  Daemon d(data_.File("kvcached"));
  {
    auto cache = CacheConnector::Create(*model_, Options(d.address()));
    cache->StoreNewChunks(ref);
    ASSERT_EQ(cache->Drain(), 4);
  }
  // A chunk evicted between Lookup and Fetch: resume from the chunks before it.
  {
    ConnectorOptions o = Options(d.address());
    o.after_lookup = [&](const std::vector<storage::ChunkKey>& keys) {
      auto c = client::CacheClient::Connect(o.client);
      auto ns = (*c)->RegisterNamespace(o.model_config_json, o.model_id, 256);
      ASSERT_EQ(*(*c)->Delete(*ns, std::span(keys).subspan(2, 1)), 1u);
    };
    auto cache = CacheConnector::Create(*model_, o);
    model::Sequence s = model_->NewSequence();
    absl::StatusOr<std::vector<float>> l = cache->Prefill(s, prompt, &r);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(r.matched_tokens, 4 * 256);
    EXPECT_EQ(r.reused_tokens, 2 * 256);
    EXPECT_EQ(*l, cold) << "exact replay from 2 chunks";
    ASSERT_EQ(r.warnings.size(), 1u);
    EXPECT_NE(r.warnings[0].find("chunk 2 of 4 could not be fetched after the lookup"),
              std::string::npos)
        << r.warnings[0];
  }
  // A checksum failure on SSD: the bytes are never handed out; the engine goes cold.
  d.Stop(SIGTERM);
  // The session's chunks are in the slabs of their size class: kvcached's first class
  // (slabs/) is the reference model's chunk, any other size has slabs/c<slot bytes>/.
  const uint64_t slot_bytes = storage::SlotBytesFor(model_->layout().chunk_bytes);
  std::string slab =
      data_.File("kvcached") + "/slabs/c" + std::to_string(slot_bytes) + "/slab-000000.dat";
  if (access(slab.c_str(), F_OK) != 0) slab = data_.File("kvcached") + "/slabs/slab-000000.dat";
  for (int slot = 0; slot < 4; ++slot) {  // every slot the session's chunks may be in
    const int fd = open(slab.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t at = static_cast<off_t>(slot * slot_bytes + storage::kSlotHeaderBytes + 100);
    char b = 0;
    if (pread(fd, &b, 1, at) == 1) {
      b ^= 0x10;
      ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);
  }
  d.Start();
  {
    auto cache = CacheConnector::Create(*model_, Options(d.address()));
    model::Sequence s = model_->NewSequence();
    absl::StatusOr<std::vector<float>> l = cache->Prefill(s, prompt, &r);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(*l, cold);
    EXPECT_EQ(r.reused_tokens, 0);
    ASSERT_FALSE(r.warnings.empty());
    EXPECT_NE(r.warnings[0].find("checksum"), std::string::npos) << r.warnings[0];
  }
}

TEST_F(ConnectorTest, SessionsSharingASystemPromptShareItsChunks) {
  std::mt19937_64 rng(testing::FreshSeed());
  Daemon d(data_.File("kvcached"));
  const std::vector<uint32_t> system = Tokens(rng, 512);
  auto cache = CacheConnector::Create(*model_, Options(d.address()));
  for (int session = 0; session < 2; ++session) {
    std::vector<uint32_t> context = system;
    const std::vector<uint32_t> own = Tokens(rng, 300);
    context.insert(context.end(), own.begin(), own.end());
    absl::StatusOr<TurnResult> t = RunTurn(*model_, *cache, context, 4);
    ASSERT_TRUE(t.ok());
    cache->Drain();
    EXPECT_EQ(t->report.reused_tokens, session == 0 ? 0 : 512) << "session " << session;
  }
  // Two sessions of 3 chunks each (2 shared + 1 own): 4 chunks in the cache, not 6.
  const kvcache::v1::StatsResponse st =
      *dynamic_cast<client::CacheClient&>(*cache->client()).Stats();
  EXPECT_EQ(st.ram_chunks(), 4u);
}

}  // namespace
}  // namespace kvc::serve
