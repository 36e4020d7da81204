// The namespace registry: an append-only log (a registration never rewrites the file),
// durable across reopen, a torn tail dropped, an older kvcached's file converted, a
// per-tenant limit, and chunk keys bound to their namespace (older namespaces kept as
// they were stored).
#include "cachesvc/namespace_registry.h"

#include "client/prefix_hash.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::TempDir;

// A namespace of `tenant` whose root is unique per (tenant, n).
NamespaceInfo Info(const std::string& tenant, uint64_t n) {
  NamespaceInfo i;
  i.tenant = tenant;
  i.model_id = "model-" + std::to_string(n);
  i.chunk_tokens = 256;
  i.chunk_bytes = 227840;
  i.vocab_size = 129280;
  std::memcpy(i.root.bytes.data(), &n, sizeof n);
  i.root.bytes[8] = tenant.empty() ? 0 : static_cast<uint8_t>(tenant[0]);
  return i;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(NamespaceRegistryTest, ARegistrationAppendsOneLineAndNeverRewritesTheFile) {
  TempDir dir;
  auto r = *NamespaceRegistry::Open(dir.path());
  for (uint64_t n = 0; n < 500; ++n) ASSERT_TRUE(r->FindOrAdd(Info("acme", n)).ok());
  const std::string log = dir.path() + "/namespaces.jsonl";
  struct stat before {};
  ASSERT_EQ(stat(log.c_str(), &before), 0);
  const std::string text = ReadAll(log);
  absl::StatusOr<NamespaceInfo> added = r->FindOrAdd(Info("acme", 500));
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added->id, 501u);
  struct stat after {};
  ASSERT_EQ(stat(log.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the file was replaced";
  const std::string grown = ReadAll(log);
  EXPECT_EQ(grown.substr(0, text.size()), text) << "earlier entries were rewritten";
  EXPECT_EQ(std::count(grown.begin(), grown.end(), '\n'), 501);
  // The same registration again is the same namespace and writes nothing.
  EXPECT_EQ(r->FindOrAdd(Info("acme", 7))->id, 8u);
  EXPECT_EQ(ReadAll(log), grown);
}

TEST(NamespaceRegistryTest, EntriesSurviveReopenAndATornTailIsDropped) {
  TempDir dir;
  {
    auto r = *NamespaceRegistry::Open(dir.path());
    for (uint64_t n = 0; n < 5; ++n) ASSERT_TRUE(r->FindOrAdd(Info("acme", n)).ok());
  }
  // A crash in the middle of the sixth append.
  std::ofstream(dir.path() + "/namespaces.jsonl", std::ios::app) << "{\"id\": 6, \"tena";
  auto r = NamespaceRegistry::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)->All().size(), 5u);
  EXPECT_EQ((*r)->Get(3, "acme")->model_id, "model-2");
  EXPECT_FALSE((*r)->Get(3, "globex").has_value());
  ASSERT_EQ((*r)->FindOrAdd(Info("acme", 5))->id, 6u);
  r->reset();
  auto again = NamespaceRegistry::Open(dir.path());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->All().size(), 6u);
  // Damage before the tail is not a torn append: refused, never silently dropped.
  again->reset();
  std::string text = ReadAll(dir.path() + "/namespaces.jsonl");
  text[text.find("tenant")] = '#';
  std::ofstream(dir.path() + "/namespaces.jsonl", std::ios::trunc) << text;
  EXPECT_TRUE(absl::IsDataLoss(NamespaceRegistry::Open(dir.path()).status()));
}

TEST(NamespaceRegistryTest, AnOlderKvcachedsFileIsConverted) {
  TempDir dir;
  std::ofstream(dir.path() + "/namespaces.json")
      << R"([{"id": 4, "tenant": "acme", "model_id": "m", "chunk_tokens": 64, )"
      << R"("chunk_bytes": 6784, "vocab_size": 512, "root_key": "000102030405060708090a0b0c0d0e0f"}])";
  auto r = NamespaceRegistry::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->Get(4, "acme").has_value());
  EXPECT_EQ((*r)->Get(4, "acme")->root.bytes[15], 0x0f);
  EXPECT_EQ((*r)->FindOrAdd(Info("acme", 1))->id, 5u);
  EXPECT_FALSE(std::ifstream(dir.path() + "/namespaces.json").good());
  r->reset();
  EXPECT_EQ((*NamespaceRegistry::Open(dir.path()))->All().size(), 2u);
}

