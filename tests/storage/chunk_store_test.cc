// The chunk store on real files, real RocksDB and real io_uring (or the POSIX fallback).
#include "storage/chunk_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "storage/slot_format.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::ConsistentOnceQuiet;
using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;
using ::kvc::testing::TempDir;

constexpr uint64_t kChunk = 20000;  // small chunks keep the tests fast; slot = 20480
constexpr NamespaceId kNs = 7;

struct Clock {
  std::atomic<int64_t> now{1'700'000'000};
  std::function<int64_t()> fn() {
    return [this] { return now.load(); };
  }
};

StoreOptions Options(const std::string& dir, uint64_t ram_chunks, uint64_t ssd_chunks,
                     IoBackend backend = IoBackend::kAuto) {
  StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kChunk;
  o.ram_bytes = ram_chunks * 20480;
  o.ssd_bytes = ssd_chunks * SlotBytesFor(kChunk);
  o.slab_bytes = 16 * SlotBytesFor(kChunk);
  o.io_backend = backend;
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;
}

std::unique_ptr<ChunkStore> OpenOrDie(const StoreOptions& o, const StoreSeams& seams = {}) {
  absl::StatusOr<std::unique_ptr<ChunkStore>> s = ChunkStore::Open(o, seams);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*s)->RegisterNamespace(kNs, kChunk).ok());
  return *std::move(s);
}

absl::Status PutChunk(ChunkStore& s, const ChunkKey& key, std::optional<ChunkKey> parent = {},
                      Durability d = Durability::kDurable, int64_t ttl_s = 0) {
  const std::vector<uint8_t> p = PayloadOf(key, kChunk);
  absl::StatusOr<PutResult> r = s.Put({kNs, key, parent, p}, {d, ttl_s});
  return r.status();
}

// Get must return exactly the payload derived from the key.
void ExpectChunk(ChunkStore& s, const ChunkKey& key) {
  std::vector<uint8_t> out(kChunk);
  absl::Status st = s.Get(kNs, key, out);
  ASSERT_TRUE(st.ok()) << key.Hex() << ": " << st;
  ASSERT_EQ(out, PayloadOf(key, kChunk)) << key.Hex();
}

// Flips bit `mask` of payload byte `at` of the second slot, in the slab file itself.
void FlipPayloadBitOfSecondSlot(const std::string& dir, uint64_t at, uint8_t mask) {
  const std::string slab = dir + "/slabs/slab-000000.dat";
  const int fd = open(slab.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << slab;
  uint8_t byte = 0;
  const off_t offset = static_cast<off_t>(SlotBytesFor(kChunk) + kSlotHeaderBytes + at);
  ASSERT_EQ(pread(fd, &byte, 1, offset), 1);
  byte ^= mask;
  ASSERT_EQ(pwrite(fd, &byte, 1, offset), 1);
  close(fd);
}

bool Has(ChunkStore& s, const ChunkKey& key) { return s.Contains(kNs, key) != Tier::kNone; }

class ChunkStoreTest : public ::testing::TestWithParam<IoBackend> {};

TEST_P(ChunkStoreTest, RoundTripsOnEveryTier) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  struct {
    uint64_t ram, ssd;
    Tier expect;
  } layouts[] = {{8, 0, Tier::kRam}, {0, 32, Tier::kSsd}, {8, 32, Tier::kRam}};
  int n = 0;
  for (const auto& l : layouts) {
    auto store = OpenOrDie(Options(dir.File("t" + std::to_string(n++)), l.ram, l.ssd, GetParam()));
    ASSERT_NE(store, nullptr);
    for (uint64_t i = 0; i < 5; ++i) {
      const ChunkKey k = KeyOf(seed, i);
      ASSERT_TRUE(PutChunk(*store, k, {}, l.ssd ? Durability::kDurable : Durability::kMemory).ok());
      EXPECT_EQ(store->Contains(kNs, k), l.expect);
      ExpectChunk(*store, k);
    }
    EXPECT_EQ(store->Contains(kNs, KeyOf(seed, 99)), Tier::kNone);
    std::vector<uint8_t> out(kChunk);
    EXPECT_TRUE(absl::IsNotFound(store->Get(kNs, KeyOf(seed, 99), out)));
  }
}

