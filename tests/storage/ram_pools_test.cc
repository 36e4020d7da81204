// The RAM tier against a hostile reader and against memory corruption: an arena handed to
// a co-located client cannot be written, resized or hole-punched by it, whatever fd it
// holds; a namespace in its own RAM pool keeps its chunks in that pool's arena only (and
// is never evicted by another pool's traffic); a RAM copy that no longer matches its
// checksum is a counted miss, never handed out.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/ram_arena.h"
#include "storage/slot_format.h"
#include "tests/storage/open_store.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using ::kvc::testing::KeyOf;
using ::kvc::testing::PayloadOf;
using ::kvc::testing::TempDir;

constexpr uint64_t kChunk = 20000;
constexpr NamespaceId kNsA = 3, kNsB = 4;

std::unique_ptr<ChunkStore> Open(const std::string& dir, uint64_t pool0_chunks,
                                 std::vector<uint64_t> pool_chunks, uint64_t ssd_chunks,
                                 const std::function<void(StoreOptions&)>& adjust = {}) {
  pool_chunks.insert(pool_chunks.begin(), pool0_chunks);
  return testing::OpenSmallStore(dir, kChunk, pool_chunks, ssd_chunks, {kNsA, kNsB}, adjust);
}

// The server's own mapping stands in for a memory fault: flips one bit of key's RAM copy.
void FlipBitInRam(ChunkStore& store, const ChunkKey& key, size_t byte, int bit) {
  absl::StatusOr<RamLease> lease = store.LeaseRam(kNsA, key);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const_cast<uint8_t*>(lease->bytes().data())[byte] ^= static_cast<uint8_t>(1u << bit);
  std::printf("flipped bit %d of byte %zu\n", bit, byte);
}

absl::Status PutMemory(ChunkStore& s, NamespaceId ns, const ChunkKey& key) {
  const std::vector<uint8_t> p = PayloadOf(key, kChunk);
  return s.Put({ns, key, std::nullopt, p}, {Durability::kMemory, 0}).status();
}

// Whether `needle` occurs anywhere in the fd's first `bytes` bytes.
bool FdHolds(int fd, uint64_t bytes, std::span<const uint8_t> needle) {
  std::vector<uint8_t> all(bytes);
  EXPECT_EQ(pread(fd, all.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return std::search(all.begin(), all.end(), needle.begin(), needle.end()) != all.end();
}

TEST(RamArenaSealTest, NoFdAClientCanGetWritesResizesOrPunchesTheArena) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 4, {}, 0);
  const ChunkKey a = KeyOf(seed, 1);
  ASSERT_TRUE(PutMemory(*store, kNsA, a).ok());
  const int fd = store->ram_arena_fd();
  const uint64_t bytes = store->ram_arena_bytes();
  ASSERT_GE(fd, 0);

  // The fd handed out is read-only…
  EXPECT_EQ(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_LT(pwrite(fd, "x", 1, 0), 0);
  // …and so is every fd a client can reopen from it: the memfd is sealed.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int rw = open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {  // the reopen itself may succeed; nothing done with it may write
    EXPECT_EQ(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    EXPECT_LT(pwrite(rw, "x", 1, 0), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(ftruncate(rw, 0), 0);
    EXPECT_NE(ftruncate(rw, static_cast<off_t>(2 * bytes)), 0);
    EXPECT_NE(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
    EXPECT_NE(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE), 0) << "seals can be changed";
    close(rw);
  }
  // A read-only shared mapping cannot be made writable later.
  void* ro = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(mprotect(ro, bytes, PROT_READ | PROT_WRITE), 0);
  // A private mapping may be written, but the writes stay in the writer's own copy.
  void* priv = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ASSERT_NE(priv, MAP_FAILED);
  std::memset(priv, 0x5A, bytes);
  munmap(priv, bytes);
  munmap(ro, bytes);

  std::vector<uint8_t> out(kChunk);
  ASSERT_TRUE(store->Get(kNsA, a, out).ok());
  EXPECT_EQ(out, PayloadOf(a, kChunk));
  EXPECT_EQ(store->Stats().checksum_failures, 0u);
}

// This process's resident shared memory, in KiB (where a memfd's touched pages count).
uint64_t RssShmemKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssShmem:", 0) == 0) return std::strtoull(line.c_str() + 9, nullptr, 10);
  }
  return 0;
}

