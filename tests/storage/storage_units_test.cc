// Unit tests of the storage building blocks: slot format, index records, eviction order,
// disk space, the RAM tier's slot bookkeeping.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <xxhash.h>

#include "engine/spec/chunk_layout.h"
#include "gtest/gtest.h"
#include "storage/chunk_index.h"
#include "storage/disk_space.h"
#include "storage/eviction.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"
#include "storage/slot_reservation.h"
#include "storage/xxh3.h"
#include "tests/engine/spec/config_fixtures.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::KeyOf;

TEST(SlotFormatTest, OverheadForTheReferenceChunkIsUnderOnePercent) {
  const ModelConfig c = testing::ParseOrDie(testing::LoadJson(testing::kReferenceConfig()));
  const ChunkLayout l = *BuildChunkLayout(c, *BuildLayerSchedule(c), kDefaultChunkTokens);
  const uint64_t slot = SlotBytesFor(static_cast<uint64_t>(l.chunk_bytes));
  EXPECT_EQ(slot % kSlotAlignment, 0u);
  const double overhead = static_cast<double>(slot) / static_cast<double>(l.chunk_bytes) - 1.0;
  std::printf("slot %llu B for a %lld B chunk: %.3f%% overhead\n",
              static_cast<unsigned long long>(slot), static_cast<long long>(l.chunk_bytes),
              100 * overhead);
  EXPECT_LE(overhead, 0.01);
}

SlotHeader HeaderOf(NamespaceId ns, uint32_t bytes, const ChunkKey& key, uint64_t checksum,
                    uint64_t sequence) {
  SlotHeader h;
  h.namespace_id = ns;
  h.payload_bytes = bytes;
  h.key = key;
  h.payload_checksum = checksum;
  h.sequence = sequence;
  return h;
}

TEST(SlotFormatTest, VerifyCatchesEveryMismatchInEitherFormat) {
  const uint64_t seed = testing::FreshSeed();
  const ChunkKey key = KeyOf(seed, 1);
  const std::vector<uint8_t> payload = testing::PayloadOf(key, 5000);
  for (uint16_t version : {uint16_t{1}, uint16_t{2}}) {
    SCOPED_TRACE(::testing::Message() << "slot format " << version);
    const uint32_t header = SlotHeaderBytes(version);
    std::vector<uint8_t> slot(SlotBytesFor(5000, version));
    std::copy(payload.begin(), payload.end(), slot.begin() + header);
    SlotHeader h = HeaderOf(9, 5000, key, PayloadChecksum(payload), 42);
    h.parent = KeyOf(seed, 7);
    h.created_s = 1'700'000'000 + static_cast<int64_t>(seed % 1000);
    h.expires_s = h.created_s + 60;
    h.origin = ChunkOrigin{KeyOf(seed, 8), KeyOf(seed, 9)};
    EncodeSlotHeader(h, slot.data(), version);
    uint32_t payload_at = 0;
    ASSERT_TRUE(VerifySlot(h, slot, &payload_at).ok());
    EXPECT_EQ(payload_at, header);

    // What the slot says of itself (format 2 carries the parent and the times).
    absl::StatusOr<DecodedSlot> d = DecodeSlotHeader(slot);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->version, version);
    EXPECT_EQ(d->header.key, key);
    EXPECT_EQ(d->header.sequence, 42u);
    EXPECT_TRUE(VerifyPayload(*d, slot).ok());
    if (version == 2) {
      EXPECT_EQ(d->header.parent, h.parent);
      EXPECT_EQ(d->header.created_s, h.created_s);
      EXPECT_EQ(d->header.expires_s, h.expires_s);
      EXPECT_EQ(d->header.origin, h.origin);
      // An origin without a parent, and none at all, read back as written.
      SlotHeader bare = h;
      bare.origin = ChunkOrigin{KeyOf(seed, 10), std::nullopt};
      std::vector<uint8_t> other(slot.size());
      EncodeSlotHeader(bare, other.data(), version);
      EXPECT_EQ(DecodeSlotHeader(other)->header.origin, bare.origin);
      bare.origin.reset();
      EncodeSlotHeader(bare, other.data(), version);
      EXPECT_FALSE(DecodeSlotHeader(other)->header.origin.has_value());
    } else {
      EXPECT_FALSE(d->header.parent.has_value());
      EXPECT_FALSE(d->header.origin.has_value());
    }

    struct Case {
      const char* what;
      SlotHeader expect;
    } cases[] = {{"another chunk", HeaderOf(9, 5000, KeyOf(seed, 2), h.payload_checksum, 42)},
                 {"does not match the index", HeaderOf(8, 5000, key, h.payload_checksum, 42)},
                 {"does not match the index", HeaderOf(9, 5000, key, h.payload_checksum, 41)},
                 {"does not match the index", HeaderOf(9, 4999, key, h.payload_checksum, 42)},
                 {"payload checksum", HeaderOf(9, 5000, key, h.payload_checksum + 1, 42)}};
    for (const Case& c : cases) {
      absl::Status st = VerifySlot(c.expect, slot);
      EXPECT_TRUE(absl::IsDataLoss(st)) << c.what;
      EXPECT_NE(st.message().find(c.what), std::string::npos) << st;
    }
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 200; ++i) {  // any single flipped bit in header or payload is caught
      std::vector<uint8_t> bad = slot;
      const size_t at = rng() % (header + 5000);
      bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
      EXPECT_TRUE(absl::IsDataLoss(VerifySlot(h, bad))) << "flip at byte " << at;
      absl::StatusOr<DecodedSlot> bad_d = DecodeSlotHeader(bad);
      EXPECT_TRUE(!bad_d.ok() || !VerifyPayload(*bad_d, bad).ok() || bad_d->header.key != key ||
                  bad_d->header.sequence != 42 || bad_d->header.namespace_id != 9 ||
                  bad_d->header.payload_bytes != 5000)
          << "a flip at byte " << at << " decodes as the same valid slot";
    }
    EXPECT_TRUE(absl::IsDataLoss(VerifySlot(h, std::span(slot).first(100))));  // short read
  }
}

