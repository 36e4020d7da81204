// SSD size classes (docs/storage.md, "Size classes"): chunks of any size up to the largest
// store and fetch byte-exact in slots of their own size, are charged what those slots take,
// draw on one device budget whose coldest chunks give way whatever their class, survive a
// reopen, and a folder of the format before classes opens with every chunk.
// Real RocksDB, real slab files, real io_uring (or the POSIX fallback).
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/chunk_index.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::ConsistentOnceQuiet;
using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;

// The reference model's 256-token chunk: kvcached's first class.
constexpr uint64_t kFirstChunk = 227840;

StoreOptions Options(const std::string& dir, uint64_t ssd_bytes) {
  StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = 8ull << 20;
  o.first_class_chunk_bytes = kFirstChunk;
  o.ssd_bytes = ssd_bytes;
  o.slab_bytes = 8ull << 20;
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;  // no RAM tier: every put goes to SSD
}

std::unique_ptr<ChunkStore> OpenOrDie(const StoreOptions& o, const StoreSeams& seams = {}) {
  absl::StatusOr<std::unique_ptr<ChunkStore>> s = ChunkStore::Open(o, seams);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

absl::Status Put(ChunkStore& s, NamespaceId ns, const ChunkKey& key, uint64_t bytes) {
  return s.Put({ns, key, std::nullopt, PayloadOf(key, bytes)}, {Durability::kDurable, 0}).status();
}

// OK if the chunk reads back exactly; NotFound if absent; anything else is a failure.
absl::Status ReadBack(ChunkStore& s, NamespaceId ns, const ChunkKey& key, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  absl::Status st = s.Get(ns, key, out);
  if (st.ok() && out != PayloadOf(key, bytes))
    return absl::DataLossError("served bytes that differ from what was stored");
  return st;
}

// A real engine's page sizes, from a 4 KiB page to SGLang's DeepSeek-V3 MLA host page
// (61 layers × 64 tokens × 576 × bf16), each in its own namespace.
const std::vector<uint64_t> kSizes = {4096, 16384, 20352, 57344, kFirstChunk, 1048576, 4497408};

TEST(SizeClassesTest, ChunksOfEverySizeStoreFetchAndReopenByteExactChargedTheirOwnSlot) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  const StoreOptions o = Options(dir.path(), 96ull << 20);
  constexpr uint64_t kEach = 3;
  uint64_t payload = 0, slots = 0;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const NamespaceId ns = static_cast<NamespaceId>(10 + i);
      ASSERT_TRUE(store->RegisterNamespace(ns, kSizes[i]).ok()) << kSizes[i];
      for (uint64_t k = 0; k < kEach; ++k) {
        ASSERT_EQ(Put(*store, ns, KeyOf(seed, i * 100 + k), kSizes[i]), absl::OkStatus())
            << kSizes[i];
      }
      payload += kEach * kSizes[i];
      slots += kEach * SlotBytesFor(kSizes[i]);
    }
    for (size_t i = 0; i < kSizes.size(); ++i) {
      for (uint64_t k = 0; k < kEach; ++k) {
        EXPECT_EQ(
            ReadBack(*store, static_cast<NamespaceId>(10 + i), KeyOf(seed, i * 100 + k), kSizes[i]),
            absl::OkStatus())
            << kSizes[i];
      }
    }
    const StoreStats st = store->Stats();
    EXPECT_EQ(st.ssd_bytes, slots) << "each chunk is charged its own slot";
    // One class per slot size (16,384 and 20,352 bytes both take 20,480), the first first.
    std::map<uint64_t, uint64_t> per_slot;
    for (uint64_t bytes : kSizes) per_slot[SlotBytesFor(bytes)] += kEach;
    ASSERT_EQ(st.ssd_classes.size(), per_slot.size());
    EXPECT_EQ(st.ssd_classes[0].slot_bytes, SlotBytesFor(kFirstChunk));
    for (const StoreStats::SsdClassStats& c : st.ssd_classes)
      EXPECT_EQ(c.chunks, per_slot[c.slot_bytes]) << c.slot_bytes;
    std::printf("%llu payload bytes take %llu bytes of slots: %.4f per payload byte\n",
                static_cast<unsigned long long>(payload), static_cast<unsigned long long>(slots),
                static_cast<double>(slots) / static_cast<double>(payload));
    for (uint64_t bytes : kSizes) {
      // The slot the store reads each size from: header + payload rounded up to 4 KiB, so
      // at most one page over the payload (the store's choice of class and format).
      const ChunkStore::ReadRoom room = store->ReadRoomFor(bytes);
      EXPECT_EQ(room.bytes, SlotBytesFor(bytes)) << bytes;
      EXPECT_EQ(room.before, kSlotHeaderBytes) << bytes;
      EXPECT_LE(room.bytes - bytes, kSlotAlignment) << bytes;
    }
    EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
  }
  // Reopened: every class comes back from the folder, every chunk reads.
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CheckConsistency(), absl::OkStatus());
  for (size_t i = 0; i < kSizes.size(); ++i) {
    for (uint64_t k = 0; k < kEach; ++k) {
      EXPECT_EQ(
          ReadBack(*store, static_cast<NamespaceId>(10 + i), KeyOf(seed, i * 100 + k), kSizes[i]),
          absl::OkStatus())
          << kSizes[i] << " after the reopen";
    }
  }
  EXPECT_EQ(store->Stats().ssd_bytes, slots);
  EXPECT_EQ(store->Stats().recovered_chunks, 0u) << "a clean close left the index complete";
}

