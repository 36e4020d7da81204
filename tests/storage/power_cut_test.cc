// Power cuts under a running store (storage/power_cut.h): whatever was not covered by a
// completed fsync/fdatasync is dropped, kept or torn, and after every cut each durably
// acknowledged chunk is there, byte-exact; an acknowledged erase stays erased; nothing is
// ever served wrong — also while a quota group evicts its own chunks under the writers.
// Real RocksDB, real slab files, real io_uring (or the POSIX fallback).
#include "storage/power_cut.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
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

constexpr uint64_t kChunk = 12000;  // a 12 KiB slot in format 2
constexpr NamespaceId kNs = 3;

StoreOptions Options(const std::string& dir, uint64_t ssd_slots) {
  StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kChunk;
  o.ram_bytes = 32 * kChunk;
  o.ssd_bytes = ssd_slots * SlotBytesFor(kChunk);
  o.slab_bytes = 256 * SlotBytesFor(kChunk);
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;
}

// Open with the power cut's seam (none: the real disk).
std::unique_ptr<ChunkStore> Open(const StoreOptions& o, std::shared_ptr<PowerCut> cut = nullptr) {
  return testing::OpenStoreWith(o, kNs, kChunk, {.power_cut = std::move(cut)});
}

// OK if the chunk reads back exactly; NotFound if absent; anything else is a failure.
absl::Status ReadBack(ChunkStore& s, const ChunkKey& key) {
  std::vector<uint8_t> out(kChunk);
  absl::Status st = s.Get(kNs, key, out);
  if (st.ok() && out != PayloadOf(key, kChunk))
    return absl::DataLossError("served bytes that differ from what was stored");
  return st;
}

TEST(PowerCutTest, DurableChunksWhoseIndexEntriesNeverSyncedAreRebuiltFromTheirSlots) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kSlots = 256, kChunks = 100;
  auto cut = std::make_shared<PowerCut>(seed, /*drop_all=*/true);
  uint64_t reservations = 0;
  {
    auto store = Open(Options(dir.path(), kSlots), cut);
    ASSERT_NE(store, nullptr);
    for (uint64_t i = 0; i < kChunks; ++i) {
      const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
      std::optional<ChunkKey> parent;
      if (i > 0) parent = KeyOf(seed, i - 1);
      ASSERT_TRUE(store->Put({kNs, KeyOf(seed, i), parent, p}, {}).ok()) << i;
    }
    reservations = store->Stats().reservations;
    cut->Cut();  // before the store closes: its closing writes go nowhere
  }
  ASSERT_TRUE(cut->Restore().ok());
  EXPECT_GT(cut->counts().index_bytes_dropped, 0u) << "the cut dropped nothing from the index";

  auto store = Open(Options(dir.path(), kSlots));
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < kChunks; ++i) EXPECT_TRUE(ReadBack(*store, KeyOf(seed, i)).ok()) << i;
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.ssd_chunks, kChunks);
  // The entries written after the last reservation's synced commit were lost with the
  // index's unsynced tail; each came back from its slot.
  EXPECT_GT(st.recovered_chunks, 0u) << reservations << " reservations";
  EXPECT_LE(st.recovered_chunks, kChunks);
  EXPECT_EQ(st.index_rebuilds, 0u);
}

TEST(PowerCutTest, AnErasedChunkStaysErasedAfterACut) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  auto cut = std::make_shared<PowerCut>(seed, /*drop_all=*/true);
  {
    auto store = Open(Options(dir.path(), 256), cut);
    ASSERT_NE(store, nullptr);
    for (uint64_t i = 0; i < 6; ++i) {
      const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
      ASSERT_TRUE(store->Put({kNs, KeyOf(seed, i), {}, p}, {}).ok());
    }
    // Its slot is still listed in the reservation; its bytes are intact on disk.
    ASSERT_TRUE(store->Erase(kNs, KeyOf(seed, 2)).ok());
    cut->Cut();
  }
  ASSERT_TRUE(cut->Restore().ok());
  auto store = Open(Options(dir.path(), 256));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(absl::IsNotFound(ReadBack(*store, KeyOf(seed, 2))));
  for (uint64_t i : {0, 1, 3, 4, 5}) EXPECT_TRUE(ReadBack(*store, KeyOf(seed, i)).ok()) << i;
}