TEST(NamespaceRegistryTest, ATenantPastItsLimitIsRefusedOthersAreNot) {
  TempDir dir;
  auto r = *NamespaceRegistry::Open(dir.path(), /*max_per_tenant=*/3);
  for (uint64_t n = 0; n < 3; ++n) ASSERT_TRUE(r->FindOrAdd(Info("acme", n)).ok());
  absl::StatusOr<NamespaceInfo> over = r->FindOrAdd(Info("acme", 3));
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("tenant acme has registered 3 namespaces; the limit is 3"),
            std::string::npos)
      << over.status();
  EXPECT_TRUE(r->FindOrAdd(Info("acme", 1)).ok());  // an existing one is found, not added
  EXPECT_TRUE(r->FindOrAdd(Info("globex", 0)).ok());
  EXPECT_EQ(r->All().size(), 4u);
}

// The same caller key in two namespaces is two storage keys; a namespace an older
// kvcached registered (no key_scope in its line) keeps its keys as given, so the chunks it
// stored are found after the upgrade; a new one is bound, and stays bound across reopen.
TEST(NamespaceRegistryTest, KeysAreBoundToTheirNamespaceExceptAnOlderKvcachedsOnes) {
  TempDir dir;
  std::ofstream(dir.path() + "/namespaces.jsonl")
      << R"({"id": 1, "tenant": "acme", "model_id": "m", "chunk_tokens": 64, )"
      << R"("chunk_bytes": 6784, "vocab_size": 512, "root_key": "000102030405060708090a0b0c0d0e0f"})"
      << "\n";
  storage::ChunkKey key;
  for (size_t i = 0; i < 16; ++i) key.bytes[i] = static_cast<uint8_t>(0xA0 + i);
  {
    auto r = NamespaceRegistry::Open(dir.path());
    ASSERT_TRUE(r.ok()) << r.status();
    const NamespaceInfo old = *(*r)->Get(1, "acme");
    EXPECT_EQ(old.key_scope, 0u);
    EXPECT_EQ(StorageKey(old, key), key) << "an older namespace's chunks stay where they are";
    NamespaceInfo a = Info("acme", 7), b = Info("globex", 7);
    a.key_scope = b.key_scope = kKeyScopeBound;
    const NamespaceInfo na = *(*r)->FindOrAdd(a), nb = *(*r)->FindOrAdd(b);
    EXPECT_NE(StorageKey(na, key), key);
    EXPECT_NE(StorageKey(na, key), StorageKey(nb, key)) << "one key, two namespaces, two chunks";
    EXPECT_EQ(StorageKey(na, key), client::BoundChunkKey(na.root, key));
  }
  auto r = NamespaceRegistry::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Get(1, "acme")->key_scope, 0u);
  EXPECT_EQ((*r)->Get(2, "acme")->key_scope, kKeyScopeBound);
  EXPECT_EQ((*r)->Get(3, "globex")->key_scope, kKeyScopeBound);
}

}  // namespace
}  // namespace kvc::cachesvc

namespace kvc::cachesvc {
namespace {

// A caller-keyed namespace keeps its mode across a reopen; a line an older kvcached wrote
// (no key_mode) is token-keyed; an unknown mode is refused as damage, not guessed.
TEST(NamespaceRegistryTest, KeyModeSurvivesReopenAndUnknownModesAreRefused) {
  TempDir dir;
  {
    auto r = NamespaceRegistry::Open(dir.path());
    ASSERT_TRUE(r.ok()) << r.status();
    NamespaceInfo caller = Info("acme", 9);
    caller.key_mode = kKeysFromCaller;
    caller.vocab_size = 0;
    ASSERT_TRUE((*r)->FindOrAdd(caller).ok());
    ASSERT_TRUE((*r)->FindOrAdd(Info("acme", 10)).ok());
  }
  {
    auto r = NamespaceRegistry::Open(dir.path());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->Get(1, "acme")->key_mode, kKeysFromCaller);
    EXPECT_EQ((*r)->Get(2, "acme")->key_mode, kKeysFromTokens);
  }
  std::ofstream(dir.path() + "/namespaces.jsonl", std::ios::app)
      << R"({"id": 3, "tenant": "acme", "model_id": "m", "chunk_tokens": 64, "chunk_bytes": 1, )"
      << R"("vocab_size": 0, "root_key": "000102030405060708090a0b0c0d0e0f", "key_mode": 7})"
      << "\n";
  auto r = NamespaceRegistry::Open(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("key_mode"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace kvc::cachesvc