TEST_P(ChunkStoreTest, ChunksSurviveReopen) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  const StoreOptions o = Options(dir.path(), 4, 64, GetParam());
  {
    auto store = OpenOrDie(o);
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok());
    // Memory durability: on SSD after the write-behind drains at close.
    for (uint64_t i = 10; i < 20; ++i) {
      ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i), {}, Durability::kMemory).ok());
    }
    ASSERT_TRUE(store->Pin(kNs, KeyOf(seed, 3), 2'000'000'000).ok());
  }
  auto store = OpenOrDie(o);
  for (uint64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(store->Contains(kNs, KeyOf(seed, i)), Tier::kSsd) << i;
    ExpectChunk(*store, KeyOf(seed, i));
  }
  EXPECT_EQ(store->Stats().ssd_chunks, 20u);
  // The pin survived too: with the SSD full of unpinned chunks, 3 is never the victim.
  EXPECT_TRUE(store->Pin(kNs, KeyOf(seed, 3), 0).ok());
}

TEST_P(ChunkStoreTest, ConcurrentWritersAndReadersSeeWholeChunks) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 16, 256, GetParam()));
  constexpr int kWriters = 3, kReaders = 3, kPerWriter = 40;
  std::atomic<int> errors{0}, verified{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kPerWriter; ++i) {
        const ChunkKey k = KeyOf(seed, w * 1000 + i);
        const auto d = i % 2 ? Durability::kMemory : Durability::kDurable;
        if (!PutChunk(*store, k, i ? std::optional(KeyOf(seed, w * 1000 + i - 1)) : std::nullopt, d)
                 .ok()) {
          ++errors;
        }
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(seed + r);
      std::vector<uint8_t> out(kChunk);
      while (!done) {
        const ChunkKey k = KeyOf(seed, (rng() % kWriters) * 1000 + rng() % kPerWriter);
        absl::Status st = store->Get(kNs, k, out);
        if (st.ok()) {
          if (out != PayloadOf(k, kChunk)) ++errors;
          ++verified;
        } else if (!absl::IsNotFound(st)) {
          ++errors;
        }
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  done = true;
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(store->Flush().ok());
  for (int w = 0; w < kWriters; ++w) {
    for (int i = 0; i < kPerWriter; ++i) ExpectChunk(*store, KeyOf(seed, w * 1000 + i));
  }
  EXPECT_EQ(ConsistentOnceQuiet(*store), absl::OkStatus());
  std::printf("concurrent: %d verified reads during writes\n", verified.load());
}

INSTANTIATE_TEST_SUITE_P(Backends, ChunkStoreTest,
                         ::testing::Values(IoBackend::kAuto, IoBackend::kPosix),
                         [](const auto& param_info) {
                           return std::string(param_info.param == IoBackend::kPosix ? "Posix"
                                                                                    : "Auto");
                         });

TEST(ChunkStoreBasicsTest, ReportsWhichIoBackendItUses) {
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 0, 8));
  const StoreStats st = store->Stats();
  std::printf(
      "io backend: %s%s%s\n", st.io_backend,
      st.io_fallback_reason.empty() ? "" : ", fallback because: ", st.io_fallback_reason.c_str());
  EXPECT_TRUE(std::string(st.io_backend) == "io_uring" || !st.io_fallback_reason.empty());
}