// A chunk larger than the largest, or whose slot is larger than the whole budget, is
// refused naming why; nothing else changes.
TEST(SizeClassesTest, AChunkPastTheLargestOrTheBudgetIsRefused) {
  testing::TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 4ull << 20));
  ASSERT_NE(store, nullptr);
  const absl::Status too_large = store->RegisterNamespace(1, (8ull << 20) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(too_large)) << too_large;
  ASSERT_TRUE(store->RegisterNamespace(2, 4497408).ok());
  const absl::Status past_budget = Put(*store, 2, KeyOf(testing::FreshSeed(), 1), 4497408);
  EXPECT_TRUE(absl::IsResourceExhausted(past_budget)) << past_budget;
  EXPECT_NE(past_budget.message().find("more than the SSD tier's"), std::string::npos)
      << past_budget;
  EXPECT_EQ(store->CheckConsistency(), absl::OkStatus());
}

uint64_t SlabFiles(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) n += e.is_regular_file();
  return n;
}

// One device budget: a burst of large pages makes room from the coldest small chunks of
// another class, the slots taken never pass the budget (by more than the slot a
// reservation names next), and the small class's emptied slabs go back to the disk.
TEST(SizeClassesTest, TheColdestChunksGiveWayWhateverTheirClass) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  const uint64_t budget = 8ull << 20;
  StoreOptions o = Options(dir.path(), budget);
  o.slab_bytes = 1ull << 20;  // slabs of 51 small chunks
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  constexpr NamespaceId kSmall = 1, kLarge = 2;
  constexpr uint64_t kSmallBytes = 16384, kLargeBytes = 1048576;
  ASSERT_TRUE(store->RegisterNamespace(kSmall, kSmallBytes).ok());
  ASSERT_TRUE(store->RegisterNamespace(kLarge, kLargeBytes).ok());
  // Small chunks fill about 3/4 of the budget.
  const uint64_t small = budget * 3 / 4 / SlotBytesFor(kSmallBytes);
  for (uint64_t i = 0; i < small; ++i)
    ASSERT_EQ(Put(*store, kSmall, KeyOf(seed, i), kSmallBytes), absl::OkStatus()) << i;
  const std::string small_slabs =
      dir.path() + "/slabs/c" + std::to_string(SlotBytesFor(kSmallBytes));
  EXPECT_GE(SlabFiles(small_slabs), small / (o.slab_bytes / SlotBytesFor(kSmallBytes)));
  // Then large pages, three times the budget's worth.
  const uint64_t large = 3 * budget / SlotBytesFor(kLargeBytes);
  for (uint64_t i = 0; i < large; ++i) {
    ASSERT_EQ(Put(*store, kLarge, KeyOf(seed, 1'000'000 + i), kLargeBytes), absl::OkStatus()) << i;
    const StoreStats st = store->Stats();
    ASSERT_LE(st.ssd_taken_bytes, budget + SlotBytesFor(kLargeBytes)) << "past the budget";
  }
  // The newest large pages are there; the oldest small chunks went for them.
  EXPECT_EQ(ReadBack(*store, kLarge, KeyOf(seed, 1'000'000 + large - 1), kLargeBytes),
            absl::OkStatus());
  EXPECT_TRUE(absl::IsNotFound(ReadBack(*store, kSmall, KeyOf(seed, 0), kSmallBytes)));
  uint64_t small_left = 0;
  for (uint64_t i = 0; i < small; ++i) {
    const absl::Status st = ReadBack(*store, kSmall, KeyOf(seed, i), kSmallBytes);
    ASSERT_TRUE(st.ok() || absl::IsNotFound(st)) << st;
    small_left += st.ok();
  }
  EXPECT_EQ(small_left, 0u) << "large pages evicted only their own class";
  // Its slabs went back to the disk (but the one holding the slot its next reservation
  // starts on).
  EXPECT_LE(SlabFiles(small_slabs), 1u);
  const StoreStats st = store->Stats();
  EXPECT_GE(st.ssd_bytes, budget / 2) << "the budget is used, not left to one class";
  EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
}