TEST(RamArenaSealTest, APrefaultedArenaIsResidentAtOnceAndALazyOneIsNot) {
  constexpr uint64_t kSlot = 1 << 20;
  constexpr uint32_t kSlots = 48;  // 48 MiB
  {  // MADV_POPULATE_WRITE is Linux 5.14; before it the prefault is skipped by design
    void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const bool supported = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
    munmap(probe, 4096);
    if (!supported) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE";
  }
  const uint64_t before = RssShmemKb();
  absl::StatusOr<std::unique_ptr<RamArena>> lazy = RamArena::Create(kSlot, kSlots, "lazy");
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  const uint64_t after_lazy = RssShmemKb();
  absl::StatusOr<std::unique_ptr<RamArena>> eager =
      RamArena::Create(kSlot, kSlots, "eager", /*prefault=*/true);
  ASSERT_TRUE(eager.ok()) << eager.status();
  const uint64_t after_eager = RssShmemKb();
  std::printf("RssShmem: %llu KiB, +%llu lazy, +%llu prefaulted\n",
              static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(after_lazy - before),
              static_cast<unsigned long long>(after_eager - after_lazy));
  EXPECT_LT(after_lazy - before, 4u << 10);
  EXPECT_GE(after_eager - after_lazy, kSlot * kSlots / 1024 * 9 / 10);
  // Still sealed: the prefault made no second writable mapping.
  EXPECT_EQ(mmap(nullptr, kSlot, PROT_READ | PROT_WRITE, MAP_SHARED, (*eager)->read_only_fd(), 0),
            MAP_FAILED);
}

TEST(RamPoolTest, ANamespaceInItsOwnPoolIsInThatArenaOnlyAndKeepsItsSlots) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 2, {3}, 0);
  ASSERT_EQ(store->ram_pool_count(), 2u);
  ASSERT_TRUE(store->SetRamPool(kNsB, 1).ok());
  EXPECT_EQ(store->RamPoolOf(kNsB), 1u);
  EXPECT_EQ(store->RamPoolOf(kNsA), 0u);
  EXPECT_TRUE(absl::IsInvalidArgument(store->SetRamPool(kNsA, 2)));
  std::vector<ChunkKey> b_keys;
  for (uint64_t i = 0; i < 3; ++i) {
    b_keys.push_back(KeyOf(seed, 100 + i));
    ASSERT_TRUE(PutMemory(*store, kNsB, b_keys.back()).ok());
  }
  // A's traffic fills and churns pool 0; B's chunks stay where they are.
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(PutMemory(*store, kNsA, KeyOf(seed, i)).ok());
  for (const ChunkKey& k : b_keys) EXPECT_EQ(store->Contains(kNsB, k), Tier::kRam);
  EXPECT_EQ(store->Stats().ram_chunks, 5u);
  // B's bytes are in pool 1's arena, at the leased offset, and nowhere in pool 0's.
  for (const ChunkKey& k : b_keys) {
    absl::StatusOr<RamLease> lease = store->LeaseRam(kNsB, k);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->pool(), 1u);
    std::vector<uint8_t> at(kChunk);
    ASSERT_EQ(
        pread(store->ram_arena_fd(1), at.data(), kChunk, static_cast<off_t>(lease->arena_offset())),
        static_cast<ssize_t>(kChunk));
    EXPECT_EQ(at, PayloadOf(k, kChunk));
    const std::vector<uint8_t> needle(at.begin(), at.begin() + 64);
    EXPECT_FALSE(FdHolds(store->ram_arena_fd(0), store->ram_arena_bytes(0), needle));
  }
  // A full pool makes room from its own chunks; pool 0's stay.
  std::vector<ChunkKey> a_in_ram;
  for (uint64_t i = 0; i < 8; ++i) {
    if (store->Contains(kNsA, KeyOf(seed, i)) == Tier::kRam) a_in_ram.push_back(KeyOf(seed, i));
  }
  ASSERT_EQ(a_in_ram.size(), 2u);
  ASSERT_TRUE(PutMemory(*store, kNsB, KeyOf(seed, 200)).ok());
  EXPECT_EQ(store->Contains(kNsB, KeyOf(seed, 200)), Tier::kRam);
  EXPECT_EQ(store->Contains(kNsB, b_keys[0]), Tier::kNone);  // B's least recent
  for (const ChunkKey& k : a_in_ram) EXPECT_EQ(store->Contains(kNsA, k), Tier::kRam);
}

TEST(RamChecksumTest, WithEveryReadVerifiedACorruptedRamCopyIsACountedMissNeverHandedOut) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  // RAM only: the copy is the only one.
  auto store = Open(dir.path(), 4, {}, 0, [](StoreOptions& o) {
    o.ram_verify = RamVerify::kEveryRead;
    o.ram_scrub_bytes_per_s = 0;
  });
  const ChunkKey a = KeyOf(seed, 1), b = KeyOf(seed, 2);
  ASSERT_TRUE(PutMemory(*store, kNsA, a).ok());
  ASSERT_TRUE(PutMemory(*store, kNsA, b).ok());
  FlipBitInRam(*store, a, seed % kChunk, static_cast<int>(seed % 8));
  std::vector<uint8_t> out(kChunk);
  absl::Status got = store->Get(kNsA, a, out);
  EXPECT_TRUE(absl::IsNotFound(got)) << got;
  EXPECT_NE(got.message().find("checksum"), std::string::npos) << got;
  EXPECT_EQ(store->Contains(kNsA, a), Tier::kNone);  // dropped
  EXPECT_TRUE(absl::IsNotFound(store->LeaseRam(kNsA, a).status()));
  ASSERT_TRUE(store->Get(kNsA, b, out).ok());  // its neighbour is untouched
  EXPECT_EQ(out, PayloadOf(b, kChunk));
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.ram_checksum_failures, 1u);

  // The same through a lease (the path gRPC Fetch and shared memory take).
  FlipBitInRam(*store, b, kChunk - 1, 7);
  absl::StatusOr<RamLease> again = store->LeaseRam(kNsA, b);
  EXPECT_TRUE(absl::IsNotFound(again.status())) << again.status();
  EXPECT_EQ(store->Stats().ram_checksum_failures, 2u);
  EXPECT_EQ(store->Stats().ram_chunks, 0u);
}

