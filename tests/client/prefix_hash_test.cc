// Chained prefix keys against vectors written by an independent Python implementation
// (scripts/prefix_hash_vectors.py), plus the properties clients rely on.
#include "client/prefix_hash.h"

#include <cstring>
#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/spec/config_fixtures.h"
#include "tests/testing/seed.h"

namespace kvc::client {
namespace {

nlohmann::json Vectors() {
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/client/prefix_hash_vectors.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

ChunkLayout ReferenceLayout() {
  const ModelConfig c = testing::ParseOrDie(testing::LoadJson(testing::kReferenceConfig()));
  return *BuildChunkLayout(c, *BuildLayerSchedule(c), kDefaultChunkTokens);
}

TEST(PrefixHashTest, MatchesPublishedVectors) {
  const nlohmann::json v = Vectors();
  const ChunkKey fp = ModelFingerprint(v["model_id"], ReferenceLayout());
  ASSERT_EQ(fp.Hex(), v["model_fingerprint"].get<std::string>());
  int checked = 0;
  for (const auto& t : v["vectors"]) {
    const ChunkKey root = NamespaceRoot(t["tenant"], fp, t["kv_layout_version"], t["chunk_tokens"]);
    EXPECT_EQ(root.Hex(), t["root_key"].get<std::string>()) << t["tenant"];
    const std::vector<uint32_t> tokens = t["tokens"].get<std::vector<uint32_t>>();
    const std::vector<ChunkKey> keys = ChunkKeys(root, tokens, t["chunk_tokens"]);
    ASSERT_EQ(keys.size(), t["chunk_keys"].size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(keys[i].Hex(), t["chunk_keys"][i].get<std::string>())
          << t["tenant"] << " chunk " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST(PrefixHashTest, CallerKeysMatchPublishedVectors) {
  const nlohmann::json v = Vectors();
  int checked = 0;
  for (const auto& ns : v["caller_vectors"]) {
    const ChunkKey root =
        CallerNamespaceRoot(ns["tenant"], ns["model_id"], ns["page_bytes"], ns["page_tokens"]);
    EXPECT_EQ(root.Hex(), ns["root_key"].get<std::string>()) << ns["tenant"];
    for (const auto& k : ns["keys"]) {
      EXPECT_EQ(CallerChunkKey(root, FromHex(k["caller_key"])).Hex(),
                k["chunk_key"].get<std::string>())
          << k["caller_key"];
      ++checked;
    }
  }
  EXPECT_GE(checked, 12);
}

TEST(PrefixHashTest, CallerKeysDependOnTheNamespaceAndEveryByte) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::string key(1 + rng() % kMaxCallerKeyBytes, '\0');
  for (char& c : key) c = static_cast<char>(rng());
  const ChunkKey root = CallerNamespaceRoot("t", "m", 4096, 16);
  const ChunkKey k = CallerChunkKey(root, key);
  std::string flipped = key;
  flipped[rng() % key.size()] ^= 1;
  EXPECT_NE(CallerChunkKey(root, flipped), k);
  EXPECT_NE(CallerChunkKey(root, key + '\0'), k);  // the length is hashed too
  EXPECT_NE(CallerChunkKey(CallerNamespaceRoot("u", "m", 4096, 16), key), k);
  EXPECT_NE(CallerChunkKey(CallerNamespaceRoot("t", "m2", 4096, 16), key), k);
  EXPECT_NE(CallerChunkKey(CallerNamespaceRoot("t", "m", 4097, 16), key), k);
  EXPECT_NE(CallerChunkKey(CallerNamespaceRoot("t", "m", 4096, 32), key), k);
}

// The first binding rule has the input shape of a token-chain step: a chain whose parent
// is the 16 ASCII bytes "kvcache-scope-v1" and whose 8 tokens are the root and key's words
// reaches any bound key (the attack a legacy unbound namespace could make). The separated
// rule is 49 bytes long, a length no chain step has; its keys are not the first rule's.
TEST(PrefixHashTest, TheSeparatedBindingIsNoTokenChainStep) {
  std::mt19937_64 rng(testing::FreshSeed());
  ChunkKey root, key, parent;
  for (size_t i = 0; i < 16; ++i) {
    root.bytes[i] = static_cast<uint8_t>(rng());
    key.bytes[i] = static_cast<uint8_t>(rng());
  }
  std::memcpy(parent.bytes.data(), "kvcache-scope-v1", 16);
  std::vector<uint32_t> words(8);
  std::memcpy(words.data(), root.bytes.data(), 16);
  std::memcpy(words.data() + 4, key.bytes.data(), 16);
  EXPECT_EQ(NextChunkKey(parent, words), BoundChunkKey(root, key)) << "the first rule's shape";
  EXPECT_NE(BoundChunkKeyV2(root, key), BoundChunkKey(root, key));
  std::memcpy(parent.bytes.data(), kBindingTagV2, 16);
  EXPECT_NE(NextChunkKey(parent, words), BoundChunkKeyV2(root, key));
  // Bound to its root and key, every byte.
  ChunkKey other = key;
  other.bytes[rng() % 16] ^= 1;
  EXPECT_NE(BoundChunkKeyV2(root, other), BoundChunkKeyV2(root, key));
  EXPECT_NE(BoundChunkKeyV2(key, root), BoundChunkKeyV2(root, key));
}

TEST(PrefixHashTest, KeysDependOnEverythingBeforeThem) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::vector<uint32_t> tokens(64 * 5);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % 129280);
  const ChunkKey fp = ModelFingerprint("m", ReferenceLayout());
  const ChunkKey root = NamespaceRoot("t", fp, kKvLayoutVersion, 64);
  const std::vector<ChunkKey> base = ChunkKeys(root, tokens, 64);
  ASSERT_EQ(base.size(), 5u);
  // Changing one token of chunk 2 changes keys 2.. and leaves 0..1 alone.
  std::vector<uint32_t> changed = tokens;
  changed[2 * 64 + rng() % 64] ^= 1;
  const std::vector<ChunkKey> after = ChunkKeys(root, changed, 64);
  EXPECT_EQ(after[0], base[0]);
  EXPECT_EQ(after[1], base[1]);
  for (size_t i = 2; i < 5; ++i) EXPECT_NE(after[i], base[i]) << i;
  // Tenants, models, layout versions and chunk sizes each give another root.
  EXPECT_NE(NamespaceRoot("u", fp, kKvLayoutVersion, 64), root);
  EXPECT_NE(NamespaceRoot("t", ModelFingerprint("m2", ReferenceLayout()), kKvLayoutVersion, 64),
            root);
  EXPECT_NE(NamespaceRoot("t", fp, kKvLayoutVersion + 1, 64), root);
  EXPECT_NE(NamespaceRoot("t", fp, kKvLayoutVersion, 128), root);
  // A partial tail is not a chunk.
  EXPECT_EQ(ChunkKeys(root, std::span(tokens).first(64 * 2 + 63), 64).size(), 2u);
}

}  // namespace
}  // namespace kvc::client