// Slabs are laid out one ahead of use (as kvcached does, in the background), not the whole
// budget: a class that holds one chunk of a 1 GiB budget has its first slab and the next.
TEST(SizeClassesTest, SlabsAreLaidOutOneAheadOfUseNotTheWholeBudget) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  StoreOptions o = Options(dir.path(), 1ull << 30);
  o.slab_bytes = 1ull << 20;
  o.preallocate_ssd_background = true;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->RegisterNamespace(1, 16384).ok());
  ASSERT_EQ(Put(*store, 1, KeyOf(seed, 1), 16384), absl::OkStatus());
  const std::string slabs = dir.path() + "/slabs/c" + std::to_string(SlotBytesFor(16384));
  for (int i = 0; i < 200 && SlabFiles(slabs) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // time to run on, if it would
  EXPECT_EQ(SlabFiles(slabs), 2u) << "the slab in use and the next";
  EXPECT_EQ(SlabFiles(dir.path() + "/slabs"), 0u) << "the first class is not used";
}

// The tenant of the storage-v3 issue: 100 chunks of 20,352 bytes (2 MB) under an 8 MB SSD
// quota. Charged their own 20,480-byte slots (not the largest chunk's), they all fit, and
// tier pressure spares a tenant within its quota: it keeps all 100 while another tenant
// floods the tier with reference-size chunks.
TEST(SizeClassesTest, ATenantOfSmallChunksKeepsThemAllUnderItsQuotaWhileAnotherFloods) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 32ull << 20));
  ASSERT_NE(store, nullptr);
  constexpr NamespaceId kSmall = 1, kFlood = 2;
  constexpr uint64_t kSmallBytes = 20352;
  ASSERT_TRUE(store->RegisterNamespace(kSmall, kSmallBytes).ok());
  ASSERT_TRUE(store->RegisterNamespace(kFlood, kFirstChunk).ok());
  ASSERT_TRUE(store->SetQuota(1, {"tenant a", 0, 8'000'000, 0}).ok());
  store->SetQuotaGroup(kSmall, 1);
  for (uint64_t i = 0; i < 100; ++i)
    ASSERT_EQ(Put(*store, kSmall, KeyOf(seed, i), kSmallBytes), absl::OkStatus()) << i;
  EXPECT_EQ(store->Usage(1).ssd_bytes, 100 * SlotBytesFor(kSmallBytes));
  EXPECT_EQ(SlotBytesFor(kSmallBytes), 20480u) << "a header and the payload in 5 pages";
  // The flood: three times the tier.
  const uint64_t flood = 3 * (32ull << 20) / SlotBytesFor(kFirstChunk);
  for (uint64_t i = 0; i < flood; ++i)
    ASSERT_EQ(Put(*store, kFlood, KeyOf(seed, 1'000'000 + i), kFirstChunk), absl::OkStatus());
  uint64_t kept = 0;
  for (uint64_t i = 0; i < 100; ++i)
    kept += ReadBack(*store, kSmall, KeyOf(seed, i), kSmallBytes).ok();
  EXPECT_EQ(kept, 100u) << "tier pressure evicted a tenant within its quota";
  EXPECT_GT(store->Stats().ssd_evictions, 0u) << "the flood did fill the tier";
  EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
}