// The review's finding 3: after a disk-full during stores and the space freed again, every
// store kept failing until a restart. Now puts fail while the disk is full (naming the
// lack of space), reads go on, and puts succeed again once space is back — same process.
TEST(DiskFullTest, StoresFailWhileTheDiskIsFullAndResumeWhenSpaceReturns) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  auto disk = std::make_shared<PowerCut>(seed);
  auto put = [&](ChunkStore& s, uint64_t i) {
    const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
    return s.Put({kNs, KeyOf(seed, i), {}, p}, {}).status();
  };
  {
    auto store = Open(Options(dir.path(), 256), disk);
    ASSERT_NE(store, nullptr);
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(put(*store, i).ok()) << i;
    disk->set_disk_full(true);
    for (uint64_t i = 10; i < 15; ++i) {
      const absl::Status st = put(*store, i);
      EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
    }
    for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(ReadBack(*store, KeyOf(seed, i)).ok()) << i;
    // An erase cannot commit either: the chunk leaves the live store, but its entry may
    // still be on disk, so its slot is held back (not reused) until the next open.
    const absl::Status erased = store->Erase(kNs, KeyOf(seed, 3));
    EXPECT_FALSE(erased.ok()) << "an erase committed on a full disk";
    EXPECT_TRUE(absl::IsNotFound(ReadBack(*store, KeyOf(seed, 3))));
    EXPECT_EQ(testing::ConsistentOnceQuiet(*store), absl::OkStatus());
    disk->set_disk_full(false);
    const auto freed = std::chrono::steady_clock::now();
    absl::Status first;
    while (!(first = put(*store, 15)).ok() &&
           std::chrono::steady_clock::now() - freed < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::printf("stores resumed %.2f s after space returned\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - freed).count());
    ASSERT_TRUE(first.ok()) << "stores did not resume within 30 s: " << first;
    for (uint64_t i = 15; i < 25; ++i) {
      const absl::Status st = put(*store, i);
      EXPECT_TRUE(st.ok()) << "after space returned: " << i << ": " << st;
    }
  }
  auto store = Open(Options(dir.path(), 256));
  ASSERT_NE(store, nullptr);
  for (uint64_t i : {0, 5, 9, 15, 20, 24}) EXPECT_TRUE(ReadBack(*store, KeyOf(seed, i)).ok()) << i;
  for (uint64_t i = 10; i < 15; ++i)
    EXPECT_TRUE(absl::IsNotFound(ReadBack(*store, KeyOf(seed, i))));
  // The erase that failed: back with its bytes, or gone; never anything else.
  const absl::Status three = ReadBack(*store, KeyOf(seed, 3));
  EXPECT_TRUE(three.ok() || absl::IsNotFound(three)) << three;
}

int Rounds() {
  const char* env = std::getenv("KVC_POWER_CUT_ROUNDS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 12;
}

// Random power cuts under writers, each storing chunks of its own namespace and size
// (one size: one class; several: several size classes under one budget). After every cut:
// each durable acknowledgement holds, each acknowledged erase stays, nothing reads wrong.
// `slots`: the budget in slots of kChunk. Without room for all (`evicts`), chunks may also
// be evicted: each acknowledged one reads back exactly or is gone, never anything else.
struct Writer {
  NamespaceId ns;
  uint64_t chunk_bytes;
};
void RandomCuts(const std::vector<Writer>& writers_of, uint64_t slots, bool evicts = false) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  const int rounds = Rounds();
  const int writer_count = static_cast<int>(writers_of.size());
  std::mt19937_64 rng(seed);
  struct Stored {
    ChunkKey key;
    Writer w;
  };
  std::vector<Stored> durable, erased, attempted;
  auto read_back = [](ChunkStore& s, const Stored& c) {
    std::vector<uint8_t> out(c.w.chunk_bytes);
    absl::Status st = s.Get(c.w.ns, c.key, out);
    if (st.ok() && out != PayloadOf(c.key, c.w.chunk_bytes))
      return absl::DataLossError("served bytes that differ from what was stored");
    return st;
  };
  auto open = [&](std::shared_ptr<PowerCut> cut) {
    StoreOptions o = Options(dir.path(), slots);
    o.first_class_chunk_bytes = kChunk;  // slabs/; the other sizes are classes of their own
    for (const Writer& w : writers_of)
      o.max_chunk_bytes = std::max(o.max_chunk_bytes, w.chunk_bytes);
    auto store = Open(o, std::move(cut));
    for (const Writer& w : writers_of) {
      if (store && w.ns != kNs) {
        EXPECT_TRUE(store->RegisterNamespace(w.ns, w.chunk_bytes).ok());
      }
    }
    return store;
  };
  uint64_t recovered = 0, kept = 0, dropped = 0, torn = 0;
  for (int round = 0; round < rounds; ++round) {
    auto cut = std::make_shared<PowerCut>(rng());
    {
      auto store = open(cut);
      ASSERT_NE(store, nullptr);
      std::mutex mu;
      std::vector<std::thread> writers;
      for (int t = 0; t < writer_count; ++t) {
        writers.emplace_back([&, t] {
          const Writer w = writers_of[static_cast<size_t>(t)];
          std::mt19937_64 r(seed ^ (uint64_t(round) << 32) ^ uint64_t(t));
          for (uint64_t i = 0; i < 200 && !cut->cut(); ++i) {
            const ChunkKey key = KeyOf(seed, (uint64_t(round) << 32) | (uint64_t(t) << 24) | i);
            const std::vector<uint8_t> p = PayloadOf(key, w.chunk_bytes);
            const bool is_durable = r() % 4 != 0;
            {
              std::lock_guard lock(mu);
              attempted.push_back({key, w});
            }
            const absl::Status st =
                store
                    ->Put({w.ns, key, {}, p},
                          {is_durable ? Durability::kDurable : Durability::kMemory, 0})
                    .status();
            // An answer that came after the cut may rest on a sync that never happened.
            if (!st.ok() || cut->cut()) continue;
            if (is_durable && r() % 10 == 0) {
              const absl::Status e = store->Erase(w.ns, key);
              std::lock_guard lock(mu);
              if (e.ok() && !cut->cut()) erased.push_back({key, w});
              continue;
            }
            std::lock_guard lock(mu);
            if (is_durable) durable.push_back({key, w});
          }
        });
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 60));
      cut->Cut();
      for (auto& w : writers) w.join();
      // After the cut every write, commit and removal failed somewhere in its steps: the
      // store's own slot accounting must still add up (held-back slots included).
      (void)store->Flush();
      ASSERT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus()) << "round " << round;
    }
    ASSERT_TRUE(cut->Restore().ok());
    const PowerCut::Counts c = cut->counts();
    kept += c.slab_writes_kept;
    dropped += c.slab_writes_dropped;
    torn += c.slab_writes_torn;

    auto store = open(nullptr);
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(store->CheckConsistency(), absl::OkStatus()) << "round " << round << ", reopened";
    // Synced bytes survive a power cut: the index is never found damaged after one (a
    // rebuild from every slot would be slow, and would bring back erased chunks).
    ASSERT_EQ(store->Stats().index_rebuilds, 0u) << "round " << round;
    recovered += store->Stats().recovered_chunks;
    for (const Stored& s : durable) {
      const absl::Status st = read_back(*store, s);
      ASSERT_TRUE(st.ok() || (evicts && absl::IsNotFound(st)))
          << "round " << round << ": acknowledged chunk lost: " << st;
    }
    for (const Stored& s : erased)
      ASSERT_TRUE(absl::IsNotFound(read_back(*store, s))) << "round " << round << ": erase undone";
    for (const Stored& s : attempted) {
      const absl::Status st = read_back(*store, s);
      ASSERT_TRUE(st.ok() || absl::IsNotFound(st)) << "round " << round << ": " << st;
    }
  }
  std::printf(
      "%d power cuts: %zu durable acknowledgements and %zu erases held; "
      "%zu writes attempted; unsynced slab writes kept %llu, dropped %llu, torn %llu; "
      "%llu chunks indexed from their slots at reopen\n",
      rounds, durable.size(), erased.size(), attempted.size(),
      static_cast<unsigned long long>(kept), static_cast<unsigned long long>(dropped),
      static_cast<unsigned long long>(torn), static_cast<unsigned long long>(recovered));
  EXPECT_GT(durable.size(), 0u);
}

