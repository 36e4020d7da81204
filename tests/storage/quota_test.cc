// Per-owner quotas (storage/quota.h): a group over its RAM or SSD quota gives up its own
// chunks and nobody else's; when all it could give up is pinned the put fails naming the
// owner and the limit; pins past the pin limit fail the same way; concurrent writers of
// one group cannot pass its limit together; a reopened store counts what is on SSD. A
// chunk is charged its pages in RAM and the whole slot it takes on SSD; quotas that
// together exceed a tier are refused; tier pressure never evicts a group within its quota.
#include <thread>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"
#include "tests/storage/open_store.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::ConsistentOnceQuiet;
using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;
using ::kvc::testing::TempDir;

constexpr uint64_t kChunk = 20000;
constexpr NamespaceId kNsA = 7, kNsB = 8;
constexpr QuotaGroup kGroupA = 1;

std::unique_ptr<ChunkStore> Open(const std::string& dir, uint64_t ram_chunks, uint64_t ssd_chunks) {
  const std::vector<uint64_t> pools =
      ram_chunks > 0 ? std::vector<uint64_t>{ram_chunks} : std::vector<uint64_t>{};
  return testing::OpenSmallStore(dir, kChunk, pools, ssd_chunks, {kNsA, kNsB});
}

// What one chunk of kChunk bytes (the largest) is charged in each tier.
uint64_t Ram(const ChunkStore& s) { return s.QuotaCapacity().ram_bytes_per_chunk; }
uint64_t Ssd(const ChunkStore& s) { return s.QuotaCapacity().ssd_bytes_per_chunk; }

void LimitA(ChunkStore& s, uint64_t ram_chunks, uint64_t ssd_chunks, uint64_t pins = 0) {
  ASSERT_TRUE(
      s.SetQuota(kGroupA, {"tenant a", ram_chunks * Ram(s), ssd_chunks * Ssd(s), pins}).ok());
  s.SetQuotaGroup(kNsA, kGroupA);
}

absl::Status Put(ChunkStore& s, NamespaceId ns, const ChunkKey& key, Durability d) {
  const std::vector<uint8_t> p = PayloadOf(key, kChunk);
  return s.Put({ns, key, std::nullopt, p}, {d, 0}).status();
}

// The chunk reads back with the bytes it was stored with.
bool ReadsBack(ChunkStore& s, NamespaceId ns, const ChunkKey& key) {
  std::vector<uint8_t> out(kChunk);
  return s.Get(ns, key, out).ok() && out == PayloadOf(key, kChunk);
}

TEST(QuotaTest, AGroupOverItsSsdQuotaEvictsOnlyItsOwnChunks) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 0, 64);
  LimitA(*store, 0, 10);
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(Put(*store, kNsB, KeyOf(seed, 1000 + i), Durability::kDurable).ok());
  }
  for (uint64_t i = 0; i < 30; ++i) {
    ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), Durability::kDurable).ok()) << i;
    EXPECT_LE(store->Usage(kGroupA).ssd_bytes, 10 * Ssd(*store)) << "after put " << i;
  }
  for (uint64_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(ReadsBack(*store, kNsB, KeyOf(seed, 1000 + i))) << "tenant b lost chunk " << i;
  }
  // A keeps its newest chunks, at most its quota (eviction runs a little ahead).
  const QuotaUsage used = store->Usage(kGroupA);
  EXPECT_GE(used.ssd_bytes, 8 * Ssd(*store));
  EXPECT_TRUE(ReadsBack(*store, kNsA, KeyOf(seed, 29)));
  EXPECT_EQ(store->Contains(kNsA, KeyOf(seed, 0)), Tier::kNone);
  const StoreStats st = store->Stats();
  EXPECT_GE(st.quota_evictions, 20u);
  EXPECT_EQ(st.ssd_chunks, 20 + used.ssd_bytes / Ssd(*store));
}