// A folder as the kvcached of before size classes left it: slot format 2, its records
// (version 2) under the old row prefix, none of the classes' metadata. It opens with every
// chunk, is marked format 3 at once (so that version would now refuse it), stores chunks of
// its own size in its slabs/ and of other sizes in classes, and reopens with all of them.
TEST(SizeClassesTest, AFolderOfTheFormatBeforeClassesKeepsEveryChunkAndGrowsClasses) {
  const uint64_t seed = testing::FreshSeed();
  testing::TempDir dir;
  StoreOptions o = Options(dir.path(), 16ull << 20);
  const StoreSeams format_2{.slot_format = 2};  // the folder as the version before wrote it
  constexpr NamespaceId kNs = 1, kOther = 2;
  {
    auto store = OpenOrDie(o, format_2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->RegisterNamespace(kNs, kFirstChunk).ok());
    for (uint64_t i = 0; i < 20; ++i)
      ASSERT_EQ(Put(*store, kNs, KeyOf(seed, i), kFirstChunk), absl::OkStatus());
  }
  // Rewrite the index as that version wrote it.
  {
    rocksdb::DB* raw = nullptr;
    rocksdb::Options ro;
    ASSERT_TRUE(rocksdb::DB::Open(ro, dir.path() + "/index", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    rocksdb::WriteBatch batch;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    int rows = 0;
    for (it->Seek("k"); it->Valid() && it->key().starts_with("k"); it->Next()) {
      std::string v2 = it->value().ToString();
      v2.resize(v2.size() - 4);  // version 3 less its size class
      v2[0] = 2;
      batch.Put("c" + it->key().ToString().substr(1), v2);
      batch.Delete(it->key());
      ++rows;
    }
    EXPECT_EQ(rows, 20);
    batch.Put("mslot_format", "2");
    for (const char* meta :
         {"mfirst_class_format", "mssd_classes", "mclass_slab_bytes", "mssd_bytes"})
      batch.Delete(meta);
    ASSERT_TRUE(db->Write(rocksdb::WriteOptions(), &batch).ok());
  }
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->CheckConsistency(), absl::OkStatus());
    for (uint64_t i = 0; i < 20; ++i)
      EXPECT_EQ(ReadBack(*store, kNs, KeyOf(seed, i), kFirstChunk), absl::OkStatus()) << i;
    EXPECT_EQ(store->Stats().recovered_chunks, 0u) << "read from the index, not the slots";
    ASSERT_TRUE(store->RegisterNamespace(kOther, 16384).ok());
    for (uint64_t i = 20; i < 30; ++i) {
      ASSERT_EQ(Put(*store, kNs, KeyOf(seed, i), kFirstChunk), absl::OkStatus());
      ASSERT_EQ(Put(*store, kOther, KeyOf(seed, 100 + i), 16384), absl::OkStatus());
    }
    EXPECT_EQ(store->Stats().ssd_classes.size(), 2u);
  }
  // Marked: what that version reads first (before any record) is the slot format.
  {
    std::unique_ptr<ChunkIndex> index = *ChunkIndex::Open(dir.path() + "/index");
    EXPECT_EQ(index->GetMeta("slot_format")->value_or(""), "3");
    EXPECT_EQ(index->GetMeta("first_class_format")->value_or(""), "2");
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/slabs/c20480/slab-000000.dat"));
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->CheckConsistency(), absl::OkStatus());
  for (uint64_t i = 0; i < 30; ++i)
    EXPECT_EQ(ReadBack(*store, kNs, KeyOf(seed, i), kFirstChunk), absl::OkStatus()) << i;
  for (uint64_t i = 20; i < 30; ++i)
    EXPECT_EQ(ReadBack(*store, kOther, KeyOf(seed, 100 + i), 16384), absl::OkStatus()) << i;
}

}  // namespace
}  // namespace kvc::storage