TEST(PowerCutTest, RandomCutsNeverLoseAnAcknowledgedChunkNorServeWrongBytes) {
  constexpr uint64_t kWriters = 3;
  // Room for every round's chunks: nothing acknowledged is evicted.
  RandomCuts(std::vector<Writer>(kWriters, {kNs, kChunk}),
             200 * kWriters * static_cast<uint64_t>(Rounds()) + 256);
}

// The same with three size classes written at once (4 KiB, the first class's 12 KiB and
// 40 KiB slots), each with its own reservation record, under one budget with room for all
// (twice their slots: each class reserves up to 1/8 of the budget ahead).
TEST(PowerCutTest, RandomCutsAcrossSizeClassesLoseNothingAcknowledged) {
  const std::vector<Writer> writers = {{kNs, kChunk}, {kNs + 1, 3000}, {kNs + 2, 40000}};
  const uint64_t per_round = 200 *
                                 (SlotBytesFor(kChunk) + SlotBytesFor(3000) + SlotBytesFor(40000)) /
                                 SlotBytesFor(kChunk) +
                             1;
  RandomCuts(writers, 2 * per_round * static_cast<uint64_t>(Rounds()) + 256);
}

// The same on a budget a tenth of what is written: reservations release other classes'
// slots, the coldest chunks of any class are evicted, empty slabs are given back — and a
// cut in any of it serves nothing wrong and brings no erased chunk back.
TEST(PowerCutTest, RandomCutsWhileSizeClassesEvictEachOtherServeNothingWrong) {
  const std::vector<Writer> writers = {{kNs, kChunk}, {kNs + 1, 3000}, {kNs + 2, 40000}};
  RandomCuts(writers, 64, /*evicts=*/true);
}

