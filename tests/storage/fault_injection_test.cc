// Every fault the I/O seam can inject gives a clean error or a miss; the store stays
// usable; nothing acknowledged before the fault is lost; no read returns wrong bytes.
#include "storage/fault_injection.h"

#include <memory>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;
using ::kvc::testing::TempDir;

constexpr uint64_t kChunk = 12000;  // spans 3 sectors, so torn writes can tear mid-chunk
constexpr NamespaceId kNs = 1;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    plan_ = std::make_shared<FaultPlan>(seed_);
    StoreOptions o;
    o.data_dir = dir_.path();
    o.max_chunk_bytes = kChunk;
    o.ssd_bytes = 256 * SlotBytesFor(kChunk);
    o.slab_bytes = 64 * SlotBytesFor(kChunk);
    o.queue_depth = 8;
    o.io_lanes = 1;
    absl::StatusOr<std::unique_ptr<ChunkStore>> s = ChunkStore::Open(o, {.faults = plan_});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    ASSERT_TRUE(store_->RegisterNamespace(kNs, kChunk).ok());
    // Chunks acknowledged before any fault: they must survive everything below.
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(i).ok());
  }

  absl::Status Put(uint64_t i) {
    const ChunkKey k = KeyOf(seed_, i);
    const std::vector<uint8_t> p = PayloadOf(k, kChunk);
    return store_->Put({kNs, k, {}, p}, {Durability::kDurable, 0}).status();
  }

  // OK with the exact bytes, or an error; never OK with other bytes.
  absl::Status GetChecked(uint64_t i) {
    const ChunkKey k = KeyOf(seed_, i);
    std::vector<uint8_t> out(kChunk);
    absl::Status st = store_->Get(kNs, k, out);
    if (st.ok()) {
      EXPECT_EQ(out, PayloadOf(k, kChunk)) << "wrong bytes handed out for " << i;
    }
    return st;
  }

  void ExpectEarlyChunksIntact() {
    plan_->set_rates({});
    for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(GetChecked(i).ok()) << i;
  }

  uint64_t seed_ = 0;
  TempDir dir_;
  std::shared_ptr<FaultPlan> plan_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(FaultTest, WriteEioIsACleanErrorAndNothingIsIndexed) {
  plan_->set_rates({.write_eio = 1});
  absl::Status st = Put(100);
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st;
  EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, 100)), Tier::kNone);
  ExpectEarlyChunksIntact();
  ASSERT_TRUE(Put(100).ok());  // usable again
  EXPECT_TRUE(GetChecked(100).ok());
}

TEST_F(FaultTest, EnospcIsResourceExhausted) {
  plan_->set_rates({.write_enospc = 1});
  absl::Status st = Put(100);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, 100)), Tier::kNone);
  ExpectEarlyChunksIntact();
}

TEST_F(FaultTest, FailedSyncIsNotAcknowledged) {
  plan_->set_rates({.sync_eio = 1});
  EXPECT_FALSE(Put(100).ok());
  EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, 100)), Tier::kNone);
  ExpectEarlyChunksIntact();
}

TEST_F(FaultTest, AFailedSyncOfANewSlabFailsTheWriteThatNeedsIt) {
  for (uint64_t i = 8; i < 64; ++i) ASSERT_TRUE(Put(i).ok());  // slab 0 is full
  plan_->set_rates({.new_slab_sync_eio = 1});
  absl::Status st = Put(64);  // the first chunk of slab 1
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_NE(st.message().find("fsync"), std::string::npos) << st;
  EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, 64)), Tier::kNone);
  ExpectEarlyChunksIntact();
  ASSERT_TRUE(Put(64).ok()) << "the slab is laid out again";
  EXPECT_TRUE(GetChecked(64).ok());
}