TEST(ChunkStoreBasicsTest, BadInputIsRejectedAndChangesNothing) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 4, 16));
  const ChunkKey k = KeyOf(seed, 1);
  std::vector<uint8_t> small(kChunk - 1, 1);
  absl::StatusOr<PutResult> r = store->Put({kNs, k, {}, small}, {});
  ASSERT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("chunk payload is 19999 bytes, namespace 7 expects 20000"),
            std::string::npos)
      << r.status();
  r = store->Put({99, k, {}, PayloadOf(k, kChunk)}, {});
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_NE(r.status().message().find("namespace 99 is not registered"), std::string::npos);
  EXPECT_FALSE(Has(*store, k));
  EXPECT_TRUE(absl::IsAlreadyExists(store->RegisterNamespace(kNs, 4096)));
  EXPECT_TRUE(absl::IsInvalidArgument(store->RegisterNamespace(8, kChunk + 1)));
  EXPECT_TRUE(store->RegisterNamespace(kNs, kChunk).ok());  // idempotent
  std::vector<uint8_t> out(100);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Get(kNs, k, out)));
  EXPECT_TRUE(absl::IsNotFound(store->Erase(kNs, k)));
  EXPECT_TRUE(absl::IsNotFound(store->Pin(kNs, k, 5)));
  store.reset();
  // Reopened with a larger chunk size, the folder keeps its first class's 20,480-byte
  // slots (larger chunks get a class of their own).
  StoreOptions bigger = Options(dir.path(), 4, 16);
  bigger.max_chunk_bytes = 100000;
  absl::StatusOr<std::unique_ptr<ChunkStore>> reopened = ChunkStore::Open(bigger);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->Stats().slot_bytes, 20480u);
}

TEST(ChunkStoreBasicsTest, NamespacesAreIsolated) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 4, 16));
  ASSERT_TRUE(store->RegisterNamespace(8, kChunk).ok());
  const ChunkKey k = KeyOf(seed, 1);
  ASSERT_TRUE(PutChunk(*store, k).ok());
  EXPECT_EQ(store->Contains(8, k), Tier::kNone);
  std::vector<uint8_t> out(kChunk);
  EXPECT_TRUE(absl::IsNotFound(store->Get(8, k, out)));
  EXPECT_TRUE(absl::IsNotFound(store->Erase(8, k)));
  EXPECT_TRUE(Has(*store, k));
}

TEST(ChunkStoreBasicsTest, SsdEvictsLeavesBeforeAncestorsLeastRecentlyUsedFirst) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 0, 4));
  const ChunkKey a = KeyOf(seed, 1), b = KeyOf(seed, 2), c = KeyOf(seed, 3), d = KeyOf(seed, 4);
  const ChunkKey e = KeyOf(seed, 5), f = KeyOf(seed, 6);
  ASSERT_TRUE(PutChunk(*store, a).ok());
  ASSERT_TRUE(PutChunk(*store, b, a).ok());  // a → b
  ASSERT_TRUE(PutChunk(*store, c).ok());
  ASSERT_TRUE(PutChunk(*store, d, c).ok());  // c → d
  ExpectChunk(*store, a);                    // a is the most recently used, but not a leaf
  ASSERT_TRUE(PutChunk(*store, e).ok());     // leaves: b, d → b (older) goes
  EXPECT_FALSE(Has(*store, b));
  EXPECT_TRUE(Has(*store, a) && Has(*store, c) && Has(*store, d));
  ASSERT_TRUE(PutChunk(*store, f).ok());  // leaves: a (used at 5), d (4), e (6) → d
  EXPECT_FALSE(Has(*store, d));
  EXPECT_TRUE(Has(*store, a) && Has(*store, c) && Has(*store, e) && Has(*store, f));
  EXPECT_EQ(store->Stats().ssd_evictions, 2u);
}

TEST(ChunkStoreBasicsTest, ExpiredTtlGoesFirstAndPinsHoldUntilLeaseEnds) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Clock clock;
  StoreOptions o = Options(dir.path(), 0, 3);
  o.max_pinned_share = 1;  // this test fills the tier with pins
  auto store = OpenOrDie(o, {.now_s = clock.fn()});
  const ChunkKey x = KeyOf(seed, 1), y = KeyOf(seed, 2), z = KeyOf(seed, 3), w = KeyOf(seed, 4);
  ASSERT_TRUE(PutChunk(*store, y).ok());
  ASSERT_TRUE(PutChunk(*store, x, {}, Durability::kDurable, /*ttl_s=*/10).ok());
  ASSERT_TRUE(PutChunk(*store, z).ok());
  clock.now += 20;  // x expired; y is the least recently used
  ASSERT_TRUE(PutChunk(*store, w).ok());
  EXPECT_FALSE(Has(*store, x));
  EXPECT_TRUE(Has(*store, y));

  // Pin everything: a new chunk cannot get in until a lease ends.
  for (const ChunkKey& k : {y, z, w}) ASSERT_TRUE(store->Pin(kNs, k, clock.now + 100).ok());
  absl::Status full = PutChunk(*store, x);
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_FALSE(Has(*store, x));
  for (const ChunkKey& k : {y, z, w}) EXPECT_TRUE(Has(*store, k));
  clock.now += 101;
  ASSERT_TRUE(PutChunk(*store, x).ok());
  EXPECT_FALSE(Has(*store, y));  // lease over: the LRU leaf goes
}