// A namespace at its SSD quota (storage/quota.h): every durable put evicts the group's
// own oldest chunks (synced deletions, some slots still in the reservation) while three
// writers go on. After each cut nothing reads back wrong, the newest acknowledged chunks
// are all there, and the group holds about its quota (chunks whose eviction or put was
// cut short may come back from their slots, within what was in flight).
TEST(PowerCutTest, RandomCutsUnderAQuotaServeNothingWrongAndKeepTheNewest) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  const int rounds = Rounds();
  constexpr int kWriters = 3;
  // At most 40 − 3 in flight chunks are held: the newest ~37 acknowledged survive. Which
  // ones are newest is stamped right as Put returns (a writer descheduled before it records
  // its acknowledgement would otherwise look newer than chunks committed after its own);
  // 25 leaves room for the stamps' remaining jitter.
  constexpr uint64_t kQuotaChunks = 40, kKeptChunks = 25;
  constexpr QuotaGroup kGroup = 1;
  std::mt19937_64 rng(seed);
  std::vector<ChunkKey> attempted;
  std::vector<std::pair<uint64_t, ChunkKey>> stamped;  // (acknowledgement order, key)
  std::atomic<uint64_t> ack_clock{0};
  auto open = [&](std::shared_ptr<PowerCut> cut) {
    StoreOptions o = Options(dir.path(), 1024);
    o.ram_bytes = 0;  // every read after a reopen comes from the slots
    std::unique_ptr<ChunkStore> store = Open(o, std::move(cut));
    if (store != nullptr) {
      EXPECT_TRUE(store->SetQuota(kGroup, {"the test tenant", 0, kQuotaChunks * kChunk, 0}).ok());
      store->SetQuotaGroup(kNs, kGroup);
    }
    return store;
  };
  uint64_t quota_evictions = 0;
  for (int round = 0; round < rounds; ++round) {
    auto cut = std::make_shared<PowerCut>(rng());
    {
      auto store = open(cut);
      ASSERT_NE(store, nullptr);
      std::mutex mu;
      std::vector<std::thread> writers;
      for (int t = 0; t < kWriters; ++t) {
        writers.emplace_back([&, t] {
          for (uint64_t i = 0; i < 200 && !cut->cut(); ++i) {
            const ChunkKey key = KeyOf(seed, (uint64_t(round) << 32) | (uint64_t(t) << 24) | i);
            {
              std::lock_guard lock(mu);
              attempted.push_back(key);
            }
            const std::vector<uint8_t> p = PayloadOf(key, kChunk);
            const absl::Status st = store->Put({kNs, key, {}, p}, {}).status();
            const uint64_t stamp = ack_clock.fetch_add(1);
            if (!st.ok() || cut->cut()) continue;
            std::lock_guard lock(mu);
            stamped.emplace_back(stamp, key);
          }
        });
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 80));
      cut->Cut();
      for (auto& w : writers) w.join();
      quota_evictions += store->Stats().quota_evictions;
      ASSERT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus()) << "round " << round;
    }
    ASSERT_TRUE(cut->Restore().ok());
    auto store = open(nullptr);
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(store->CheckConsistency(), absl::OkStatus()) << "round " << round << ", reopened";
    // Synced bytes survive a power cut: the index is never found damaged after one (a
    // rebuild from every slot would be slow, and would bring back erased chunks).
    ASSERT_EQ(store->Stats().index_rebuilds, 0u) << "round " << round;
    for (const ChunkKey& key : attempted) {
      const absl::Status st = ReadBack(*store, key);
      ASSERT_TRUE(st.ok() || absl::IsNotFound(st)) << "round " << round << ": " << st;
    }
    std::sort(stamped.begin(), stamped.end());
    std::vector<ChunkKey> acked;
    for (const auto& [stamp, key] : stamped) acked.push_back(key);
    const size_t newest = std::min<size_t>(kKeptChunks, acked.size());
    for (size_t i = acked.size() - newest; i < acked.size(); ++i) {
      ASSERT_TRUE(ReadBack(*store, acked[i]).ok())
          << "round " << round << ": acknowledged chunk " << acked.size() - i
          << " from the newest is gone";
    }
    EXPECT_LE(store->Usage(kGroup).ssd_bytes, (kQuotaChunks + 32 + kWriters) * kChunk)
        << "round " << round;
  }
  std::printf(
      "%d power cuts under a quota of %llu chunks: %zu acknowledged puts, %llu quota "
      "evictions\n",
      rounds, static_cast<unsigned long long>(kQuotaChunks), stamped.size(),
      static_cast<unsigned long long>(quota_evictions));
  EXPECT_GT(quota_evictions, 0u) << "the quota never evicted: the test tested nothing";
}

}  // namespace
}  // namespace kvc::storage