TEST(SlotReservationTest, RoundTripsAndRejectsDamage) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  for (const bool names_next : {false, true}) {
    SCOPED_TRACE(names_next ? "a next first slot named" : "no next first slot");
    SlotReservation r;
    r.min_sequence = rng();
    for (int i = 0; i < 37; ++i) r.slots.push_back(rng() % 100000);
    if (names_next) {
      r.sequence_bound = r.min_sequence + rng() % 1000;
      r.next_first_slot = rng() % 100000;
    }
    const std::string bytes = EncodeSlotReservation(r);
    absl::StatusOr<SlotReservation> back = DecodeSlotReservation(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->min_sequence, r.min_sequence);
    EXPECT_EQ(back->slots, r.slots);
    EXPECT_EQ(back->sequence_bound, r.sequence_bound);
    EXPECT_EQ(back->next_first_slot, r.next_first_slot);
    for (int i = 0; i < 50; ++i) {
      std::string bad = bytes;
      bad[rng() % bad.size()] ^= static_cast<char>(1u << (rng() % 8));
      EXPECT_TRUE(absl::IsDataLoss(DecodeSlotReservation(bad).status()));
    }
    EXPECT_TRUE(
        absl::IsDataLoss(DecodeSlotReservation(bytes.substr(0, bytes.size() - 8)).status()));
  }
  EXPECT_TRUE(DecodeSlotReservation(EncodeSlotReservation({})).ok());
}