// Whoever pins, pins take at most max_pinned_share of a tier: past it a Pin is refused
// naming the tier and the flag, and the tier keeps room for everyone's new chunks.
TEST(ChunkStoreBasicsTest, PinsTakeAtMostTheirShareOfATier) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  StoreOptions o = Options(dir.path(), 0, 8);
  o.max_pinned_share = 0.5;
  auto store = OpenOrDie(o);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok());
  const std::vector<absl::Status> pinned =
      store->PinBatch(kNs,
                      std::vector<ChunkKey>{KeyOf(seed, 0), KeyOf(seed, 1), KeyOf(seed, 2),
                                            KeyOf(seed, 3), KeyOf(seed, 4), KeyOf(seed, 5)},
                      4'000'000'000);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(pinned[i].ok()) << i << ": " << pinned[i];
  for (size_t i = 4; i < 6; ++i) {
    EXPECT_TRUE(absl::IsResourceExhausted(pinned[i])) << i << ": " << pinned[i];
    EXPECT_NE(pinned[i].message().find("SSD"), std::string::npos) << pinned[i];
    EXPECT_NE(pinned[i].message().find("--max-pinned-share"), std::string::npos) << pinned[i];
  }
  // Pinning one already pinned again (a longer lease) is not a new pin.
  EXPECT_TRUE(store->Pin(kNs, KeyOf(seed, 2), 4'000'000'001).ok());
  // New chunks still get in: the unpinned half is evicted for them.
  for (uint64_t i = 100; i < 108; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok());
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(Has(*store, KeyOf(seed, i))) << i;
  // Unpinning gives the share back.
  ASSERT_TRUE(store->Pin(kNs, KeyOf(seed, 0), 0).ok());
  EXPECT_TRUE(store->Pin(kNs, KeyOf(seed, 107), 4'000'000'000).ok());
}

TEST(ChunkStoreBasicsTest, PinnedLeafProtectsItsAncestors) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  Clock clock;
  StoreOptions o = Options(dir.path(), 0, 2);
  auto store = OpenOrDie(o, {.now_s = clock.fn()});
  const ChunkKey p = KeyOf(seed, 1), q = KeyOf(seed, 2);
  ASSERT_TRUE(PutChunk(*store, p).ok());
  ASSERT_TRUE(PutChunk(*store, q, p).ok());
  ASSERT_TRUE(store->Pin(kNs, q, clock.now + 50).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(PutChunk(*store, KeyOf(seed, 3))));
  EXPECT_TRUE(Has(*store, p) && Has(*store, q));
}

TEST(ChunkStoreBasicsTest, RamLeaseKeepsSlotFromReuse) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 2, 0));
  const ChunkKey a = KeyOf(seed, 1);
  ASSERT_TRUE(PutChunk(*store, a, {}, Durability::kMemory).ok());
  absl::StatusOr<RamLease> lease = store->LeaseRam(kNs, a);
  ASSERT_TRUE(lease.ok()) << lease.status();
  // Push a out of RAM twice over; its slot must not be reused while leased.
  for (uint64_t i = 2; i < 6; ++i)
    ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i), {}, Durability::kMemory).ok());
  EXPECT_FALSE(Has(*store, a));
  const std::vector<uint8_t> want = PayloadOf(a, kChunk);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), lease->bytes().begin()));
  // A co-located process maps the arena's fd and reads the same bytes at the offset.
  const int fd = store->ram_arena_fd();
  std::vector<uint8_t> via_fd(kChunk);
  ASSERT_EQ(pread(fd, via_fd.data(), kChunk, static_cast<off_t>(lease->arena_offset())),
            static_cast<ssize_t>(kChunk));
  EXPECT_EQ(via_fd, want);
  *lease = RamLease();  // released: now the slot can be reused
  for (uint64_t i = 6; i < 9; ++i)
    ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i), {}, Durability::kMemory).ok());
  EXPECT_EQ(store->Stats().ram_chunks, 2u);
}