TEST_F(FaultTest, ReadEioAndShortReadsAreErrorsThatKeepTheEntry) {
  for (FaultRates rates : {FaultRates{.read_eio = 1}, FaultRates{.short_read = 1}}) {
    plan_->set_rates(rates);
    absl::Status st = GetChecked(3);
    EXPECT_TRUE(absl::IsInternal(st)) << st;
    plan_->set_rates({});
    EXPECT_TRUE(GetChecked(3).ok());  // transient: the entry was kept
  }
  EXPECT_EQ(store_->Stats().read_errors, 2u);
  ExpectEarlyChunksIntact();
}

TEST_F(FaultTest, TornWritesAndFlippedBitsAreMissesNeverBadBytes) {
  // A torn write always loses payload sectors: a miss, and the entry is dropped.
  plan_->set_rates({.torn_write = 1});
  ASSERT_TRUE(Put(100).ok());  // the disk lied: the store cannot tell yet
  plan_->set_rates({});
  absl::Status st = GetChecked(100);
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, 100)), Tier::kNone);
  uint64_t detected = 1;
  // A flipped bit (on the way to the disk, or back) can land in the slot's zero padding
  // past the payload (I/O is whole sectors; ~2 % of the bits here), which no checksum
  // covers and no reader sees: then the chunk reads back intact. Otherwise it is a miss.
  // GetChecked fails the test if wrong bytes are ever handed out. Three chunks each, so
  // that a detection is all but certain (all three in the padding: ~1e-5).
  for (const bool on_write : {true, false}) {
    int misses = 0;
    for (uint64_t id : {101, 102, 103}) {
      const uint64_t chunk = on_write ? id : id - 96;  // reads: early chunks 5, 6, 7
      if (on_write) {
        plan_->set_rates({.flip_bit_on_write = 1});
        ASSERT_TRUE(Put(chunk).ok());
        plan_->set_rates({});
      } else {
        plan_->set_rates({.flip_bit_on_read = 1});
      }
      st = GetChecked(chunk);
      plan_->set_rates({});
      if (st.ok()) continue;
      EXPECT_TRUE(absl::IsNotFound(st)) << st;
      EXPECT_EQ(store_->Contains(kNs, KeyOf(seed_, chunk)), Tier::kNone);
      ++misses;
    }
    EXPECT_GE(misses, 1) << (on_write ? "flips on write" : "flips on read");
    detected += misses;
  }
  EXPECT_EQ(store_->Stats().checksum_failures, detected);
  for (uint64_t chunk : {5, 6, 7}) {  // a dropped chunk can be stored again
    ASSERT_TRUE(Put(chunk).ok());
    EXPECT_TRUE(GetChecked(chunk).ok()) << chunk;
  }
}

TEST_F(FaultTest, RandomFaultSoakNeverReturnsWrongBytes) {
  plan_->set_rates({.read_eio = 9,
                    .write_eio = 9,
                    .write_enospc = 13,
                    .short_read = 11,
                    .torn_write = 7,
                    .flip_bit_on_write = 7,
                    .flip_bit_on_read = 11,
                    .sync_eio = 17});
  std::mt19937_64 rng(seed_);
  int ok_reads = 0, failed = 0;
  for (int op = 0; op < 400; ++op) {
    const uint64_t id = 1000 + rng() % 60;
    if (rng() % 2) {
      failed += !Put(id).ok();
    } else {
      absl::Status st = GetChecked(id);  // asserts the bytes when OK
      ok_reads += st.ok();
    }
  }
  std::printf("soak: %d good reads, %d failed puts, %llu faults injected\n", ok_reads, failed,
              static_cast<unsigned long long>(plan_->injected.load()));
  EXPECT_GT(plan_->injected.load(), 20u);
  // Failed writes, syncs and reads gave back or held back every slot they took.
  EXPECT_EQ(testing::ConsistentOnceQuiet(*store_), absl::OkStatus());
  // The soak never touched the early chunks: all of them must still be intact.
  plan_->set_rates({});
  int intact = 0;
  for (uint64_t i = 0; i < 8; ++i) intact += GetChecked(i).ok();
  EXPECT_EQ(intact, 8);
}

}  // namespace
}  // namespace kvc::storage