// Each reservation has one encoding: one that names no next slot and no sequence bound is
// written in the first version's form, so the later form carrying neither, checksum and
// all, is not a record this version wrote.
TEST(SlotReservationTest, TheLaterFormCarryingNothingOfItsOwnIsRefused) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  SlotReservation r;
  r.min_sequence = rng() | 1;
  r.slots = {rng() % 1000, rng() % 1000};
  r.sequence_bound = (rng() | (uint64_t{1} << 63)) & ~uint64_t{0xff};  // unlike any other field
  std::string bytes = EncodeSlotReservation(r);
  SlotReservation plain;
  plain.min_sequence = r.min_sequence;
  plain.slots = r.slots;
  const std::string first_form = EncodeSlotReservation(plain);
  ASSERT_NE(bytes.size(), first_form.size()) << "a sequence bound is written in the later form";
  // The bound set to 0 where it lies, and the checksum (the last 8 bytes) made whole again.
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&r.sequence_bound), 8));
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 8, 8, '\0');
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
  bytes.replace(bytes.size() - 8, 8, reinterpret_cast<const char*>(&sum), 8);
  const absl::StatusOr<SlotReservation> back = DecodeSlotReservation(bytes);
  ASSERT_TRUE(absl::IsDataLoss(back.status())) << "seed " << seed << ": " << back.status();
  EXPECT_NE(back.status().message().find("form of R1"), std::string::npos) << back.status();
  // The same record in the first form reads back.
  EXPECT_TRUE(DecodeSlotReservation(first_form).ok());
}

TEST(IndexRecordTest, RoundTripsAndRejectsForeignBytes) {
  const uint64_t seed = testing::FreshSeed();
  IndexRecord r;
  r.namespace_id = 3;
  r.payload_bytes = 227840;
  r.slab = 7;
  r.slot = 1000;
  r.checksum = seed;
  r.sequence = seed ^ 0xFFFF;
  r.parent = KeyOf(seed, 5);
  r.created_s = 1'700'000'000;
  r.last_access_s = 1'700'000'100;
  r.pin_until_s = 1'800'000'000;
  r.expires_s = 1'750'000'000;
  r.slot_class = 20480;
  absl::StatusOr<IndexRecord> back = DecodeIndexRecord(EncodeIndexRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(EncodeIndexRecord(*back), EncodeIndexRecord(r));
  EXPECT_EQ(back->parent, r.parent);
  EXPECT_EQ(back->slot_class, 20480u);
  EXPECT_FALSE(back->origin.has_value());
  r.origin = ChunkOrigin{KeyOf(seed, 6), KeyOf(seed, 7)};
  EXPECT_EQ(DecodeIndexRecord(EncodeIndexRecord(r))->origin, r.origin);
  r.origin->parent.reset();
  EXPECT_EQ(DecodeIndexRecord(EncodeIndexRecord(r))->origin, r.origin);
  // A version-2 record (before size classes) still reads, as the folder's first class:
  // version 2 is the same bytes less the class's 4 at the end.
  std::string v2 = EncodeIndexRecord(r);
  v2.resize(v2.size() - 4);
  v2[0] = 2;
  absl::StatusOr<IndexRecord> before_classes = DecodeIndexRecord(v2);
  ASSERT_TRUE(before_classes.ok()) << before_classes.status();
  EXPECT_EQ(before_classes->slot_class, 0u);
  EXPECT_EQ(before_classes->origin, r.origin);
  // A version-1 record (before origins were kept) still reads: version 1 is version 2
  // less the origin's 33 bytes at the end.
  std::string v1 = v2;
  v1.resize(v1.size() - 33);
  v1[0] = 1;
  absl::StatusOr<IndexRecord> old = DecodeIndexRecord(v1);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->expires_s, r.expires_s);
  EXPECT_FALSE(old->origin.has_value());
  r.origin.reset();
  r.parent.reset();
  EXPECT_FALSE(DecodeIndexRecord(EncodeIndexRecord(r))->parent.has_value());
  EXPECT_TRUE(absl::IsDataLoss(DecodeIndexRecord("short").status()));
  std::string wrong_version = EncodeIndexRecord(r);
  wrong_version[0] = 9;
  EXPECT_TRUE(absl::IsDataLoss(DecodeIndexRecord(wrong_version).status()));
}