TEST(ChunkStoreBasicsTest, RamPressureDemotesAndSsdHitsPromote) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 2, 16));
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i), {}, Durability::kMemory).ok());
  }
  ASSERT_TRUE(store->Flush().ok());
  for (uint64_t i = 0; i < 6; ++i) EXPECT_TRUE(Has(*store, KeyOf(seed, i))) << i;  // nothing lost
  EXPECT_EQ(store->Contains(kNs, KeyOf(seed, 0)), Tier::kSsd);
  EXPECT_EQ(store->Contains(kNs, KeyOf(seed, 5)), Tier::kRam);
  ExpectChunk(*store, KeyOf(seed, 0));
  EXPECT_EQ(store->Contains(kNs, KeyOf(seed, 0)), Tier::kRam);  // promoted
  const StoreStats st = store->Stats();
  EXPECT_GE(st.promotions, 1u);
  EXPECT_EQ(st.ssd_chunks, 6u);
  EXPECT_EQ(st.ram_chunks, 2u);
}

// GetBatch says which tier served each chunk (what Fetch counts), in the same call.
TEST(ChunkStoreBasicsTest, GetBatchSaysWhichTierServedEachChunk) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  StoreOptions o = Options(dir.path(), 2, 16);
  o.promote_on_ssd_hit = false;  // chunk 0 stays on SSD after the read
  auto store = OpenOrDie(o);
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i), {}, Durability::kMemory).ok());
  }
  ASSERT_TRUE(store->Flush().ok());
  const std::vector<ChunkKey> keys = {KeyOf(seed, 5), KeyOf(seed, 0), KeyOf(seed, 99)};
  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(kChunk));
  const std::vector<std::span<uint8_t>> outs = {bufs[0], bufs[1], bufs[2]};
  std::vector<Tier> from;
  const std::vector<absl::Status> st = store->GetBatch(kNs, keys, outs, &from);
  ASSERT_TRUE(st[0].ok() && st[1].ok()) << st[0] << " " << st[1];
  EXPECT_TRUE(absl::IsNotFound(st[2]));
  EXPECT_EQ(from, (std::vector<Tier>{Tier::kRam, Tier::kSsd, Tier::kNone}));
  EXPECT_EQ(bufs[0], PayloadOf(keys[0], kChunk));
  EXPECT_EQ(bufs[1], PayloadOf(keys[1], kChunk));
}

TEST(ChunkStoreBasicsTest, EraseRemovesFromEveryTierAndSurvivesReopen) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  const StoreOptions o = Options(dir.path(), 4, 16);
  const ChunkKey k = KeyOf(seed, 1);
  {
    auto store = OpenOrDie(o);
    ASSERT_TRUE(PutChunk(*store, k).ok());
    ASSERT_TRUE(store->Erase(kNs, k).ok());
    EXPECT_FALSE(Has(*store, k));
  }
  auto store = OpenOrDie(o);
  EXPECT_FALSE(Has(*store, k));
  ASSERT_TRUE(PutChunk(*store, k).ok());  // and the slot is usable again
  ExpectChunk(*store, k);
}