TEST(QuotaTest, AGroupWhoseChunksArePinnedIsRefusedNamingItsOwnerAndLimit) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 0, 64);
  LimitA(*store, 0, 4);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), Durability::kDurable).ok());
    ASSERT_TRUE(store->Pin(kNsA, KeyOf(seed, i), 4'000'000'000).ok());
  }
  const absl::Status over = Put(*store, kNsA, KeyOf(seed, 4), Durability::kDurable);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_NE(over.message().find("tenant a"), std::string::npos) << over;
  EXPECT_NE(over.message().find(std::to_string(4 * Ssd(*store))), std::string::npos) << over;
  // Its pinned chunks are intact, and another group still stores.
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(ReadsBack(*store, kNsA, KeyOf(seed, i)));
  EXPECT_TRUE(Put(*store, kNsB, KeyOf(seed, 100), Durability::kDurable).ok());
  // Unpinning one makes room again.
  ASSERT_TRUE(store->Pin(kNsA, KeyOf(seed, 0), 0).ok());
  EXPECT_TRUE(Put(*store, kNsA, KeyOf(seed, 4), Durability::kDurable).ok());
  EXPECT_EQ(store->Contains(kNsA, KeyOf(seed, 0)), Tier::kNone);
}

TEST(QuotaTest, AGroupOverItsRamQuotaGivesUpItsOwnRamChunks) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 16, 0);  // RAM only: memory puts are the only copy
  LimitA(*store, 4, 0);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(Put(*store, kNsB, KeyOf(seed, 1000 + i), Durability::kMemory).ok());
  }
  for (uint64_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), Durability::kMemory).ok()) << i;
    EXPECT_LE(store->Usage(kGroupA).ram_bytes, 4 * Ram(*store));
  }
  for (uint64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(ReadsBack(*store, kNsB, KeyOf(seed, 1000 + i))) << "tenant b lost chunk " << i;
  }
  EXPECT_EQ(store->Usage(kGroupA).ram_bytes, 4 * Ram(*store));
  for (uint64_t i = 8; i < 12; ++i) EXPECT_TRUE(ReadsBack(*store, kNsA, KeyOf(seed, i)));
  EXPECT_EQ(store->Contains(kNsA, KeyOf(seed, 0)), Tier::kNone);
}

TEST(QuotaTest, PinsPastThePinLimitAreRefused) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 0, 64);
  LimitA(*store, 0, 0, /*pins=*/3);
  for (uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), Durability::kDurable).ok());
  }
  const int64_t until = 4'000'000'000;
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(KeyOf(seed, i));
  std::vector<absl::Status> st = store->PinBatch(kNsA, keys, until);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(st[i].ok()) << st[i];
  EXPECT_TRUE(absl::IsResourceExhausted(st[3])) << st[3];
  EXPECT_NE(st[3].message().find("tenant a may pin 3"), std::string::npos) << st[3];
  EXPECT_EQ(store->Usage(kGroupA).pinned_chunks, 3u);
  // Renewing a pin is not a new one; unpinning frees one.
  EXPECT_TRUE(store->Pin(kNsA, KeyOf(seed, 0), until + 10).ok());
  ASSERT_TRUE(store->Pin(kNsA, KeyOf(seed, 1), 0).ok());
  EXPECT_TRUE(store->Pin(kNsA, KeyOf(seed, 4), until).ok());
  EXPECT_EQ(store->Usage(kGroupA).pinned_chunks, 3u);
}