TEST(EvictionOrderTest, LeavesFirstThenAncestorsInLruOrder) {
  const uint64_t seed = testing::FreshSeed();
  EvictionOrder order;
  // Two prefixes: a0 → a1 → a2 and b0 → b1; b is older.
  const ChunkKey a0 = KeyOf(seed, 1), a1 = KeyOf(seed, 2), a2 = KeyOf(seed, 3);
  const ChunkKey b0 = KeyOf(seed, 4), b1 = KeyOf(seed, 5);
  order.Add(b0, {}, 1, 0, 0);
  order.Add(b1, b0, 2, 0, 0);
  order.Add(a0, {}, 3, 0, 0);
  order.Add(a1, a0, 4, 0, 0);
  order.Add(a2, a1, 5, 0, 0);
  std::vector<ChunkKey> evicted;
  while (auto v = order.PickVictim(0)) {
    evicted.push_back(*v);
    order.Remove(*v);
  }
  EXPECT_EQ(evicted, (std::vector<ChunkKey>{b1, b0, a2, a1, a0}));
}

TEST(EvictionOrderTest, ChildArrivingBeforeParentStillProtectsIt) {
  const uint64_t seed = testing::FreshSeed();
  EvictionOrder order;
  const ChunkKey p = KeyOf(seed, 1), c = KeyOf(seed, 2);
  order.Add(c, p, 5, 0, 0);  // e.g. promoted before its parent
  order.Add(p, {}, 1, 0, 0);
  EXPECT_EQ(order.PickVictim(0), c);
  order.Touch(c, 100);
  EXPECT_EQ(order.PickVictim(0), c);  // p still has a child here
}

TEST(EvictionOrderTest, ExpiredFirstPinnedNever) {
  const uint64_t seed = testing::FreshSeed();
  EvictionOrder order;
  const ChunkKey old = KeyOf(seed, 1), ttl = KeyOf(seed, 2), pinned = KeyOf(seed, 3);
  order.Add(old, {}, 1, 0, 0);
  order.Add(ttl, {}, 9, 0, /*expires_s=*/100);
  order.Add(pinned, {}, 0, /*pin_until_s=*/500, 0);
  EXPECT_EQ(order.PickVictim(50), old);   // TTL not reached: LRU, skipping the pinned one
  EXPECT_EQ(order.PickVictim(150), ttl);  // expired goes first
  order.Remove(old);
  order.Remove(ttl);
  EXPECT_FALSE(order.PickVictim(499).has_value());
  EXPECT_EQ(order.PickVictim(501), pinned);
}

TEST(EvictionOrderTest, OrphansGoBeforeReachableLeavesAndComeBackWithTheirParent) {
  const uint64_t seed = testing::FreshSeed();
  EvictionOrder order;
  const ChunkKey a = KeyOf(seed, 1), b = KeyOf(seed, 2), c = KeyOf(seed, 3), old = KeyOf(seed, 4);
  order.Add(old, {}, 1, 0, 0);  // the least recently used leaf
  order.Add(b, a, 5, 0, 0);     // a itself is not in this tier
  order.Add(c, b, 6, 0, 0);
  EXPECT_EQ(order.PickVictim(0), old);
  order.MarkOrphansOf(a);  // a left the store: b is unreachable
  EXPECT_TRUE(order.IsOrphan(b));
  EXPECT_FALSE(order.IsOrphan(c));
  EXPECT_EQ(order.PickVictim(0), b);  // before the older, reachable leaf
  order.Add(a, {}, 7, 0, 0);          // a is back: b is reachable again
  EXPECT_FALSE(order.IsOrphan(b));
  EXPECT_EQ(order.PickVictim(0), old);
  order.MarkOrphansOf(a);
  order.SetPin(b, 100);
  EXPECT_EQ(order.PickVictim(50), old);  // a pinned orphan stays
}

}  // namespace
}  // namespace kvc::storage