// GetBatch with outs_have_read_room: a chunk on SSD is read straight into the caller's
// buffer (the slot's header lands in the room before the payload) and verified there; a
// buffer whose room is not aligned is served through a staging buffer; bad bytes on disk
// are a miss either way.
TEST_P(ChunkStoreTest, ChunksReadInPlaceFromSsdAreVerifiedThere) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  const StoreOptions o = Options(dir.path(), 0, 32, GetParam());
  constexpr size_t kN = 12;  // more than the queue depth (8)
  std::vector<ChunkKey> keys;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < kN; ++i) {
      keys.push_back(KeyOf(seed, i));
      ASSERT_TRUE(PutChunk(*store, keys.back()).ok());
    }
  }
  FlipPayloadBitOfSecondSlot(dir.path(), 77, 0x20);

  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const ChunkStore::ReadRoom room = store->ReadRoomFor(kChunk);
  EXPECT_EQ(room.alignment, kSlotAlignment);
  EXPECT_EQ(room.before, kSlotHeaderBytes);
  EXPECT_GE(room.bytes, room.before + kChunk);
  ChunkStore::ReadRoom with_slack = room;  // room for the unaligned case's shift
  with_slack.bytes += kSlotAlignment;
  for (const uint64_t shift : {uint64_t{0}, uint64_t{64}}) {  // aligned room; unaligned
    SCOPED_TRACE(::testing::Message() << "room shifted by " << shift);
    std::vector<ReadBuffer> buffers;
    std::vector<std::span<uint8_t>> outs;
    for (size_t i = 0; i < kN; ++i) {
      buffers.push_back(AllocateReadBuffer(with_slack));
      ASSERT_NE(buffers.back(), nullptr);
      std::memset(buffers.back().get(), 0xAB, with_slack.bytes);
      outs.emplace_back(buffers.back().get() + shift + room.before, kChunk);
    }
    std::vector<Tier> tiers;
    const std::vector<absl::Status> got =
        store->GetBatch(kNs, keys, outs, &tiers, /*outs_have_read_room=*/true);
    size_t missing = 0;
    for (size_t i = 0; i < kN; ++i) {
      if (!got[i].ok()) {
        EXPECT_TRUE(absl::IsNotFound(got[i])) << got[i];
        ++missing;
        continue;
      }
      EXPECT_EQ(tiers[i], Tier::kSsd);
      EXPECT_TRUE(std::equal(outs[i].begin(), outs[i].end(), PayloadOf(keys[i], kChunk).begin()))
          << "chunk " << i;
      uint32_t magic = 0;
      std::memcpy(&magic, buffers[i].get() + shift, 4);
      if (shift == 0) {
        EXPECT_EQ(magic, kSlotMagic) << "chunk " << i << " was not read in place";
      } else {
        EXPECT_EQ(magic, 0xABABABABu) << "chunk " << i << ": an unaligned room was written";
      }
    }
    // The flipped slot on the first pass (it is dropped then: gone on the second).
    EXPECT_EQ(missing, 1u);
  }
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
}

TEST(ChunkStoreBasicsTest, CorruptBytesOnDiskAreAMissNeverBadBytes) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  const StoreOptions o = Options(dir.path(), 0, 8);
  const ChunkKey good = KeyOf(seed, 1), bad = KeyOf(seed, 2);
  {
    auto store = OpenOrDie(o);
    ASSERT_TRUE(PutChunk(*store, good).ok());
    ASSERT_TRUE(PutChunk(*store, bad).ok());
  }
  FlipPayloadBitOfSecondSlot(dir.path(), 1234, 0x04);
  auto store = OpenOrDie(o);
  std::vector<uint8_t> out(kChunk, 0xAB);
  absl::Status st = store->Get(kNs, bad, out);
  ASSERT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st;
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xAB; }));
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
  EXPECT_FALSE(Has(*store, bad));  // dropped
  ExpectChunk(*store, good);
  ASSERT_TRUE(PutChunk(*store, bad).ok());
  ExpectChunk(*store, bad);
}

// Regression: a store whose capacity is smaller than one slab zero-filled a whole slab
// (1 GiB by default) on its first write, and a slab that must grow would have been
// zero-filled from its start, over the chunks already in it.
TEST(ChunkStoreBasicsTest, SlabIsSizedToCapacityAndGrowsWithoutTouchingChunks) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  StoreOptions small = Options(dir.path(), 0, 3);
  small.slab_bytes = 1ull << 30;
  {
    auto store = OpenOrDie(small);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok());
  }
  const std::string slab = dir.path() + "/slabs/slab-000000.dat";
  EXPECT_EQ(std::filesystem::file_size(slab), 3 * SlotBytesFor(kChunk));
  StoreOptions bigger = small;
  bigger.ssd_bytes = 6 * SlotBytesFor(kChunk);
  auto store = OpenOrDie(bigger);
  for (uint64_t i = 3; i < 6; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok());
  EXPECT_EQ(std::filesystem::file_size(slab), 6 * SlotBytesFor(kChunk));
  for (uint64_t i = 0; i < 6; ++i) ExpectChunk(*store, KeyOf(seed, i));
}

