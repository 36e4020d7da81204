// Tombstones: kept across a reopen (a torn last record dropped, a damaged one refused),
// gone after keep_s, cleared by a new store, and at most max_entries live (oldest first).
#include "cachesvc/tombstones.h"

#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::TempDir;

storage::ChunkKey RandomKey(std::mt19937_64& rng) {
  storage::ChunkKey k;
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

struct Clock {
  int64_t now = 1'700'000'000;
  std::function<int64_t()> fn() {
    return [this] { return now; };
  }
};

TEST(TombstonesTest, KeptAcrossReopenUntilTheyExpireAndClearedByANewStore) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Clock clock;
  Tombstones::Options o;
  o.keep_s = 100;
  o.now_s = clock.fn();
  std::vector<storage::ChunkKey> keys;
  for (int i = 0; i < 10; ++i) keys.push_back(RandomKey(rng));
  {
    auto t = *Tombstones::Open(dir.path(), o);
    EXPECT_FALSE(t->Deleted(1, keys[0]));
    ASSERT_TRUE(t->Add(1, std::span(keys).first(5)).ok());
    clock.now += 60;
    ASSERT_TRUE(t->Add(1, std::span(keys).subspan(5)).ok());
    ASSERT_TRUE(t->Clear(1, keys[9]).ok());
    EXPECT_TRUE(t->Deleted(1, keys[0]));
    EXPECT_FALSE(t->Deleted(2, keys[0])) << "another namespace's key";
    EXPECT_FALSE(t->Deleted(1, keys[9])) << "stored again";
  }
  // A crash in the middle of the next record.
  std::ofstream(dir.path() + "/tombstones.log", std::ios::app) << std::string(17, '\x01');
  clock.now += 50;  // the first five are 110 s old: gone; the others 50 s
  {
    auto t = Tombstones::Open(dir.path(), o);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 5; ++i) EXPECT_FALSE((*t)->Deleted(1, keys[i])) << i;
    for (int i = 5; i < 9; ++i) EXPECT_TRUE((*t)->Deleted(1, keys[i])) << i;
    EXPECT_FALSE((*t)->Deleted(1, keys[9]));
    EXPECT_EQ((*t)->size(), 4u);
    clock.now += 50;
    EXPECT_FALSE((*t)->Deleted(1, keys[5])) << "expired while open";
  }
}

TEST(TombstonesTest, ADamagedRecordIsRefusedNamingIt) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  {
    auto t = *Tombstones::Open(dir.path(), {});
    std::vector<storage::ChunkKey> keys = {RandomKey(rng), RandomKey(rng)};
    ASSERT_TRUE(t->Add(7, keys).ok());
  }
  {
    std::fstream f(dir.path() + "/tombstones.log", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40 + 20);
    f.put('\x55');
  }
  const auto t = Tombstones::Open(dir.path(), {});
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("record 1"), std::string::npos) << t.status();
}

TEST(TombstonesTest, AtMostMaxEntriesLiveTheOldestGoFirst) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Clock clock;
  Tombstones::Options o;
  o.max_entries = 8;
  o.now_s = clock.fn();
  auto t = *Tombstones::Open(dir.path(), o);
  std::vector<storage::ChunkKey> keys;
  for (int i = 0; i < 12; ++i) {
    keys.push_back(RandomKey(rng));
    ASSERT_TRUE(t->Add(3, std::span(&keys.back(), 1)).ok());
    ++clock.now;
  }
  EXPECT_EQ(t->size(), 8u);
  EXPECT_EQ(t->dropped_early(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(t->Deleted(3, keys[i])) << i;
  for (int i = 4; i < 12; ++i) EXPECT_TRUE(t->Deleted(3, keys[i])) << i;
}

}  // namespace
}  // namespace kvc::cachesvc
