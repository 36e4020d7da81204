// The index rebuilt from the slots: a damaged RocksDB WAL, a lost index folder, and a
// folder made in slot format 1 (before slots carried parents) opened by this version.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"
#include "tests/storage/open_store.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;

constexpr uint64_t kChunk = 9000;
constexpr NamespaceId kNs = 11;
constexpr uint64_t kSlots = 512;

StoreOptions Options(const std::string& dir, uint16_t slot_format = 0) {
  StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kChunk;
  o.ssd_bytes = kSlots * SlotBytesFor(kChunk, slot_format == 0 ? kSlotFormatVersion : slot_format);
  o.slab_bytes = 128 * SlotBytesFor(kChunk);
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;
}

std::unique_ptr<ChunkStore> Open(const StoreOptions& o, const StoreSeams& seams = {}) {
  return testing::OpenStoreWith(o, kNs, kChunk, seams);
}

void PutAll(ChunkStore& s, uint64_t seed, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
    std::optional<ChunkKey> parent;
    if (i % 10 != 0) parent = KeyOf(seed, i - 1);
    ASSERT_TRUE(s.Put({kNs, KeyOf(seed, i), parent, p}, {}).ok()) << i;
  }
}

void ExpectAll(ChunkStore& s, uint64_t seed, uint64_t n) {
  std::vector<uint8_t> out(kChunk);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(s.Get(kNs, KeyOf(seed, i), out).ok()) << "chunk " << i << " lost";
    ASSERT_EQ(out, PayloadOf(KeyOf(seed, i), kChunk)) << "chunk " << i;
  }
  EXPECT_EQ(s.Stats().ssd_chunks, n);
}

// A store of n chunks (PutAll), closed.
void Fill(const std::string& dir, uint64_t seed, uint64_t n) {
  auto store = Open(Options(dir));
  ASSERT_NE(store, nullptr);
  PutAll(*store, seed, n);
}

// The index's largest write-ahead log file (empty if it has none with bytes in it).
std::filesystem::path LargestWal(const std::string& dir) {
  std::filesystem::path largest;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/index")) {
    if (e.path().extension() == ".log" && e.file_size() > 0 &&
        (largest.empty() || e.file_size() > std::filesystem::file_size(largest)))
      largest = e.path();
  }
  return largest;
}

TEST(IndexDamageTest, AWalDamagedInTheMiddleIsDetectedAndEveryChunkComesBackFromTheSlots) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 200;
  // 20 bytes flipped in the first half of the WAL (the review's finding: 194 of 200
  // chunks were gone at the next start, silently).
  Fill(dir.path(), seed, kChunks);
  const std::filesystem::path wal = LargestWal(dir.path());
  ASSERT_FALSE(wal.empty());
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t size = std::filesystem::file_size(wal);
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 20; ++i) {
      const uint64_t at = size / 8 + rng() % (size / 2);
      f.seekg(static_cast<std::streamoff>(at));
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5A);
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&c, 1);
    }
  }
  auto store = Open(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectAll(*store, seed, kChunks);
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.index_rebuilds, 1u) << "the damage went unnoticed";
  EXPECT_GT(st.recovered_chunks, 0u);
}

// RocksDB cannot tell a WAL cut short from a crash's torn tail: it opens, silently, with
// every record after the cut gone — synced reservations among them, and with them the
// entries of every chunk written into their slots. The slot the last surviving record
// names as the next reservation's first holds such a chunk, and gives the loss away.
TEST(IndexDamageTest, AWalCutShortIsDetectedAndEveryChunkComesBackFromTheSlots) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 200;
  Fill(dir.path(), seed, kChunks);
  const std::filesystem::path wal = LargestWal(dir.path());
  ASSERT_FALSE(wal.empty());
  std::mt19937_64 rng(seed);
  const uint64_t size = std::filesystem::file_size(wal);
  const uint64_t keep = size / 4 + rng() % (size / 2);
  std::filesystem::resize_file(wal, keep);
  std::printf("the WAL cut from %llu to %llu bytes\n", static_cast<unsigned long long>(size),
              static_cast<unsigned long long>(keep));
  auto store = Open(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectAll(*store, seed, kChunks);
  EXPECT_EQ(store->Stats().index_rebuilds, 1u) << "the cut went unnoticed";
  EXPECT_TRUE(store->CheckConsistency().ok()) << store->CheckConsistency();
}