TEST(ChunkStoreBasicsTest, BackgroundLayoutStaysASlabAheadOfTheWrites) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  StoreOptions o = Options(dir.path(), 0, 64);  // 4 slabs of 16 slots
  o.preallocate_ssd_background = true;
  {
    auto store = OpenOrDie(o);
    for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(PutChunk(*store, KeyOf(seed, i)).ok()) << i;
    for (uint64_t i = 0; i < 40; ++i) ExpectChunk(*store, KeyOf(seed, i));
    // The slab after the last one written (slab 2) is laid out on its own, ahead of need.
    const std::string last = dir.path() + "/slabs/slab-000003.dat";
    for (int i = 0; i < 500; ++i) {
      std::error_code ec;
      if (std::filesystem::file_size(last, ec) == 16 * SlotBytesFor(kChunk)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(std::filesystem::file_size(last), 16 * SlotBytesFor(kChunk));
  }
  auto store = OpenOrDie(o);
  for (uint64_t i = 0; i < 40; ++i) ExpectChunk(*store, KeyOf(seed, i));
}

// A payload in pieces (a network message's buffers) is stored as their concatenation, with
// its checksum computed while copying, on every tier and across a reopen.
TEST(ChunkStoreBasicsTest, APayloadInPiecesIsStoredAsOneOnEveryTier) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  TempDir dir;
  const StoreOptions o = Options(dir.path(), 4, 16);
  std::vector<ChunkKey> keys;
  {
    auto store = OpenOrDie(o);
    for (uint64_t i = 0; i < 8; ++i) {
      keys.push_back(KeyOf(seed, i));
      const std::vector<uint8_t> whole = PayloadOf(keys.back(), kChunk);
      std::vector<std::span<const uint8_t>> pieces;
      for (size_t at = 0; at < whole.size();) {  // 1 byte to 40 KB, some empty
        const size_t n =
            std::min<size_t>(whole.size() - at, rng() % 3 == 0 ? rng() % 2 : rng() % 40000);
        pieces.emplace_back(whole.data() + at, n);
        at += n;
      }
      const Payload payload{std::span<const std::span<const uint8_t>>(pieces)};
      ASSERT_EQ(payload.size(), whole.size());
      std::vector<uint8_t> copy(whole.size());
      EXPECT_EQ(payload.CopyWithChecksum(copy.data()), PayloadChecksum(whole)) << i;
      EXPECT_EQ(copy, whole);
      const Durability d = i % 2 ? Durability::kDurable : Durability::kMemory;
      ASSERT_TRUE(store->Put({kNs, keys.back(), {}, payload}, {d, 0}).ok()) << i;
    }
    for (const ChunkKey& k : keys) ExpectChunk(*store, k);
    ASSERT_TRUE(store->Flush().ok());
  }
  auto store = OpenOrDie(o);
  for (const ChunkKey& k : keys) ExpectChunk(*store, k);
}