namespace kvc::storage {
namespace {

TEST(DiskSpaceTest, TheSsdTierIsSizedToWhatFitsAndNeverBelowItsSlabs) {
  constexpr uint64_t kGiB = 1ull << 30;
  const DiskSpace d{.total_bytes = 100 * kGiB, .free_bytes = 20 * kGiB, .slab_bytes = 8 * kGiB};
  EXPECT_EQ(ReservedBytes(d), 5 * kGiB);                        // 5 % of the file system
  EXPECT_EQ(FitSsdBytes(10 * kGiB, d), 10 * kGiB);              // fits: unchanged
  EXPECT_EQ(FitSsdBytes(1000 * kGiB, d), (8 + 20 - 5) * kGiB);  // slabs + free - reserve
  // A fuller disk than the slabs already hold: the slabs stay, nothing more is laid out.
  const DiskSpace full{.total_bytes = 100 * kGiB, .free_bytes = kGiB, .slab_bytes = 8 * kGiB};
  EXPECT_EQ(FitSsdBytes(1000 * kGiB, full), 8 * kGiB);
  // A small file system still keeps 1 GiB.
  const DiskSpace small{.total_bytes = 4 * kGiB, .free_bytes = 3 * kGiB, .slab_bytes = 0};
  EXPECT_EQ(FitSsdBytes(1000 * kGiB, small), 2 * kGiB);
}

TEST(DiskSpaceTest, MeasuresTheFileSystemAndTheSlabsAllocated) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/slabs");
  {
    std::ofstream f(dir.path() + "/slabs/slab-000000.dat", std::ios::binary);
    const std::string block(1 << 20, 'x');
    f << block;
  }
  // A size class's slabs count too (slabs/cBYTES/).
  std::filesystem::create_directories(dir.path() + "/slabs/c8192");
  {
    std::ofstream f(dir.path() + "/slabs/c8192/slab-000000.dat", std::ios::binary);
    const std::string block(1 << 20, 'y');
    f << block;
  }
  absl::StatusOr<DiskSpace> d = MeasureDiskSpace(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->total_bytes, d->free_bytes);
  EXPECT_GE(d->slab_bytes, 2u << 20);
  // A folder not made yet is measured on its parent's file system.
  absl::StatusOr<DiskSpace> fresh = MeasureDiskSpace(dir.path() + "/not/yet");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->total_bytes, d->total_bytes);
  EXPECT_EQ(fresh->slab_bytes, 0u);
}

// RamTier::CheckConsistency (what ChunkStore::CheckConsistency asks of the RAM tier)
// passes through publish, lease, remove-under-lease and release, and names a slot taken
// for a write that never published nor returned it.
TEST(RamTierTest, ConsistencyCheckFollowsLeasesAndFindsALostSlot) {
  constexpr uint64_t kSlot = 8192;
  const std::vector<uint64_t> pools = {4 * kSlot, 2 * kSlot};
  absl::StatusOr<std::unique_ptr<RamTier>> made = RamTier::Create(kSlot, pools);
  ASSERT_TRUE(made.ok()) << made.status();
  RamTier& t = **made;
  ASSERT_TRUE(t.SetPool(7, 1).ok());
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  const uint64_t seed = testing::FreshSeed();
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 3; ++i) {
    const NamespaceId ns = i == 2 ? 7 : 1;
    const std::optional<uint32_t> slot = t.TakeFreeSlot(t.PoolOf(ns), 100);
    ASSERT_TRUE(slot.has_value());
    RamEntry e;
    e.ns = ns;
    e.pool = t.PoolOf(ns);
    e.slot = *slot;
    e.len = 100;
    keys.push_back(testing::KeyOf(seed, i));
    t.Publish(keys.back(), e, static_cast<int64_t>(i));
  }
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  const RamEntry leased = *t.Find(keys[0]);
  t.Ref(leased.pool, leased.slot);
  t.Remove(keys[0]);  // freed once the lease ends
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  t.Unref(leased.pool, leased.slot);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  const std::optional<uint32_t> lost = t.TakeFreeSlot(1, 100);  // never published nor returned
  ASSERT_TRUE(lost.has_value());
  const absl::Status st = t.CheckConsistency();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("pool 1 run at page " + std::to_string(*lost)), std::string::npos)
      << st;
  t.ReturnSlot(1, *lost);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
}

