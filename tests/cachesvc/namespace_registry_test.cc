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

namespace kvc::cachesvc {
namespace {

// A tenant's names and its share of the log are bounded: a long model_id is refused naming
// the field, and past max_bytes_per_tenant its registrations are refused while another
// tenant's go on; the share is counted again from the log after a reopen.
TEST(NamespaceRegistryTest, NamesAndEachTenantsBytesAreBounded) {
  TempDir dir;
  RegistryLimits limits;
  limits.max_bytes_per_tenant = 1500;
  {
    auto r = *NamespaceRegistry::Open(dir.path(), limits);
    NamespaceInfo long_id = Info("acme", 1);
    long_id.model_id = std::string(257, 'm');
    const absl::StatusOr<NamespaceInfo> refused = r->FindOrAdd(long_id);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_NE(refused.status().message().find("model_id is 257 bytes; the limit is 256"),
              std::string::npos)
        << refused.status();
    uint64_t n = 0;
    absl::StatusOr<NamespaceInfo> added;
    while ((added = r->FindOrAdd(Info("acme", n))).ok()) ++n;
    EXPECT_TRUE(absl::IsResourceExhausted(added.status())) << added.status();
    EXPECT_NE(added.status().message().find("--max-registry-bytes-per-tenant"), std::string::npos);
    EXPECT_GE(n, 3u);
    EXPECT_LE(n, 10u);
    EXPECT_TRUE(r->FindOrAdd(Info("globex", 0)).ok());
    EXPECT_TRUE(r->FindOrAdd(Info("acme", 0)).ok()) << "a registered namespace is found";
  }
  auto r = *NamespaceRegistry::Open(dir.path(), limits);
  EXPECT_TRUE(absl::IsResourceExhausted(r->FindOrAdd(Info("acme", 99)).status()));
}

// A log line that breaks a rule fails the open naming its line and the rule.
TEST(NamespaceRegistryTest, ALogThatBreaksARuleIsRefusedNamingTheLine) {
  const auto line = [](uint64_t id, const std::string& tenant, const std::string& root,
                       const std::string& chunk_bytes) {
    return R"({"id": )" + std::to_string(id) + R"(, "tenant": ")" + tenant +
           R"(", "model_id": "m", "chunk_tokens": 64, "chunk_bytes": )" + chunk_bytes +
           R"(, "vocab_size": 512, "root_key": ")" + root + "\"}\n";
  };
  const std::string root_a = "000102030405060708090a0b0c0d0e0f";
  const std::string root_b = "100102030405060708090a0b0c0d0e0f";
  struct Case {
    std::string log;
    std::string says;
  } cases[] = {
      {line(1, "acme", root_a, "4096") + line(1, "globex", root_b, "4096"),
       "namespaces.jsonl:2: storage id 1 is already"},
      {line(1, "acme", root_a, "4096") + line(2, "acme", root_a, "4096"),
       "namespaces.jsonl:2: tenant acme and root " + root_a + " are registered twice"},
      {line(1, "acme", root_a, "1099511627776"),
       "namespaces.jsonl:1: chunk_bytes is 1099511627776"},
      {line(1, "acme", root_a, "0"), "namespaces.jsonl:1: chunk_bytes is 0"},
      {line(1, "", root_a, "4096"), "namespaces.jsonl:1: tenant is empty"},
      {line(4294967296, "acme", root_a, "4096"), "id must be 1 to 2^32-1"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    std::ofstream(dir.path() + "/namespaces.jsonl") << c.log;
    const auto r = NamespaceRegistry::Open(dir.path());
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status();
  }
}

// New namespaces bind keys with the domain-separated rule; one bound by the first rule keeps
// it across a reopen, so its chunks stay found.
TEST(NamespaceRegistryTest, NewNamespacesBindKeysWithTheSeparatedRule) {
  TempDir dir;
  storage::ChunkKey key;
  for (size_t i = 0; i < 16; ++i) key.bytes[i] = static_cast<uint8_t>(0x50 + i);
  {
    auto r = *NamespaceRegistry::Open(dir.path());
    NamespaceInfo v1 = Info("acme", 1), v2 = Info("acme", 2);
    v1.key_scope = kKeyScopeBound;
    v2.key_scope = kKeyScopeLatest;
    ASSERT_TRUE(r->FindOrAdd(v1).ok());
    ASSERT_TRUE(r->FindOrAdd(v2).ok());
  }
  auto r = *NamespaceRegistry::Open(dir.path());
  const NamespaceInfo v1 = *r->Get(1, "acme"), v2 = *r->Get(2, "acme");
  EXPECT_EQ(v1.key_scope, kKeyScopeBound);
  EXPECT_EQ(v2.key_scope, kKeyScopeSeparated);
  EXPECT_EQ(StorageKey(v1, key), client::BoundChunkKey(v1.root, key));
  EXPECT_EQ(StorageKey(v2, key), client::BoundChunkKeyV2(v2.root, key));
  EXPECT_NE(client::BoundChunkKeyV2(v1.root, key), client::BoundChunkKey(v1.root, key));
}

}  // namespace
}  // namespace kvc::cachesvc