// may_block = false: a put is done only where no I/O is needed (a free RAM slot, or one a
// clean copy gives up); a durable put, or room that needs a dirty chunk written first, is
// WouldBlock and stores nothing. The same put allowed to block then succeeds.
TEST(ChunkStoreBasicsTest, APutThatMayNotBlockStoresOnlyWhatNeedsNoIo) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  StoreOptions o = Options(dir.path(), 2, 16);
  auto plan = std::make_shared<FaultPlan>(seed);
  plan->set_rates({.write_eio = 1});  // chunks in RAM stay unwritten (dirty) until healed
  auto store = OpenOrDie(o, {.faults = plan});
  const PutOptions memory_now{Durability::kMemory, 0, /*may_block=*/false};
  const PutOptions durable_now{Durability::kDurable, 0, /*may_block=*/false};
  auto put = [&](uint64_t i, const PutOptions& opt) {
    const std::vector<uint8_t> p = PayloadOf(KeyOf(seed, i), kChunk);
    return store->Put({kNs, KeyOf(seed, i), {}, p}, opt).status();
  };
  ASSERT_TRUE(put(0, memory_now).ok());
  ASSERT_TRUE(put(1, memory_now).ok());
  EXPECT_EQ(store->Contains(kNs, KeyOf(seed, 1)), Tier::kRam);
  const absl::Status durable = put(2, durable_now);
  EXPECT_TRUE(IsWouldBlock(durable)) << durable;
  EXPECT_FALSE(Has(*store, KeyOf(seed, 2)));
  const absl::Status full = put(3, memory_now);  // both RAM slots hold unwritten chunks
  EXPECT_TRUE(IsWouldBlock(full)) << full;
  EXPECT_FALSE(Has(*store, KeyOf(seed, 3)));
  EXPECT_FALSE(IsWouldBlock(absl::UnavailableError("closing")));  // only the marked kind
  plan->set_rates({});
  ASSERT_TRUE(put(2, {Durability::kDurable, 0}).ok());
  ASSERT_TRUE(put(3, {Durability::kMemory, 0}).ok());
  for (uint64_t i = 0; i < 4; ++i) ExpectChunk(*store, KeyOf(seed, i));
}

// Lookup reports each chunk's tier; asked for the leading run only, it stops at the first
// chunk not held and reports the rest as absent, held or not.
TEST(ChunkStoreBasicsTest, LookupOfALeadingRunStopsAtTheFirstMiss) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 2, 16));
  std::mt19937_64 rng(seed);
  const size_t n = 6 + rng() % 4, gap = 1 + rng() % (n - 2);
  std::printf("%zu keys, key %zu not stored\n", n, gap);
  std::vector<ChunkKey> keys;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(KeyOf(seed, i));
    if (i != gap) {
      ASSERT_TRUE(PutChunk(*store, keys.back()).ok());
    }
  }
  const std::vector<Tier> all = store->Lookup(kNs, keys);
  const std::vector<Tier> leading = store->Lookup(kNs, keys, /*leading_only=*/true);
  ASSERT_EQ(all.size(), n);
  ASSERT_EQ(leading.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(all[i] == Tier::kNone, i == gap) << i;
    EXPECT_EQ(leading[i], i < gap ? all[i] : Tier::kNone) << i;
  }
  EXPECT_EQ(store->Lookup(kNs + 1, keys, true), std::vector<Tier>(n, Tier::kNone));
}

TEST(ChunkStoreBasicsTest, ChunksWhoseAncestorLeftGoFirst) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = OpenOrDie(Options(dir.path(), 0, 4));
  const ChunkKey d = KeyOf(seed, 1), a = KeyOf(seed, 2), b = KeyOf(seed, 3), c = KeyOf(seed, 4);
  ASSERT_TRUE(PutChunk(*store, d).ok());  // the oldest, reachable
  ASSERT_TRUE(PutChunk(*store, a).ok());
  ASSERT_TRUE(PutChunk(*store, b, a).ok());
  ASSERT_TRUE(PutChunk(*store, c, b).ok());
  ASSERT_TRUE(store->Erase(kNs, a).ok());              // b and c can no longer be reached
  ASSERT_TRUE(PutChunk(*store, KeyOf(seed, 5)).ok());  // fills the free slot
  ASSERT_TRUE(PutChunk(*store, KeyOf(seed, 6)).ok());  // evicts the orphan b, not d
  EXPECT_FALSE(Has(*store, b));
  EXPECT_TRUE(Has(*store, d));
  ASSERT_TRUE(PutChunk(*store, KeyOf(seed, 7)).ok());  // then c, orphaned in turn
  EXPECT_FALSE(Has(*store, c));
  EXPECT_TRUE(Has(*store, d));
}

}  // namespace
}  // namespace kvc::storage
