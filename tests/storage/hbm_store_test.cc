// T0 inside the store (chunk_store.h, LeaseHbm), over a host-memory arena: a device read
// promotes a chunk from RAM or SSD with its bytes intact and Lookup then reports kHbm;
// write-through copies what a Put stored; a corrupted RAM copy is never promoted; an
// erase or an eviction from the lower tiers takes the T0 copy out (T0 never holds a chunk
// the store does not), while a lease keeps its bytes; concurrent promotions, erases and
// evictions keep that rule.
#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/host_arena.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;
using ::kvc::testing::TempDir;

constexpr uint64_t kChunk = 20000;
constexpr NamespaceId kNs = 3, kOther = 4;

struct Opened {
  std::shared_ptr<testing::HostArena> arena;
  std::unique_ptr<ChunkStore> store;
};

Opened Open(const std::string& dir, uint64_t ram_chunks, uint64_t ssd_chunks, uint64_t hbm_chunks,
            bool write_through = false) {
  StoreOptions o;
  o.data_dir = dir;
  o.first_class_chunk_bytes = kChunk;  // T0's slots, the first SSD class
  o.max_chunk_bytes = 4 * kChunk;      // larger chunks: their own SSD classes
  o.ram_bytes = ram_chunks * RamSlotBytes(kChunk);
  o.ssd_bytes = ssd_chunks * SlotBytesFor(kChunk);
  o.slab_bytes = 16 * SlotBytesFor(kChunk);
  o.queue_depth = 8;
  o.io_lanes = 2;
  Opened out;
  out.arena = std::make_shared<testing::HostArena>(hbm_chunks * HbmSlotBytes(kChunk));
  o.hbm_arena = out.arena;
  o.hbm_write_through = write_through;
  absl::StatusOr<std::unique_ptr<ChunkStore>> s = ChunkStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  for (NamespaceId ns : {kNs, kOther}) EXPECT_TRUE((*s)->RegisterNamespace(ns, kChunk).ok());
  out.store = *std::move(s);
  return out;
}

absl::Status Put(ChunkStore& s, NamespaceId ns, const ChunkKey& key, Durability d) {
  const std::vector<uint8_t> p = PayloadOf(key, kChunk);
  return s.Put({ns, key, std::nullopt, p}, {d, 0}).status();
}

// The bytes the lease points at in the arena.
std::vector<uint8_t> Leased(const DeviceArena& arena, const HbmLease& lease) {
  std::vector<uint8_t> b(lease.length());
  EXPECT_TRUE(arena.Read(lease.offset(), b).ok());
  return b;
}

// T0's slots have the first class's size: a larger chunk is a miss there (served from RAM
// or SSD by the caller's fallback), never an error, and it is not copied in on a store.
TEST(HbmStoreTest, AChunkLargerThanTheHbmSlotsIsAMissThereAndServedFromTheOtherTiers) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Opened o = Open(dir.path(), /*ram_chunks=*/4, /*ssd_chunks=*/32, /*hbm_chunks=*/8,
                  /*write_through=*/true);
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  constexpr NamespaceId kLarge = 9;
  ASSERT_TRUE(s.RegisterNamespace(kLarge, 2 * kChunk).ok());
  const ChunkKey key = KeyOf(seed, 1);
  const std::vector<uint8_t> p = PayloadOf(key, 2 * kChunk);
  ASSERT_TRUE(s.Put({kLarge, key, std::nullopt, p}, {Durability::kDurable, 0}).ok());
  absl::StatusOr<HbmLease> lease = s.LeaseHbm(kLarge, key);
  ASSERT_TRUE(absl::IsNotFound(lease.status())) << lease.status();
  EXPECT_NE(lease.status().message().find("larger than the HBM tier's slots"), std::string::npos)
      << lease.status();
  std::vector<uint8_t> out(2 * kChunk);
  ASSERT_TRUE(s.Get(kLarge, key, out).ok());
  EXPECT_EQ(out, p);
  EXPECT_EQ(s.Stats().hbm_chunks, 0u);
}

