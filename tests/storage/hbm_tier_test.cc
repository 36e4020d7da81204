// The HBM tier's bookkeeping over an arena in host memory (the CUDA arena is exercised by
// tests/kernels/hbm_ipc_test.cc on machines with a GPU): round trips, LRU eviction that
// never takes a leased slot, deletes that wait for leases, and concurrent use with every
// leased read checked against the bytes that were put.
#include "storage/hbm_tier.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/host_arena.h"
#include "tests/testing/seed.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::HostArena;

constexpr uint64_t kSlot = 1024;

ChunkKey Key(uint64_t i) {
  ChunkKey k;
  std::memcpy(k.bytes.data(), &i, sizeof i);
  k.bytes[15] = 0xA5;
  return k;
}

// The chunk's bytes follow from its key and a per-run seed (so a mix-up shows).
std::vector<uint8_t> Bytes(uint64_t i, uint64_t seed, size_t n = kSlot - 24) {
  std::mt19937_64 rng(seed ^ (i * 0x9E3779B97F4A7C15ull));
  std::vector<uint8_t> b(n);
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  return b;
}

std::unique_ptr<HbmTier> Tier(uint64_t slots) {
  absl::StatusOr<std::unique_ptr<HbmTier>> t =
      HbmTier::Create(std::make_unique<HostArena>(slots * kSlot + 100), kSlot);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::vector<uint8_t> ReadLeased(const HbmTier& t, const HbmLease& l) {
  std::vector<uint8_t> out(l.length());
  EXPECT_TRUE(t.arena().Read(l.offset(), out).ok());
  return out;
}

TEST(HbmTierTest, PutThenLeaseReadsTheSameBytes) {
  const uint64_t seed = testing::FreshSeed();
  auto t = Tier(4);
  EXPECT_EQ(t->stats().slots, 4u);
  ASSERT_TRUE(t->Put(7, Key(1), Bytes(1, seed)).ok());
  ASSERT_TRUE(t->Put(7, Key(1), Bytes(1, seed)).ok());  // present: nothing copied again
  EXPECT_EQ(t->stats().puts, 1u);
  absl::StatusOr<HbmLease> l = t->Lease(7, Key(1));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(ReadLeased(*t, *l), Bytes(1, seed));
  EXPECT_EQ(l->offset() % 512, 0u);
  EXPECT_EQ(t->Lease(8, Key(1)).status().code(), absl::StatusCode::kNotFound)  // other namespace
      << "namespaces do not share chunks";
  EXPECT_EQ(t->stats().hits, 1u);
  EXPECT_EQ(t->stats().misses, 1u);
}

TEST(HbmTierTest, EvictsTheLeastRecentlyUsedAndNeverALeasedChunk) {
  const uint64_t seed = testing::FreshSeed();
  auto t = Tier(3);
  for (uint64_t i : {1, 2, 3}) ASSERT_TRUE(t->Put(1, Key(i), Bytes(i, seed)).ok());
  { ASSERT_TRUE(t->Lease(1, Key(1)).ok()); }  // 1 is now the most recent
  ASSERT_TRUE(t->Put(1, Key(4), Bytes(4, seed)).ok());
  EXPECT_FALSE(t->Contains(1, Key(2))) << "2 was the least recently used";
  for (uint64_t i : {1, 3, 4}) EXPECT_TRUE(t->Contains(1, Key(i))) << i;
  const std::vector<ChunkKey> asked = {Key(4), Key(2), Key(1), Key(5), Key(3)};
  EXPECT_EQ(t->ContainsEach(1, asked), (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(t->ContainsEach(8, asked), std::vector<bool>(5, false)) << "another namespace";
  EXPECT_EQ(t->stats().evictions, 1u);
  // Every slot leased: nothing can go.
  absl::StatusOr<HbmLease> a = t->Lease(1, Key(1)), b = t->Lease(1, Key(3)),
                           c = t->Lease(1, Key(4));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(t->Put(1, Key(5), Bytes(5, seed)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t->stats().leased, 3u);
  *b = HbmLease();  // 3 is released: it goes next
  ASSERT_TRUE(t->Put(1, Key(5), Bytes(5, seed)).ok());
  EXPECT_FALSE(t->Contains(1, Key(3)));
  EXPECT_EQ(ReadLeased(*t, *a), Bytes(1, seed));
  EXPECT_EQ(ReadLeased(*t, *c), Bytes(4, seed));
}

TEST(HbmTierTest, ADeletedChunkKeepsItsBytesUntilTheLastLeaseEnds) {
  const uint64_t seed = testing::FreshSeed();
  auto t = Tier(2);
  ASSERT_TRUE(t->Put(1, Key(1), Bytes(1, seed)).ok());
  absl::StatusOr<HbmLease> l = t->Lease(1, Key(1));
  ASSERT_TRUE(l.ok());
  t->Erase(1, Key(1));
  EXPECT_FALSE(t->Contains(1, Key(1)));
  ASSERT_TRUE(t->Put(1, Key(2), Bytes(2, seed)).ok());
  ASSERT_TRUE(t->Put(1, Key(3), Bytes(3, seed)).ok());  // evicts 2, not the leased slot
  EXPECT_FALSE(t->Contains(1, Key(2)));
  EXPECT_EQ(ReadLeased(*t, *l), Bytes(1, seed));
  *l = HbmLease();  // the slot is free now
  ASSERT_TRUE(t->Put(1, Key(4), Bytes(4, seed)).ok());
  EXPECT_TRUE(t->Contains(1, Key(3)) && t->Contains(1, Key(4)));
  EXPECT_EQ(t->stats().evictions, 1u);
}

TEST(HbmTierTest, PutAndLeaseHoldsTheChunkItWrote) {
  const uint64_t seed = testing::FreshSeed();
  auto t = Tier(1);
  absl::StatusOr<HbmLease> l = t->PutAndLease(1, Key(1), Bytes(1, seed));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(ReadLeased(*t, *l), Bytes(1, seed));
  EXPECT_EQ(t->stats().hits + t->stats().misses, 0u) << "a promotion is neither";
  EXPECT_EQ(t->PutAndLease(1, Key(2), Bytes(2, seed)).status().code(),
            absl::StatusCode::kResourceExhausted);  // the only slot is leased
  absl::StatusOr<HbmLease> again = t->PutAndLease(1, Key(1), Bytes(1, seed));  // present
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->offset(), l->offset());
}

TEST(HbmTierTest, BadSizesAreRefused) {
  auto t = Tier(2);
  EXPECT_EQ(t->Put(1, Key(1), std::vector<uint8_t>(kSlot + 1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<HbmTier>> small =
      HbmTier::Create(std::make_unique<HostArena>(100), kSlot);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("hold 0 chunk slots"), std::string::npos)
      << small.status();
}

TEST(HbmTierTest, ConcurrentPutsLeasesAndDeletesNeverShowWrongBytes) {
  const uint64_t seed = testing::FreshSeed();
  auto t = Tier(8);
  std::atomic<int64_t> checked{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(seed + w);
      for (int op = 0; op < 3000; ++op) {
        const uint64_t i = rng() % 20;
        switch (rng() % 4) {
          case 0:
          case 1:
            (void)t->Put(1, Key(i), Bytes(i, seed));  // may find every slot leased
            break;
          case 2: {
            absl::StatusOr<HbmLease> l = t->Lease(1, Key(i));
            if (!l.ok()) break;
            ++checked;
            if (ReadLeased(*t, *l) != Bytes(i, seed)) ++wrong;
            break;
          }
          default:
            t->Erase(1, Key(i));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(checked.load(), 100);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(t->stats().leased, 0u);
  EXPECT_LE(t->stats().used, 8u);
}

}  // namespace
}  // namespace kvc::storage