TEST(QuotaTest, ConcurrentWritersOfOneGroupStayWithinItsQuota) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 0, 128);
  LimitA(*store, 0, 12);
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> max_seen{0};
  for (uint64_t t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (uint64_t i = 0; i < 25; ++i) {
        const NamespaceId ns = t == 3 ? kNsB : kNsA;  // one writer of another group
        if (absl::Status st = Put(*store, ns, KeyOf(seed, t * 1000 + i), Durability::kDurable);
            !st.ok()) {
          ADD_FAILURE() << st;
          ++failures;
        }
        const uint64_t used = store->Usage(kGroupA).ssd_bytes;
        uint64_t seen = max_seen.load();
        while (used > seen && !max_seen.compare_exchange_weak(seen, used)) {
        }
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(max_seen.load(), 12 * Ssd(*store));
  for (uint64_t i = 0; i < 25; ++i) EXPECT_TRUE(ReadsBack(*store, kNsB, KeyOf(seed, 3000 + i)));
  // Evictions ran ahead while others wrote: every slot is still accounted for.
  EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
}

// A namespace of small chunks (a twentieth of the largest) is charged what each takes: in
// RAM its payload in whole 4 KiB pages — a RAM quota of 4 of the largest chunks holds 20
// of them — and on SSD the slot of its own size class (header + payload in 4 KiB), not the
// largest chunk's: a quota of 10 large slots holds 50 of them, and no more.
TEST(QuotaTest, AChunkIsChargedItsPagesInRamAndItsOwnClassSlotOnSsd) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 16, 64);
  constexpr NamespaceId kSmall = 9;
  constexpr uint64_t kSmallBytes = kChunk / 20;
  const uint64_t small_slot = SlotBytesFor(kSmallBytes);
  ASSERT_EQ(small_slot, 4096u);
  ASSERT_TRUE(store->RegisterNamespace(kSmall, kSmallBytes).ok());
  ASSERT_TRUE(store->SetQuota(kGroupA, {"tenant a", 4 * Ram(*store), 10 * Ssd(*store), 0}).ok());
  store->SetQuotaGroup(kSmall, kGroupA);
  for (uint64_t i = 0; i < 80; ++i) {
    const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kSmallBytes);
    ASSERT_TRUE(
        store->Put({kSmall, KeyOf(seed, i), std::nullopt, p}, {Durability::kDurable, 0}).ok())
        << i;
  }
  const QuotaUsage used = store->Usage(kGroupA);
  EXPECT_LE(used.ssd_bytes, 10 * Ssd(*store));
  EXPECT_GE(used.ssd_bytes, 10 * Ssd(*store) - 2 * small_slot) << "the SSD quota is filled";
  EXPECT_EQ(used.ssd_bytes % small_slot, 0u) << "charged in whole slots of its class";
  EXPECT_LE(used.ram_bytes, 4 * Ram(*store));
  EXPECT_EQ(used.ram_bytes % RamSlotBytes(kSmallBytes), 0u) << "charged in whole pages";
  EXPECT_EQ(RamSlotBytes(kSmallBytes), 4096u);
  EXPECT_EQ(used.ram_bytes, 4 * Ram(*store) / 4096 * 4096) << "the RAM quota holds 20 of them";
  uint64_t held = 0;
  for (uint64_t i = 0; i < 80; ++i) held += store->Contains(kSmall, KeyOf(seed, i)) != Tier::kNone;
  EXPECT_GE(held, used.ssd_bytes / small_slot);
  EXPECT_LE(held, used.ssd_bytes / small_slot + used.ram_bytes / 4096)
      << "small chunks held past the quotas";
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.ssd_bytes, used.ssd_bytes) << "one group holds everything on SSD";
  ASSERT_EQ(st.ssd_classes.size(), 2u) << "the folder's first class and the small chunks'";
  EXPECT_EQ(st.ssd_classes[1].slot_bytes, small_slot);
  EXPECT_EQ(st.ssd_classes[1].chunks, used.ssd_bytes / small_slot);
  EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
}