// A chunk takes its payload in whole pages, whatever the largest chunk is: a pool sized for
// two of the largest holds many small ones; runs are taken best-fit and merge when freed.
TEST(RamTierTest, AChunkTakesItsOwnPagesAndFreedRunsMerge) {
  constexpr uint64_t kLargest = 16 * 4096 - 100;  // 16 pages
  const std::vector<uint64_t> pools = {2 * 16 * 4096};
  absl::StatusOr<std::unique_ptr<RamTier>> made = RamTier::Create(kLargest, pools);
  ASSERT_TRUE(made.ok()) << made.status();
  RamTier& t = **made;
  EXPECT_EQ(t.capacity_slots(), 2u);  // of the largest
  EXPECT_EQ(t.capacity_bytes(), 32u * 4096);
  const uint64_t seed = testing::FreshSeed();
  // 32 one-page chunks fill the pool; a 33rd does not fit.
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 32; ++i) {
    const std::optional<uint32_t> slot = t.TakeFreeSlot(0, 1 + i * 100);
    ASSERT_TRUE(slot.has_value()) << i;
    EXPECT_EQ(*slot, i);  // the lowest fitting run
    RamEntry e;
    e.ns = 1;
    e.slot = *slot;
    e.len = static_cast<uint32_t>(1 + i * 100);
    keys.push_back(testing::KeyOf(seed, i));
    t.Publish(keys.back(), e, static_cast<int64_t>(i));
  }
  EXPECT_FALSE(t.TakeFreeSlot(0, 1).has_value());
  EXPECT_EQ(t.BytesOf(1), 32u * 4096);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  // Free pages 3, 5, 6 and 4 (in that order): one run of four pages, where a 4-page chunk
  // fits; then a hole of 1 page at 10 and of 2 at 20–21: a 1-page chunk goes to the 1-page
  // hole (best fit), not into the longer one.
  for (uint64_t i : {3, 5, 6, 4}) t.Remove(keys[i]);
  EXPECT_EQ(t.FreeBytes(0), 4u * 4096);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  EXPECT_FALSE(t.TakeFreeSlot(0, 4 * 4096 + 1).has_value());
  const std::optional<uint32_t> four = t.TakeFreeSlot(0, 4 * 4096);
  ASSERT_EQ(four, 3u);
  t.ReturnSlot(0, *four);
  for (uint64_t i : {20, 21, 10}) t.Remove(keys[i]);
  EXPECT_EQ(t.TakeFreeSlot(0, 1), 10u);
  EXPECT_EQ(t.TakeFreeSlot(0, 2 * 4096), 20u);
  EXPECT_EQ(t.TakeFreeSlot(0, 4000), 3u);  // what is left: the four-page run
  for (uint32_t first : {10u, 20u, 3u}) t.ReturnSlot(0, first);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  // A lease keeps a removed chunk's run taken until it ends.
  const RamEntry leased = *t.Find(keys[11]);
  t.Ref(0, leased.slot);
  t.Remove(keys[11]);
  EXPECT_EQ(t.FreeBytes(0), 7u * 4096);
  t.Unref(0, leased.slot);
  EXPECT_EQ(t.FreeBytes(0), 8u * 4096);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
}