TEST(HbmStoreTest, ADeviceReadPromotesFromRamAndSsdAndLookupThenSaysHbm) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Opened o = Open(dir.path(), /*ram_chunks=*/2, /*ssd_chunks=*/32, /*hbm_chunks=*/8);
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  EXPECT_NE(s.hbm_arena(), nullptr);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(KeyOf(seed, i));
    ASSERT_TRUE(Put(s, kNs, keys.back(), Durability::kDurable).ok());
  }
  // Two in RAM (the newest), the rest on SSD only: both tiers promote.
  std::vector<Tier> before = s.Lookup(kNs, keys);
  EXPECT_EQ(std::count(before.begin(), before.end(), Tier::kRam), 2);
  EXPECT_EQ(std::count(before.begin(), before.end(), Tier::kSsd), 4);
  for (const ChunkKey& k : keys) {
    absl::StatusOr<HbmLease> l = s.LeaseHbm(kNs, k);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(Leased(*o.arena, *l), PayloadOf(k, kChunk));
  }
  for (Tier t : s.Lookup(kNs, keys)) EXPECT_EQ(t, Tier::kHbm);
  StoreStats st = s.Stats();
  EXPECT_EQ(st.hbm_promotions, 6u);
  EXPECT_EQ(st.hbm_misses, 6u);
  EXPECT_EQ(st.hbm_chunks, 6u);
  EXPECT_EQ(st.hbm_capacity_chunks, 8u);
  EXPECT_EQ(st.hbm_leased, 0u);  // every lease above has ended
  // A second read is a hit; another namespace sees none of it.
  ASSERT_TRUE(s.LeaseHbm(kNs, keys[0]).ok());
  EXPECT_EQ(s.Stats().hbm_hits, 1u);
  EXPECT_EQ(s.Stats().hbm_promotions, 6u);
  EXPECT_EQ(s.Contains(kOther, keys[0]), Tier::kNone);
  EXPECT_TRUE(absl::IsNotFound(s.LeaseHbm(kOther, keys[0]).status()));
  EXPECT_EQ(s.CountChunks({kNs}).hbm, 6u);
  EXPECT_EQ(s.CountChunks({kOther}).hbm, 0u);
  // Missing chunks and unknown namespaces are misses that promote nothing.
  EXPECT_TRUE(absl::IsNotFound(s.LeaseHbm(kNs, KeyOf(seed, 99)).status()));
  EXPECT_TRUE(absl::IsNotFound(s.LeaseHbm(77, keys[0]).status()));
  EXPECT_EQ(s.Stats().hbm_chunks, 6u);
}

TEST(HbmStoreTest, WriteThroughCopiesWhatAPutStored) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Opened o = Open(dir.path(), 8, 32, 8, /*write_through=*/true);
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  const ChunkKey a = KeyOf(seed, 1), b = KeyOf(seed, 2);
  ASSERT_TRUE(Put(s, kNs, a, Durability::kMemory).ok());
  ASSERT_TRUE(Put(s, kNs, b, Durability::kDurable).ok());
  EXPECT_EQ(s.Contains(kNs, a), Tier::kHbm);
  EXPECT_EQ(s.Contains(kNs, b), Tier::kHbm);
  absl::StatusOr<HbmLease> l = s.LeaseHbm(kNs, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(Leased(*o.arena, *l), PayloadOf(a, kChunk));
  EXPECT_EQ(s.Stats().hbm_hits, 1u);
  EXPECT_EQ(s.Stats().hbm_promotions, 0u);
  // A put of a chunk already stored does not replace the copy with the caller's bytes.
  std::vector<uint8_t> other = PayloadOf(KeyOf(seed, 3), kChunk);
  absl::StatusOr<PutResult> again = s.Put({kNs, a, std::nullopt, other}, {Durability::kMemory, 0});
  ASSERT_TRUE(again.ok() && again->already_present);
  EXPECT_EQ(Leased(*o.arena, *l), PayloadOf(a, kChunk));
}

TEST(HbmStoreTest, ACorruptedRamCopyIsNeverPromoted) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Opened o = Open(dir.path(), 4, 0, 4);  // RAM only: the copy is the only one
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  const ChunkKey a = KeyOf(seed, 1);
  ASSERT_TRUE(Put(s, kNs, a, Durability::kMemory).ok());
  {
    // The server's own mapping stands in for a memory fault.
    absl::StatusOr<RamLease> lease = s.LeaseRam(kNs, a);
    ASSERT_TRUE(lease.ok());
    const size_t at = seed % kChunk;
    const_cast<uint8_t*>(lease->bytes().data())[at] ^= 1u << (seed % 8);
    std::printf("flipped byte %zu\n", at);
  }
  absl::StatusOr<HbmLease> l = s.LeaseHbm(kNs, a);
  EXPECT_TRUE(absl::IsNotFound(l.status())) << l.status();
  EXPECT_EQ(s.Stats().hbm_chunks, 0u);
  EXPECT_EQ(s.Stats().hbm_promotions, 0u);
  EXPECT_EQ(s.Contains(kNs, a), Tier::kNone);
}