// Each RAM chunk once, by lease (the path gRPC Fetch and shared memory take) and by Get:
// which keys came back, and whether each one's bytes are its own.
void ExpectServedOnlyIntact(ChunkStore& store, const std::vector<ChunkKey>& keys,
                            const ChunkKey& corrupt) {
  std::vector<uint8_t> out(kChunk);
  for (const ChunkKey& k : keys) {
    absl::Status got = store.Get(kNsA, k, out);
    absl::StatusOr<RamLease> lease = store.LeaseRam(kNsA, k);
    if (k == corrupt) {
      EXPECT_TRUE(absl::IsNotFound(got)) << got;
      EXPECT_TRUE(absl::IsNotFound(lease.status())) << lease.status();
      continue;
    }
    ASSERT_TRUE(got.ok()) << got;
    EXPECT_EQ(out, PayloadOf(k, kChunk));
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_TRUE(std::equal(out.begin(), out.end(), lease->bytes().begin()));
    EXPECT_EQ(lease->checksum(), PayloadChecksum(out));
  }
}

TEST(RamScrubTest, ACopyTheScrubFoundCorruptIsNeverServedAgain) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 6, {}, 0, [](StoreOptions& o) {
    o.ram_verify = RamVerify::kScrub;
    o.ram_scrub_bytes_per_s = 0;  // the test drives the scrub
  });
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 5; ++i) {
    keys.push_back(KeyOf(seed, 10 + i));
    ASSERT_TRUE(PutMemory(*store, kNsA, keys.back()).ok());
  }
  const ChunkKey bad = keys[seed % keys.size()];
  FlipBitInRam(*store, bad, (seed >> 8) % kChunk, static_cast<int>((seed >> 4) % 8));
  EXPECT_EQ(store->Stats().ram_checksum_failures, 0u) << "reads do not hash in kScrub";
  // A step smaller than the tier verifies part of it; the pass goes on where it stopped.
  uint64_t verified = store->ScrubRam(kChunk);
  EXPECT_GE(verified, kChunk);
  EXPECT_LT(verified, 5 * kChunk);
  EXPECT_EQ(store->Stats().ram_scrub_passes, 0u);
  while (store->Stats().ram_scrub_passes == 0) {
    const uint64_t step = store->ScrubRam(kChunk);
    verified += step;
    ASSERT_LE(verified, 6 * kChunk) << "a pass over 6 slots verified more than 6 chunks";
  }
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.ram_scrub_bytes, 5 * kChunk) << "every RAM copy, each once";
  EXPECT_EQ(st.ram_checksum_failures, 1u);
  EXPECT_EQ(st.ram_chunks, 4u);
  EXPECT_GT(st.ram_scrub_last_pass_s, 0);
  EXPECT_EQ(store->Contains(kNsA, bad), Tier::kNone);
  ExpectServedOnlyIntact(*store, keys, bad);
  EXPECT_EQ(store->CheckConsistency(), absl::OkStatus());
}

TEST(RamScrubTest, TheBackgroundScrubFindsACorruptCopyOnItsOwn) {
  const uint64_t seed = testing::FreshSeed();
  TempDir dir;
  auto store = Open(dir.path(), 4, {}, 0, [](StoreOptions& o) {
    o.ram_verify = RamVerify::kScrub;
    o.ram_scrub_bytes_per_s = 64 * kChunk;  // a pass over 4 slots: well under a second
  });
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 3; ++i) {
    keys.push_back(KeyOf(seed, 30 + i));
    ASSERT_TRUE(PutMemory(*store, kNsA, keys.back()).ok());
  }
  const ChunkKey bad = keys[seed % keys.size()];
  FlipBitInRam(*store, bad, seed % kChunk, static_cast<int>((seed >> 3) % 8));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store->Contains(kNsA, bad) != Tier::kNone && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(store->Contains(kNsA, bad), Tier::kNone) << "the scrub never dropped the bad copy";
  EXPECT_EQ(store->Stats().ram_checksum_failures, 1u);
  ExpectServedOnlyIntact(*store, keys, bad);
}

}  // namespace
}  // namespace kvc::storage