// Chunks of random sizes taken, published, leased and removed in random order (fresh seed):
// after every step each page is in exactly one run and no free runs are left unmerged;
// when everything is gone the pool is one free run again.
TEST(RamTierTest, ARandomMixOfSizesKeepsEveryPageInOneRun) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  constexpr uint64_t kLargest = 24 * 4096;
  const std::vector<uint64_t> pools = {96 * 4096};
  absl::StatusOr<std::unique_ptr<RamTier>> made = RamTier::Create(kLargest, pools);
  ASSERT_TRUE(made.ok()) << made.status();
  RamTier& t = **made;
  std::vector<ChunkKey> held;
  std::vector<std::pair<RamPoolId, uint32_t>> leases;
  for (uint64_t step = 0; step < 3000; ++step) {
    const uint64_t op = rng() % 10;
    if (op < 5) {
      const uint64_t len = 1 + rng() % kLargest;
      const std::optional<uint32_t> slot = t.TakeFreeSlot(0, len);
      if (!slot) continue;
      if (rng() % 8 == 0) {
        t.ReturnSlot(0, *slot);
        continue;
      }
      RamEntry e;
      e.ns = 1;
      e.slot = *slot;
      e.len = static_cast<uint32_t>(len);
      held.push_back(testing::KeyOf(seed, step));
      t.Publish(held.back(), e, static_cast<int64_t>(step));
    } else if (op < 8 && !held.empty()) {
      const size_t k = rng() % held.size();
      t.Remove(held[k]);
      held.erase(held.begin() + static_cast<ptrdiff_t>(k));
    } else if (op == 8 && !held.empty()) {
      const RamEntry* e = t.Find(held[rng() % held.size()]);
      t.Ref(0, e->slot);
      leases.emplace_back(0, e->slot);
    } else if (!leases.empty()) {
      t.Unref(leases.back().first, leases.back().second);
      leases.pop_back();
    }
    ASSERT_EQ(t.CheckConsistency(), absl::OkStatus()) << "step " << step << ", seed " << seed;
  }
  for (const auto& [pool, slot] : leases) t.Unref(pool, slot);
  for (const ChunkKey& k : held) t.Remove(k);
  EXPECT_EQ(t.CheckConsistency(), absl::OkStatus());
  EXPECT_EQ(t.FreeBytes(0), 96u * 4096);
  EXPECT_TRUE(t.TakeFreeSlot(0, 96 * 4096 - 1).has_value()) << "seed " << seed;
}

// Every build of the payload checksum this CPU runs (xxh3.h) gives libxxhash's XXH3-64,
// one-shot and streamed in random pieces, at every size class XXH3 treats differently.
TEST(Xxh3Test, EveryVectorBuildGivesLibxxhashsDigest) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> data(240'000);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> sizes = {0,   1,   3,   4,    8,    9,     16,     17,         128,
                               129, 240, 241, 1024, 1025, 16384, 227840, data.size()};
  for (int i = 0; i < 20; ++i) sizes.push_back(rng() % data.size());
  ASSERT_FALSE(SupportedXxh3Impls().empty());
  // The widest build, unless KVCACHE_XXH3 names another this CPU runs (xxh3.h).
  std::string_view chosen = SupportedXxh3Impls().back()->name;
  if (const char* env = std::getenv("KVCACHE_XXH3"); env != nullptr)
    for (const Xxh3Impl* impl : SupportedXxh3Impls())
      if (impl->name == env) chosen = impl->name;
  EXPECT_EQ(Xxh3().name, chosen);
  for (const Xxh3Impl* impl : SupportedXxh3Impls()) {
    std::printf("xxh3 build %.*s%s\n", static_cast<int>(impl->name.size()), impl->name.data(),
                impl == &Xxh3() ? " (chosen)" : "");
    for (size_t n : sizes) {
      const size_t at = rng() % (data.size() - n + 1);  // unaligned starts too
      const uint64_t want = XXH3_64bits(data.data() + at, n);
      EXPECT_EQ(impl->hash(data.data() + at, n), want) << impl->name << " " << n;
      alignas(64) unsigned char state[Xxh3Stream::kStateBytes];
      impl->reset(state);
      for (size_t done = 0; done < n;) {
        const size_t piece = std::min<size_t>(n - done, 1 + rng() % 40'000);
        impl->update(state, data.data() + at + done, piece);
        done += piece;
      }
      EXPECT_EQ(impl->digest(state), want) << impl->name << " streamed " << n;
    }
  }
  Xxh3Stream stream;
  stream.Update(data.data(), 100);
  stream.Update(data.data() + 100, data.size() - 100);
  EXPECT_EQ(stream.Digest(), XXH3_64bits(data.data(), data.size()));
  EXPECT_EQ(PayloadChecksum(data), XXH3_64bits(data.data(), data.size()));
}

}  // namespace
}  // namespace kvc::storage