TEST(HbmStoreTest, ChunksLeavingTheStoreLeaveT0AndLeasesKeepTheirBytes) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  // RAM only, 4 chunks: the fifth put evicts the least recently used.
  Opened o = Open(dir.path(), 4, 0, 8, /*write_through=*/true);
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(KeyOf(seed, i));
    ASSERT_TRUE(Put(s, kNs, keys.back(), Durability::kMemory).ok());
  }
  EXPECT_EQ(s.Stats().hbm_chunks, 4u);
  // Erase with a lease held: the chunk is gone from both, the leased bytes stay intact.
  absl::StatusOr<HbmLease> held = s.LeaseHbm(kNs, keys[1]);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(s.Erase(kNs, keys[1]).ok());
  EXPECT_EQ(s.Contains(kNs, keys[1]), Tier::kNone);
  EXPECT_TRUE(absl::IsNotFound(s.LeaseHbm(kNs, keys[1]).status()));
  EXPECT_EQ(s.Stats().hbm_chunks, 3u);
  EXPECT_EQ(Leased(*o.arena, *held), PayloadOf(keys[1], kChunk));
  // Two more puts fill RAM and evict the oldest chunk: its T0 copy goes with it.
  for (int i = 4; i < 6; ++i) {
    keys.push_back(KeyOf(seed, i));
    ASSERT_TRUE(Put(s, kNs, keys.back(), Durability::kMemory).ok());
  }
  EXPECT_EQ(s.Contains(kNs, keys[0]), Tier::kNone);
  uint64_t held_by_store = 0;
  for (Tier t : s.Lookup(kNs, keys)) held_by_store += t != Tier::kNone;
  EXPECT_EQ(held_by_store, 4u);
  EXPECT_EQ(s.Stats().hbm_chunks, 4u) << "T0 holds exactly the chunks the store holds";
}

TEST(HbmStoreTest, WithoutT0LeasesAreRefused) {
  TempDir dir;
  StoreOptions o;
  o.data_dir = dir.path();
  o.max_chunk_bytes = kChunk;
  o.ram_bytes = 4 * RamSlotBytes(kChunk);
  absl::StatusOr<std::unique_ptr<ChunkStore>> s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->hbm_arena(), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition((*s)->LeaseHbm(kNs, KeyOf(1, 1)).status()));
  // An arena too small for one slot is refused at open.
  o.data_dir = dir.File("other");
  o.hbm_arena = std::make_shared<testing::HostArena>(kChunk / 2);
  EXPECT_TRUE(absl::IsInvalidArgument(ChunkStore::Open(o).status()));
}

TEST(HbmStoreTest, ConcurrentPromotionsErasesAndEvictionsKeepT0InsideTheStore) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Opened o = Open(dir.path(), 6, 24, 10, /*write_through=*/(seed & 1) != 0);
  ASSERT_NE(o.store, nullptr);
  ChunkStore& s = *o.store;
  constexpr int kKeys = 40;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, leased{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {  // writers and erasers
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      while (!stop) {
        const ChunkKey k = KeyOf(seed, rng() % kKeys);
        if (rng() % 4 == 0) {
          (void)s.Erase(kNs, k);
        } else {
          (void)Put(s, kNs, k, rng() % 2 ? Durability::kDurable : Durability::kMemory);
        }
      }
    });
  }
  for (int t = 0; t < 2; ++t) {  // device readers
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 10 + t);
      while (!stop) {
        const ChunkKey k = KeyOf(seed, rng() % kKeys);
        absl::StatusOr<HbmLease> l = s.LeaseHbm(kNs, k);
        if (!l.ok()) continue;
        ++leased;
        if (Leased(*o.arena, *l) != PayloadOf(k, kChunk)) ++wrong;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  for (std::thread& t : threads) t.join();
  std::printf("seed %llu: %llu leases\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(leased.load()));
  EXPECT_GT(leased.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(KeyOf(seed, i));
  uint64_t in_t0 = 0;
  for (Tier t : s.Lookup(kNs, keys)) in_t0 += t == Tier::kHbm;
  EXPECT_EQ(s.Stats().hbm_chunks, in_t0) << "a T0 copy of a chunk the store no longer holds";
  for (const ChunkKey& k : keys) (void)s.Erase(kNs, k);
  EXPECT_EQ(s.Stats().hbm_chunks, 0u);
}

}  // namespace
}  // namespace kvc::storage