// The newest chunk erased, then two restarts: its bytes stay in a slot the index no longer
// lists. Numbering must resume above them (the records' sequence bound), else the first
// restart reuses the erased chunk's sequence and the second reads its bytes, in the slot
// named for the next reservation, as written under a lost reservation — a false alarm
// that rebuilds the index from every slot and brings the erased chunk back.
TEST(RecoveryTest, AnErasedNewestChunkStaysErasedAcrossRestartsAndRaisesNoAlarm) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 5;
  {
    auto store = Open(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    PutAll(*store, seed, kChunks);
    ASSERT_TRUE(store->Erase(kNs, KeyOf(seed, kChunks - 1)).ok());
  }
  for (int restart = 0; restart < 2; ++restart) {
    auto store = Open(Options(dir.path()));
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().index_rebuilds, 0u) << "restart " << restart;
    std::vector<uint8_t> out(kChunk);
    EXPECT_TRUE(absl::IsNotFound(store->Get(kNs, KeyOf(seed, kChunks - 1), out)))
        << "restart " << restart << ": the erased chunk is back";
    for (uint64_t i = 0; i + 1 < kChunks; ++i)
      EXPECT_TRUE(store->Get(kNs, KeyOf(seed, i), out).ok()) << "restart " << restart << ": " << i;
  }
}

TEST(IndexDamageTest, ALostIndexFolderIsRebuiltFromTheSlots) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 120;
  Fill(dir.path(), seed, kChunks);
  std::filesystem::remove_all(dir.path() + "/index");
  auto store = Open(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectAll(*store, seed, kChunks);
  EXPECT_EQ(store->Stats().index_rebuilds, 1u);
  EXPECT_EQ(store->Stats().recovered_chunks, kChunks);
}

// A rebuild from the slots whose reads fail half the time still opens: each failed read
// is tried again, and a slot whose reads all fail costs its own chunk, not the store.
// Every chunk found is byte-exact; the rest are counted as unreadable, not served.
TEST(IndexDamageTest, SlotsThatCannotBeReadCostTheirChunksNotTheOpen) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 120;
  Fill(dir.path(), seed, kChunks);
  std::filesystem::remove_all(dir.path() + "/index");
  StoreSeams seams;
  seams.faults = std::make_shared<FaultPlan>(seed);
  FaultRates half;
  half.read_eio = 2;
  seams.faults->set_rates(half);
  auto store = Open(Options(dir.path()), seams);
  ASSERT_NE(store, nullptr) << "a rebuild with unreadable slots must still open";
  seams.faults->set_rates({});  // the reads below see the disk as it is
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.index_rebuilds, 1u);
  // 1 in 16 slots fails all 4 reads: some are unreadable, most recovered.
  EXPECT_GT(st.unreadable_slots_at_open, 0u);
  EXPECT_GT(st.recovered_chunks, kChunks / 2);
  EXPECT_LE(st.recovered_chunks, kChunks);
  std::vector<uint8_t> out(kChunk);
  uint64_t found = 0;
  for (uint64_t i = 0; i < kChunks; ++i) {
    const absl::Status got = store->Get(kNs, KeyOf(seed, i), out);
    if (absl::IsNotFound(got)) continue;
    ASSERT_TRUE(got.ok()) << got;
    ASSERT_EQ(out, PayloadOf(KeyOf(seed, i), kChunk)) << "chunk " << i;
    ++found;
  }
  EXPECT_EQ(found, st.recovered_chunks);
  EXPECT_EQ(st.ssd_chunks, found);
  // A chunk is stored over an unreadable slot's place as over a free one; a reopen (no
  // faults) keeps every chunk found.
  PutAll(*store, seed + 1, 8);
  store.reset();
  store = Open(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(store->Get(kNs, KeyOf(seed + 1, i), out).ok()) << "chunk " << i << " lost";
    ASSERT_EQ(out, PayloadOf(KeyOf(seed + 1, i), kChunk)) << "chunk " << i;
  }
  EXPECT_EQ(store->Stats().ssd_chunks, found + 8);
}