// Quotas are guaranteed shares: together they must fit each tier.
TEST(QuotaTest, QuotasThatTogetherExceedATierAreRefused) {
  TempDir dir;
  auto store = Open(dir.path(), 16, 64);
  const ChunkStore::QuotaRoom room = store->QuotaCapacity();
  EXPECT_EQ(room.ram_bytes, 16 * Ram(*store));
  EXPECT_GT(room.ssd_bytes, 56 * Ssd(*store));
  EXPECT_LT(room.ssd_bytes, 64 * Ssd(*store)) << "SSD keeps a few slots for its own work";
  ASSERT_TRUE(store->SetQuota(1, {"tenant a", 10 * Ram(*store), room.ssd_bytes / 2, 0}).ok());
  const absl::Status ram = store->SetQuota(2, {"tenant b", 7 * Ram(*store), 0, 0});
  EXPECT_TRUE(absl::IsResourceExhausted(ram)) << ram;
  EXPECT_NE(ram.message().find("tenant b does not fit"), std::string::npos) << ram;
  EXPECT_NE(ram.message().find("already granted in RAM"), std::string::npos) << ram;
  // The owner hears of its own quota, not of the sum the others were granted.
  EXPECT_EQ(ram.message().find(std::to_string(17 * Ram(*store))), std::string::npos) << ram;
  const absl::Status ssd = store->SetQuota(2, {"tenant b", 0, room.ssd_bytes / 2 + 1, 0});
  EXPECT_TRUE(absl::IsResourceExhausted(ssd)) << ssd;
  EXPECT_NE(ssd.message().find("in SSD"), std::string::npos) << ssd;
  EXPECT_TRUE(store->SetQuota(2, {"tenant b", 6 * Ram(*store), room.ssd_bytes / 2, 0}).ok());
  // A group's own limit may change without counting itself twice; an overcommit is set
  // only when asked (a quota admitted before a restart).
  EXPECT_TRUE(store->SetQuota(2, {"tenant b", 6 * Ram(*store), room.ssd_bytes / 2, 0}).ok());
  EXPECT_TRUE(store->SetQuota(3, {"tenant c", Ram(*store), 0, 0}, /*must_fit=*/false).ok());
}

// Tier pressure — a tier full with no group over its quota — takes chunks of namespaces
// without a quota only: a group within its quota keeps every chunk, in both tiers.
TEST(QuotaTest, TierPressureNeverEvictsAGroupWithinItsQuota) {
  const uint64_t seed = testing::FreshSeed();
  for (const bool in_ram : {false, true}) {
    SCOPED_TRACE(in_ram ? "RAM" : "SSD");
    TempDir dir;
    auto store = in_ram ? Open(dir.path(), 16, 0) : Open(dir.path(), 0, 64);
    LimitA(*store, in_ram ? 8 : 0, in_ram ? 0 : 20);
    const Durability d = in_ram ? Durability::kMemory : Durability::kDurable;
    const uint64_t a_chunks = in_ram ? 8 : 20;
    for (uint64_t i = 0; i < a_chunks; ++i) ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), d).ok());
    // B, without a quota, writes far more than the tier holds, long after A's last access.
    for (uint64_t i = 0; i < 200; ++i) {
      ASSERT_TRUE(Put(*store, kNsB, KeyOf(seed, 1000 + i), d).ok()) << i;
    }
    for (uint64_t i = 0; i < a_chunks; ++i) {
      EXPECT_TRUE(ReadsBack(*store, kNsA, KeyOf(seed, i))) << "a lost chunk " << i;
    }
    EXPECT_TRUE(ReadsBack(*store, kNsB, KeyOf(seed, 1199)));
    EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
  }
}

TEST(QuotaTest, AReopenedStoreCountsWhatAGroupHasOnSsd) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  {
    auto store = Open(dir.path(), 0, 64);
    for (uint64_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, i), Durability::kDurable).ok());
    }
  }
  auto store = Open(dir.path(), 0, 64);
  LimitA(*store, 0, 5);
  EXPECT_EQ(store->Usage(kGroupA).ssd_bytes, 6 * Ssd(*store));  // over: a lowered quota
  ASSERT_TRUE(Put(*store, kNsA, KeyOf(seed, 6), Durability::kDurable).ok());
  EXPECT_LE(store->Usage(kGroupA).ssd_bytes, 5 * Ssd(*store));
  EXPECT_TRUE(ReadsBack(*store, kNsA, KeyOf(seed, 6)));
  EXPECT_TRUE(absl::IsInvalidArgument(store->SetQuota(0, {"nobody", 1, 1, 1})));
}

}  // namespace
}  // namespace kvc::storage