// A chunk's origin (the client's key and parent, which a cluster node places it by) is kept
// through every path a chunk takes: stored durably, stored in RAM and written behind,
// reopened from the index, and rebuilt from the slots alone after the index is lost.
TEST(OriginTest, TheClientsKeyAndParentSurviveRamSsdReopenAndARebuiltIndex) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kChunks = 40;
  StoreOptions o = Options(dir.path());
  o.ram_bytes = 8 * RamSlotBytes(kChunk);  // RAM too, so memory puts go through it
  auto origin_of = [&](uint64_t i) -> std::optional<ChunkOrigin> {
    if (i % 7 == 3) return std::nullopt;  // a chunk stored without one
    ChunkOrigin origin{KeyOf(seed ^ 0x0123, i), std::nullopt};
    if (i % 5 != 0) origin.parent = KeyOf(seed ^ 0x0123, i - 1);
    return origin;
  };
  auto expect_origins = [&](const ChunkStore& s, const char* when) {
    const std::vector<ChunkStore::ChunkListing> list = s.ListChunks();
    ASSERT_EQ(list.size(), kChunks) << when;
    for (size_t k = 1; k < list.size(); ++k) ASSERT_LT(list[k - 1].key, list[k].key) << when;
    std::map<ChunkKey, std::optional<ChunkOrigin>> got;
    for (const ChunkStore::ChunkListing& c : list) {
      EXPECT_EQ(c.namespace_id, kNs);
      EXPECT_EQ(c.payload_bytes, kChunk);
      got[c.key] = c.origin;
    }
    for (uint64_t i = 0; i < kChunks; ++i) {
      EXPECT_EQ(got.at(KeyOf(seed, i)), origin_of(i)) << when << ": chunk " << i;
    }
  };
  {
    auto store = Open(o);
    ASSERT_NE(store, nullptr);
    for (uint64_t i = 0; i < kChunks; ++i) {
      const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
      const Durability d = i % 2 ? Durability::kMemory : Durability::kDurable;
      PutRequest req{kNs, KeyOf(seed, i), std::nullopt, p};
      req.origin = origin_of(i);
      ASSERT_TRUE(store->Put(req, {d}).ok()) << i;
    }
    expect_origins(*store, "in RAM and on SSD");
    ASSERT_TRUE(store->Flush().ok());
    expect_origins(*store, "after the write-behind");
  }
  {
    auto store = Open(o);
    ASSERT_NE(store, nullptr);
    expect_origins(*store, "reopened");
  }
  std::filesystem::remove_all(dir.path() + "/index");
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().index_rebuilds, 1u);
  expect_origins(*store, "index rebuilt from the slots");
  // Listed a shard at a time (what repair does), every chunk comes once, in its shard.
  const std::vector<ChunkStore::ChunkListing> all = store->ListChunks();
  std::map<ChunkKey, uint32_t> shard_of;
  for (uint32_t shard = 0; shard < 3; ++shard) {
    for (const ChunkStore::ChunkListing& c : store->ListChunks(shard, 3)) {
      EXPECT_TRUE(shard_of.emplace(c.key, shard).second) << c.key.Hex() << " in two shards";
      EXPECT_EQ(c.key.Prefix64() % 3, shard);
    }
  }
  EXPECT_EQ(shard_of.size(), all.size());
}

TEST(SlotFormatUpgradeTest, AFolderMadeInFormat1KeepsItsChunksAndItsFormat) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  {
    auto store = Open(Options(dir.path(), /*slot_format=*/1), {.slot_format = 1});
    ASSERT_NE(store, nullptr);
    PutAll(*store, seed, 50);
  }
  // Opened as any folder is now (no format asked): it stays format 1, old chunks read,
  // new chunks are written and read in format 1, and it survives a reopen.
  {
    auto store = Open(Options(dir.path(), /*slot_format=*/1), {.slot_format = 1});
    ASSERT_NE(store, nullptr);
    ExpectAll(*store, seed, 50);
    const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, 50), kChunk);
    ASSERT_TRUE(store->Put({kNs, KeyOf(seed, 50), KeyOf(seed, 49), p}, {}).ok());
  }
  auto store = Open(Options(dir.path()));
  ASSERT_NE(store, nullptr);
  ExpectAll(*store, seed, 51);
  // The slab's first slot holds a 64-byte format-1 header.
  std::ifstream slab(dir.path() + "/slabs/slab-000000.dat", std::ios::binary);
  std::vector<uint8_t> head(kSlotHeaderBytesV1);
  slab.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
  absl::StatusOr<DecodedSlot> d = DecodeSlotHeader(head);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->version, 1);
}

// The index keeps last access in whole seconds; after a reopen, chunks written within one
// second must still leave in the order they were written (the write sequence breaks the
// tie), not in key order: a full tier then evicts the oldest of them first.
TEST(RecoveryTest, AfterAReopenChunksOfOneSecondLeaveInTheOrderTheyWereWritten) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  StoreOptions o = Options(dir.path());
  constexpr uint64_t kFull = 16;
  o.ssd_bytes = kFull * SlotBytesFor(kChunk);
  o.slab_bytes = kFull * SlotBytesFor(kChunk);
  const StoreSeams one_second{.now_s = [] { return int64_t{1'800'000'000}; }};  // every write
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < kFull; ++i) keys.push_back(KeyOf(seed, i));
  {
    auto s = Open(o, one_second);
    ASSERT_NE(s, nullptr);
    for (const ChunkKey& k : keys) {
      const std::vector<uint8_t> p = PayloadOf(k, kChunk);
      ASSERT_TRUE(s->Put({kNs, k, std::nullopt, p}, {Durability::kDurable, 0}).ok());
    }
  }
  auto s = Open(o, one_second);
  ASSERT_NE(s, nullptr);
  // Each new chunk evicts one (the tier is full): the first ones written go, in order.
  for (uint64_t i = 0; i < 4; ++i) {
    const ChunkKey k = KeyOf(seed, 1000 + i);
    const std::vector<uint8_t> p = PayloadOf(k, kChunk);
    ASSERT_TRUE(s->Put({kNs, k, std::nullopt, p}, {Durability::kDurable, 0}).ok());
    for (uint64_t j = 0; j < kFull; ++j) {
      EXPECT_EQ(s->Contains(kNs, keys[j]) == Tier::kNone, j <= i)
          << "after put " << i << ", chunk " << j;
    }
  }
}

// StoreOptions::load_index_in_background: Open returns before the records are in memory;
// meanwhile lookups and reads are answered from the index on disk, byte-exact, and a write
// waits for the load, then lands. (The loader is held at its start so that every check
// below runs while it loads.)
TEST(BackgroundLoadTest, LookupsAndReadsAreServedWhileTheIndexLoadsAndWritesWaitForIt) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kStored = 300;
  Fill(dir.path(), seed, kStored);
  StoreOptions o = Options(dir.path());
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  o.load_index_in_background = true;
  absl::StatusOr<std::unique_ptr<ChunkStore>> opened =
      ChunkStore::Open(o, {.before_index_load = [gate] { gate.wait(); }});
  ASSERT_TRUE(opened.ok()) << opened.status();
  ChunkStore& s = **opened;
  ASSERT_TRUE(s.RegisterNamespace(kNs, kChunk).ok());  // registering does not wait
  EXPECT_TRUE(s.StatsNow().index_loading);
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < kStored; ++i) keys.push_back(KeyOf(seed, i));
  keys.push_back(KeyOf(seed, kStored + 7));  // never stored
  const std::vector<Tier> tiers = s.Lookup(kNs, keys, /*leading_only=*/false);
  for (uint64_t i = 0; i < kStored; ++i) ASSERT_EQ(tiers[i], Tier::kSsd) << "chunk " << i;
  EXPECT_EQ(tiers[kStored], Tier::kNone);
  EXPECT_EQ(s.Lookup(kNs, keys, /*leading_only=*/true)[kStored], Tier::kNone);
  EXPECT_EQ(s.Lookup(kNs + 1, std::span(keys).first(1))[0], Tier::kNone) << "another namespace";
  std::vector<uint8_t> out(kChunk);
  for (uint64_t i = 0; i < kStored; i += 7) {
    ASSERT_TRUE(s.Get(kNs, keys[i], out).ok()) << "chunk " << i;
    ASSERT_EQ(out, PayloadOf(keys[i], kChunk)) << "chunk " << i;
  }
  EXPECT_TRUE(absl::IsNotFound(s.Get(kNs, keys[kStored], out)));
  EXPECT_TRUE(s.StatsNow().index_loading);
  // A write waits for the load.
  const ChunkKey fresh = KeyOf(seed, kStored);
  const std::vector<uint8_t> fresh_bytes = PayloadOf(fresh, kChunk);
  std::future<absl::StatusOr<PutResult>> put = std::async(std::launch::async, [&] {
    return s.Put({kNs, fresh, std::nullopt, fresh_bytes}, {});
  });
  EXPECT_EQ(put.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "a write went ahead of the load";
  // Readers across the load's end (from the disk, then from memory): every stored chunk
  // reads back exact throughout, while the write and more go in.
  std::atomic<bool> done{false};
  std::future<std::string> reader = std::async(std::launch::async, [&]() -> std::string {
    std::vector<uint8_t> got(kChunk);
    for (uint64_t n = 0; !done.load() || n < 200; ++n) {
      const uint64_t i = (n * 37) % kStored;
      if (absl::Status st = s.Get(kNs, keys[i], got); !st.ok())
        return "chunk " + std::to_string(i) + ": " + st.ToString();
      if (got != PayloadOf(keys[i], kChunk)) return "chunk " + std::to_string(i) + " differs";
      if (s.Lookup(kNs, std::span(keys).subspan(i, 1))[0] == Tier::kNone)
        return "chunk " + std::to_string(i) + " not found";
    }
    return "";
  });
  go.set_value();
  ASSERT_TRUE(put.get().ok());
  for (uint64_t i = 1; i <= 20; ++i) {
    const ChunkKey k = KeyOf(seed, 10'000 + i);
    ASSERT_TRUE(s.Put({kNs, k, std::nullopt, PayloadOf(k, kChunk)}, {}).ok());
    ASSERT_TRUE(s.Erase(kNs, k).ok());  // frees its slot again for the next
  }
  done = true;
  EXPECT_EQ(reader.get(), "");
  EXPECT_FALSE(s.StatsNow().index_loading);
  EXPECT_GT(s.Stats().index_load_s, 0.0);
  ExpectAll(s, seed, kStored + 1);
  EXPECT_EQ(testing::ConsistentOnceQuiet(s), absl::OkStatus());
  opened->reset();
  // And the next background open finds everything (no gate: the load runs at once).
  opened = ChunkStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE((*opened)->RegisterNamespace(kNs, kChunk).ok());
  EXPECT_EQ((*opened)->CountChunks({kNs}).ssd, kStored + 1);  // waits for the load
  ExpectAll(**opened, seed, kStored + 1);
}

// A table of the index that does not read, found by the background load's scan: the
// on-disk lookups stop, the index is salvaged and rebuilt from the slots, and every chunk
// is kept — as an open that found the damage itself.
TEST(BackgroundLoadTest, ADamagedTableFoundByTheLoadIsRebuiltFromTheSlots) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  constexpr uint64_t kStored = 300;
  Fill(dir.path(), seed, kStored);
  StoreOptions o = Options(dir.path());
  {  // The records into a table, then bytes of its first data block overwritten.
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path() + "/index", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Flush(rocksdb::FlushOptions()).ok());
  }
  std::string table;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/index")) {
    if (e.path().extension() == ".sst" &&
        (table.empty() || e.file_size() > std::filesystem::file_size(table)))
      table = e.path().string();
  }
  ASSERT_FALSE(table.empty());
  {
    std::fstream f(table, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(256);
    const std::string junk(1024, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  o.load_index_in_background = true;
  absl::StatusOr<std::unique_ptr<ChunkStore>> opened = ChunkStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ChunkStore& s = **opened;
  ASSERT_TRUE(s.RegisterNamespace(kNs, kChunk).ok());
  const StoreStats st = s.Stats();  // waits for the load
  EXPECT_EQ(st.index_rebuilds, 1u);
  EXPECT_EQ(st.recovered_chunks, kStored);
  ExpectAll(s, seed, kStored);
  EXPECT_EQ(testing::ConsistentOnceQuiet(s), absl::OkStatus());
}

}  // namespace
}  // namespace kvc::storage
