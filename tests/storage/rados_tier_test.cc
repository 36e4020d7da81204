// The RADOS tier (storage/rados_tier.h) on a real Ceph cluster (docs/storage.md, "A Ceph
// cluster for tests"): scripts/ceph-up.sh brings up one monitor and one memstore OSD in a
// folder for each test, scripts/ceph-down.sh ends it. First librados itself (the C++ API,
// linked as -lrados), then the tier's chunks: stored and read exact with what is kept
// beside them, never handed out when they do not verify or are another namespace's.
#include <rados/librados.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "storage/rados_tier.h"
#include "storage/slot_format.h"
#include "tests/storage/open_store.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/ceph_cluster.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using RadosClusterTest = testing::CephClusterTest;

TEST_F(RadosClusterTest, AnObjectAndItsXattrsGoInAndComeBackExact) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  librados::Rados rados;
  ASSERT_EQ(rados.init2("client.admin", "ceph", 0), 0);
  ASSERT_EQ(rados.conf_read_file(conf_.c_str()), 0);
  ASSERT_EQ(rados.conf_set("client_mount_timeout", "10"), 0);
  ASSERT_EQ(rados.connect(), 0);
  librados::IoCtx io;
  ASSERT_EQ(rados.ioctx_create("kvc-test", io), 0);
  std::string bytes(57 * 1024, '\0');  // a 256-token chunk of a small model's size
  for (char& c : bytes) c = static_cast<char>(rng());
  librados::bufferlist in;
  in.append(bytes);
  ASSERT_EQ(io.write_full("chunk-0", in), 0);
  librados::bufferlist sum;
  sum.append(std::to_string(rng()));
  ASSERT_EQ(io.setxattr("chunk-0", "checksum", sum), 0);

  librados::bufferlist out;
  ASSERT_EQ(io.read("chunk-0", out, bytes.size(), 0), static_cast<int>(bytes.size()));
  EXPECT_EQ(out.to_str(), bytes);
  librados::bufferlist got_sum;
  ASSERT_GE(io.getxattr("chunk-0", "checksum", got_sum), 0);
  EXPECT_EQ(got_sum.to_str(), sum.to_str());
  // Gone once removed: a read says so (ENOENT), it never returns other bytes.
  ASSERT_EQ(io.remove("chunk-0"), 0);
  librados::bufferlist after;
  EXPECT_EQ(io.read("chunk-0", after, bytes.size(), 0), -ENOENT);
  io.close();
  rados.shutdown();
}

TEST_F(RadosClusterTest, ChunksAreStoredAndReadExactWithWhatIsKeptBesideThem) {
  const uint64_t seed = testing::FreshSeed();
  absl::StatusOr<std::unique_ptr<RadosTier>> tier =
      RadosTier::Connect({.pool = "kvc-test", .conf_file = conf_});
  ASSERT_TRUE(tier.ok()) << tier.status();
  RadosTier& t = **tier;
  constexpr NamespaceId kNs = 7;
  constexpr size_t kBytes = 57'344;
  const ChunkKey key = testing::KeyOf(seed, 1), parent = testing::KeyOf(seed, 0);
  const std::vector<uint8_t> bytes = testing::PayloadOf(key, kBytes);
  RadosChunk meta;
  meta.namespace_tag = kNs;
  meta.payload_checksum = PayloadChecksum(bytes);
  meta.parent = parent;
  meta.origin = ChunkOrigin{testing::KeyOf(seed, 100), testing::KeyOf(seed, 99)};
  meta.expires_s = 1'900'000'000;
  EXPECT_EQ(t.Contains(key).value_or(true), false);
  std::vector<uint8_t> out(kBytes);
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs, key, out)));
  ASSERT_EQ(t.Put(key, meta, bytes), absl::OkStatus());
  EXPECT_EQ(t.Contains(key).value_or(false), true);
  RadosChunk got;
  ASSERT_EQ(t.Get(kNs, key, out, &got), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(got.namespace_tag, kNs);
  EXPECT_EQ(got.payload_checksum, meta.payload_checksum);
  EXPECT_EQ(got.parent, meta.parent);
  EXPECT_EQ(got.origin, meta.origin);
  EXPECT_EQ(got.expires_s, meta.expires_s);
  // Another namespace's reader, or one expecting another size, gets nothing.
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs + 1, key, out)));
  std::vector<uint8_t> smaller(kBytes - 4096);
  EXPECT_TRUE(absl::IsDataLoss(t.Get(kNs, key, smaller)));
  // Bytes changed behind the tier's back do not verify: never handed out as the chunk.
  {
    librados::Rados rados;
    ASSERT_EQ(rados.init2("client.admin", "ceph", 0), 0);
    ASSERT_EQ(rados.conf_read_file(conf_.c_str()), 0);
    ASSERT_EQ(rados.connect(), 0);
    librados::IoCtx io;
    ASSERT_EQ(rados.ioctx_create("kvc-test", io), 0);
    librados::bufferlist flip;
    flip.append(std::string(1, static_cast<char>(bytes[1234] ^ 0x40)));
    ASSERT_EQ(io.write(RadosTier::ObjectName(key), flip, 1, 1234), 0);
    io.close();
    rados.shutdown();
  }
  EXPECT_TRUE(absl::IsDataLoss(t.Get(kNs, key, out)));
  // A damaged object is removed by the read that found it: the next store creates it anew
  // (a renewal would have kept the damage).
  EXPECT_FALSE(t.Contains(key).value_or(true));
  // Stored again, it reads exact; a second store (another owner's) renews what is kept
  // beside it; removed, it is gone (and removing twice is fine).
  ASSERT_EQ(t.Put(key, meta, bytes), absl::OkStatus());
  ASSERT_EQ(t.Get(kNs, key, out), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  RadosChunk renewed = meta;
  renewed.expires_s += 3600;
  ASSERT_EQ(t.Put(key, renewed, bytes), absl::OkStatus());
  ASSERT_EQ(t.Get(kNs, key, out, &got), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(got.expires_s, renewed.expires_s);
  // An object of this key holding something else (another format, other bytes) is
  // replaced whole by a store, not renewed.
  const std::vector<uint8_t> other = testing::PayloadOf(parent, kBytes);
  ASSERT_EQ(t.Put(key, meta, other), absl::OkStatus());
  ASSERT_EQ(t.Get(kNs, key, out), absl::OkStatus());
  EXPECT_EQ(out, other);
  ASSERT_EQ(t.Put(key, meta, bytes), absl::OkStatus());
  ASSERT_EQ(t.Get(kNs, key, out), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  ASSERT_EQ(t.Remove(key), absl::OkStatus());
  ASSERT_EQ(t.Remove(key), absl::OkStatus());
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs, key, out)));
}

TEST_F(RadosClusterTest, APoolThatDoesNotExistIsNamed) {
  absl::StatusOr<std::unique_ptr<RadosTier>> tier =
      RadosTier::Connect({.pool = "no-such-pool", .conf_file = conf_});
  ASSERT_FALSE(tier.ok());
  EXPECT_TRUE(absl::IsNotFound(tier.status())) << tier.status();
  EXPECT_NE(tier.status().message().find("no-such-pool"), std::string::npos) << tier.status();
}

// ---- A store with RADOS as its shared tier (chunk_store_shared.cc) ----

constexpr NamespaceId kStoreNs = 21;
constexpr uint64_t kStoreChunk = 9000;

std::shared_ptr<RadosTier> ConnectTier(const std::string& conf, uint32_t op_timeout_s = 5) {
  absl::StatusOr<std::unique_ptr<RadosTier>> t = RadosTier::Connect(
      {.pool = testing::CephClusterTest::kPool, .conf_file = conf, .op_timeout_s = op_timeout_s});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::shared_ptr<RadosTier>(*std::move(t)) : nullptr;
}

std::unique_ptr<ChunkStore> OpenSharedStore(const std::string& dir, std::shared_ptr<RadosTier> tier,
                                            bool write_behind, const StoreSeams& seams = {},
                                            double retry_after_s = 5) {
  StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kStoreChunk;
  o.ram_bytes = 64 * kStoreChunk;
  o.ssd_bytes = 256 * SlotBytesFor(kStoreChunk);
  o.slab_bytes = 64 * SlotBytesFor(kStoreChunk);
  o.shared_tier = std::move(tier);
  o.shared_write_behind = write_behind;
  o.shared_retry_after_s = retry_after_s;
  return testing::OpenStoreWith(o, kStoreNs, kStoreChunk, seams);
}

// Durable puts reach RADOS, memory puts do not; a node whose folder is gone (a new,
// empty store on the same pool) finds them there, reads them exact and keeps a copy; an
// erase removes the shared copy too; another namespace never reads them.
TEST_F(RadosClusterTest, AStoreWithAnEmptyFolderServesWhatDurablePutsSentToRados) {
  const uint64_t seed = testing::FreshSeed();
  std::shared_ptr<RadosTier> tier = ConnectTier(conf_);
  ASSERT_NE(tier, nullptr);
  testing::TempDir dir;
  constexpr uint64_t kDurable = 40, kMemory = 6;
  std::vector<ChunkKey> keys;
  {
    auto node = OpenSharedStore(dir.File("a"), tier, /*write_behind=*/false);
    ASSERT_NE(node, nullptr);
    for (uint64_t i = 0; i < kDurable + kMemory; ++i) {
      keys.push_back(testing::KeyOf(seed, i));
      const std::vector<uint8_t> p = testing::PayloadOf(keys[i], kStoreChunk);
      PutOptions o;
      o.durability = i < kDurable ? Durability::kDurable : Durability::kMemory;
      std::optional<ChunkKey> parent;
      if (i > 0) parent = keys[i - 1];
      ASSERT_TRUE(node->Put({kStoreNs, keys[i], parent, p}, o).ok()) << i;
    }
    const StoreStats st = node->Stats();
    EXPECT_EQ(st.shared.name, "rados");
    EXPECT_EQ(st.shared.puts, kDurable);
    EXPECT_EQ(st.shared.put_errors, 0u);
    EXPECT_TRUE(st.shared.reachable);
  }
  for (uint64_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(tier->Contains(keys[i]).value_or(false), i < kDurable) << i;

  std::filesystem::remove_all(dir.File("a"));  // the node's disk is gone
  auto fresh = OpenSharedStore(dir.File("a"), tier, false);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->Stats().ssd_chunks, 0u);
  const std::vector<Tier> found = fresh->Lookup(kStoreNs, keys, /*leading_only=*/true);
  for (uint64_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(found[i], i < kDurable ? Tier::kRados : Tier::kNone) << i;
  std::vector<std::vector<uint8_t>> bufs(kDurable, std::vector<uint8_t>(kStoreChunk));
  std::vector<std::span<uint8_t>> outs(bufs.begin(), bufs.end());
  std::vector<Tier> from;
  const std::vector<absl::Status> got =
      fresh->GetBatch(kStoreNs, std::span(keys).first(kDurable), outs, &from);
  for (uint64_t i = 0; i < kDurable; ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i];
    EXPECT_EQ(from[i], Tier::kRados);
    ASSERT_EQ(bufs[i], testing::PayloadOf(keys[i], kStoreChunk)) << i;
  }
  EXPECT_EQ(fresh->Stats().shared.hits, kDurable);
  // Promoted: the next read is this node's, and so is the lookup.
  std::vector<uint8_t> out(kStoreChunk);
  std::vector<Tier> again;
  std::span<uint8_t> one[] = {out};
  ASSERT_TRUE(fresh->GetBatch(kStoreNs, std::span(&keys[3], 1), one, &again)[0].ok());
  EXPECT_NE(again[0], Tier::kRados);
  EXPECT_EQ(fresh->Lookup(kStoreNs, std::span(&keys[3], 1))[0], Tier::kRam);
  // Clean copies: RADOS holds the durable one, nothing is written to this node's SSD.
  ASSERT_EQ(fresh->Flush(), absl::OkStatus());
  EXPECT_EQ(fresh->Stats().ssd_chunks, 0u);
  EXPECT_EQ(fresh->Stats().promotions, kDurable);
  // A memory put never reached RADOS: a miss, not someone else's bytes.
  EXPECT_TRUE(absl::IsNotFound(fresh->Get(kStoreNs, keys[kDurable], out)));
  // Another namespace (same chunk size) asking for the key gets nothing.
  ASSERT_TRUE(fresh->RegisterNamespace(kStoreNs + 1, kStoreChunk).ok());
  EXPECT_TRUE(absl::IsNotFound(fresh->Get(kStoreNs + 1, keys[5], out)));
  // Erased here (promoted copy) and there; one held only there is erased there.
  ASSERT_EQ(fresh->Erase(kStoreNs, keys[3]), absl::OkStatus());
  ASSERT_EQ(fresh->Erase(kStoreNs, keys[4]), absl::OkStatus());
  EXPECT_FALSE(tier->Contains(keys[3]).value_or(true));
  EXPECT_FALSE(tier->Contains(keys[4]).value_or(true));
  EXPECT_TRUE(absl::IsNotFound(fresh->Get(kStoreNs, keys[4], out)));
  EXPECT_TRUE(absl::IsNotFound(fresh->Erase(kStoreNs, keys[4])));
}

// Write-behind: the puts are acknowledged before RADOS has them, and the backlog reaches
// it; a chunk erased while queued never does.
TEST_F(RadosClusterTest, WriteBehindSendsItsBacklogAndAnEraseOvertakesIt) {
  const uint64_t seed = testing::FreshSeed();
  std::shared_ptr<RadosTier> tier = ConnectTier(conf_);
  ASSERT_NE(tier, nullptr);
  testing::TempDir dir;
  auto node = OpenSharedStore(dir.File("b"), tier, /*write_behind=*/true);
  ASSERT_NE(node, nullptr);
  constexpr uint64_t kChunks = 64;
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < kChunks; ++i) {
    keys.push_back(testing::KeyOf(seed, i));
    ASSERT_TRUE(
        node->Put({kStoreNs, keys[i], std::nullopt, testing::PayloadOf(keys[i], kStoreChunk)}, {})
            .ok());
  }
  ASSERT_EQ(node->Erase(kStoreNs, keys[kChunks - 1]), absl::OkStatus());
  ASSERT_EQ(node->DrainSharedTier(std::chrono::seconds(30)), absl::OkStatus());
  const StoreStats st = node->Stats();
  EXPECT_TRUE(st.shared.write_behind);
  EXPECT_EQ(st.shared.backlog_chunks, 0u);
  EXPECT_EQ(st.shared.backlog_bytes, 0u);
  std::vector<uint8_t> out(kStoreChunk);
  for (uint64_t i = 0; i + 1 < kChunks; ++i) {
    ASSERT_EQ(tier->Get(kStoreNs, keys[i], out), absl::OkStatus()) << i;
    ASSERT_EQ(out, testing::PayloadOf(keys[i], kStoreChunk)) << i;
  }
  EXPECT_FALSE(tier->Contains(keys[kChunks - 1]).value_or(true));
}

// A chunk's TTL goes with it: read after its expiry from RADOS, it is a miss, and gone.
TEST_F(RadosClusterTest, AChunkPastItsTtlIsAMissAndIsRemovedFromRados) {
  const uint64_t seed = testing::FreshSeed();
  std::shared_ptr<RadosTier> tier = ConnectTier(conf_);
  ASSERT_NE(tier, nullptr);
  testing::TempDir dir;
  std::atomic<int64_t> now{1'800'000'000};
  StoreSeams clock;
  clock.now_s = [&] { return now.load(); };
  const ChunkKey key = testing::KeyOf(seed, 1);
  {
    auto node = OpenSharedStore(dir.File("c"), tier, false, clock);
    ASSERT_NE(node, nullptr);
    PutOptions o;
    o.ttl_s = 60;
    ASSERT_TRUE(
        node->Put({kStoreNs, key, std::nullopt, testing::PayloadOf(key, kStoreChunk)}, o).ok());
  }
  ASSERT_TRUE(tier->Contains(key).value_or(false));
  std::filesystem::remove_all(dir.File("c"));
  now += 61;
  auto fresh = OpenSharedStore(dir.File("c"), tier, false, clock);
  ASSERT_NE(fresh, nullptr);
  std::vector<uint8_t> out(kStoreChunk);
  EXPECT_TRUE(absl::IsNotFound(fresh->Get(kStoreNs, key, out)));
  EXPECT_FALSE(tier->Contains(key).value_or(true));
}

// The OSD stopped (SIGSTOP) under a store: a read of a chunk held only in RADOS is a clean
// miss within the operation timeout, a write-through put fails naming why (the chunk is
// kept here), a write-behind put is acknowledged and waits in the backlog (its size
// visible); Stats says the tier is unreachable. Once the OSD runs again everything
// catches up: the miss reads, the put retried reaches RADOS, the backlog drains.
TEST_F(RadosClusterTest, AStoppedOsdIsABoundedMissAndTheStoreCatchesUpWhenItReturns) {
  const uint64_t seed = testing::FreshSeed();
  constexpr uint32_t kTimeoutS = 2;
  std::shared_ptr<RadosTier> tier = ConnectTier(conf_, kTimeoutS);
  ASSERT_NE(tier, nullptr);
  testing::TempDir dir;
  constexpr double kRetryAfterS = 1;
  auto through = OpenSharedStore(dir.File("t"), tier, /*write_behind=*/false, {}, kRetryAfterS);
  auto behind = OpenSharedStore(dir.File("w"), tier, /*write_behind=*/true, {}, kRetryAfterS);
  ASSERT_NE(through, nullptr);
  ASSERT_NE(behind, nullptr);
  const ChunkKey only_there = testing::KeyOf(seed, 1), put_key = testing::KeyOf(seed, 2);
  const std::vector<uint8_t> there_bytes = testing::PayloadOf(only_there, kStoreChunk);
  SharedChunk meta;
  meta.namespace_tag = kStoreNs;
  ASSERT_EQ(tier->Put(only_there, meta, there_bytes), absl::OkStatus());

  std::ifstream pid_file(ceph_dir_.File("ceph") + "/osd.pid");
  pid_t osd = 0;
  ASSERT_TRUE(pid_file >> osd) << "ceph-up.sh writes the OSD's pid";
  ASSERT_EQ(kill(osd, SIGSTOP), 0);
  // The signal stops it asynchronously: wait until the kernel says it is stopped ("T").
  auto stopped = [&] {
    std::ifstream stat("/proc/" + std::to_string(osd) + "/stat");
    std::string pid_field, comm, state;
    stat >> pid_field >> comm >> state;
    return state == "T";
  };
  for (int i = 0; i < 500 && !stopped(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(stopped()) << "the OSD did not stop";
  std::vector<uint8_t> out(kStoreChunk);
  auto t0 = std::chrono::steady_clock::now();
  const absl::Status miss = through->Get(kStoreNs, only_there, out);
  const double miss_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(absl::IsNotFound(miss)) << miss;
  EXPECT_LT(miss_s, 3.0 * kTimeoutS) << "bounded by the operation timeout";
  // Once it has failed to answer, calls skip it for a while: the next miss is at once.
  t0 = std::chrono::steady_clock::now();
  const absl::Status skipped = through->Get(kStoreNs, only_there, out);
  EXPECT_TRUE(absl::IsNotFound(skipped)) << skipped;
  EXPECT_NE(skipped.message().find("not answering"), std::string::npos) << skipped;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  t0 = std::chrono::steady_clock::now();
  const absl::StatusOr<PutResult> refused =
      through->Put({kStoreNs, put_key, std::nullopt, testing::PayloadOf(put_key, kStoreChunk)}, {});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
            3.0 * kTimeoutS);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shared tier did not take it"), std::string::npos)
      << refused.status();
  StoreStats st = through->Stats();
  EXPECT_FALSE(st.shared.reachable);
  EXPECT_FALSE(st.shared.last_error.empty());
  EXPECT_EQ(through->Lookup(kStoreNs, std::span(&put_key, 1))[0], Tier::kRam) << "kept here";
  constexpr int kBehind = 8;
  for (int i = 0; i < kBehind; ++i) {
    const ChunkKey k = testing::KeyOf(seed, 100 + i);
    ASSERT_TRUE(
        behind->Put({kStoreNs, k, std::nullopt, testing::PayloadOf(k, kStoreChunk)}, {}).ok())
        << "write-behind acknowledges on the node's SSD";
  }
  EXPECT_GT(behind->Stats().shared.backlog_chunks, 0u);

  ASSERT_EQ(kill(osd, SIGCONT), 0);
  // Asked again once the interval has passed.
  std::this_thread::sleep_for(std::chrono::duration<double>(kRetryAfterS + 0.1));
  ASSERT_EQ(through->Get(kStoreNs, only_there, out), absl::OkStatus());
  EXPECT_EQ(out, there_bytes);
  EXPECT_TRUE(through->Stats().shared.reachable);
  // The client's retry: here already, not there, so it is sent now.
  ASSERT_TRUE(
      through->Put({kStoreNs, put_key, std::nullopt, testing::PayloadOf(put_key, kStoreChunk)}, {})
          .ok());
  EXPECT_TRUE(tier->Contains(put_key).value_or(false));
  ASSERT_EQ(behind->DrainSharedTier(std::chrono::seconds(30)), absl::OkStatus());
  for (int i = 0; i < kBehind; ++i) {
    const ChunkKey k = testing::KeyOf(seed, 100 + i);
    ASSERT_EQ(tier->Get(kStoreNs, k, out), absl::OkStatus()) << i;
    EXPECT_EQ(out, testing::PayloadOf(k, kStoreChunk));
  }
}

// Accounts (SharedTier::AccountBytes): two nodes (two connections) writing the same
// chunks at once count each object once; rewrites do not count; removes by both take its
// bytes off once; a sweep removes what is past its expiry (and only that), its bytes
// leaving the account.
TEST_F(RadosClusterTest, AnAccountCountsEachObjectOnceHoweverManyWriteOrRemoveIt) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  std::shared_ptr<RadosTier> a = ConnectTier(conf_), b = ConnectTier(conf_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kChunks = 48;
  constexpr int64_t kNow = 1'800'000'000;
  std::vector<ChunkKey> keys;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<SharedPut> puts;
  uint64_t total = 0, expiring = 0, other = 0;
  for (int i = 0; i < kChunks; ++i) {
    keys.push_back(testing::KeyOf(seed, i));
    bytes.push_back(testing::PayloadOf(keys[i], 1000 + rng() % 20'000));  // chunks of any size
  }
  for (int i = 0; i < kChunks; ++i) {
    SharedChunk m;
    m.namespace_tag = 5;
    m.account = i % 8 == 7 ? "tenant other" : "tenant a";
    if (i % 3 == 0) m.expires_s = i % 2 == 0 ? kNow - 1 : kNow + 3600;  // half past, half not
    puts.push_back({keys[i], m, bytes[i]});
    (i % 8 == 7 ? other : total) += bytes[i].size();
    if (i % 8 != 7 && i % 3 == 0 && i % 2 == 0) expiring += bytes[i].size();
  }
  auto write_all = [&](RadosTier* t) {
    for (const absl::Status& s : t->PutMany(puts)) EXPECT_EQ(s, absl::OkStatus());
  };
  std::thread first(write_all, a.get()), second(write_all, b.get());
  first.join();
  second.join();
  EXPECT_EQ(a->AccountBytes("tenant a").value_or(0), total);
  EXPECT_EQ(b->AccountBytes("tenant other").value_or(0), other);
  EXPECT_EQ(a->AccountBytes("tenant nobody").value_or(1), 0u);
  write_all(a.get());  // written again: the same objects, not more bytes
  EXPECT_EQ(b->AccountBytes("tenant a").value_or(0), total);

  const absl::StatusOr<SharedSweep> swept = a->SweepExpired(kNow);
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(swept->listed, static_cast<uint64_t>(kChunks)) << "chunks only, not usage objects";
  EXPECT_EQ(swept->errors, 0u);
  uint64_t expired_n = 0;
  for (int i = 0; i < kChunks; ++i) {
    const bool expired = i % 3 == 0 && i % 2 == 0;
    expired_n += expired;
    EXPECT_EQ(a->Contains(keys[i]).value_or(expired), !expired) << i;
  }
  EXPECT_EQ(swept->removed, expired_n);
  EXPECT_EQ(a->AccountBytes("tenant a").value_or(0), total - expiring);

  // Both remove the first half at once: taken off once.
  std::vector<ChunkKey> half(keys.begin(), keys.begin() + kChunks / 2);
  uint64_t half_bytes = 0;
  for (int i = 0; i < kChunks / 2; ++i) {
    if (i % 8 != 7 && !(i % 3 == 0 && i % 2 == 0)) half_bytes += bytes[i].size();
  }
  std::thread r1([&] { (void)a->RemoveMany(half); }), r2([&] { (void)b->RemoveMany(half); });
  r1.join();
  r2.join();
  EXPECT_EQ(a->AccountBytes("tenant a").value_or(0), total - expiring - half_bytes);
}

// A tenant's quota on its bytes in RADOS (Quota::rados_bytes) holds across the fleet: a
// durable put that would pass it is refused before anything is written — here or there —
// naming the owner and the limit; a second node sees the same count; memory puts and
// re-puts of what is stored are not refused; an erase makes room again.
TEST_F(RadosClusterTest, ARadosQuotaRefusesAPutThatWouldPassItOnEveryNode) {
  const uint64_t seed = testing::FreshSeed();
  std::shared_ptr<RadosTier> tier = ConnectTier(conf_);
  ASSERT_NE(tier, nullptr);
  testing::TempDir dir;
  constexpr uint64_t kLimitChunks = 10;
  auto open_node = [&](const std::string& name) {
    auto node = OpenSharedStore(dir.File(name), tier, /*write_behind=*/false);
    if (node == nullptr) return node;
    Quota q;
    q.owner = "tenant a";
    q.rados_bytes = kLimitChunks * kStoreChunk;
    EXPECT_EQ(node->SetQuota(1, q), absl::OkStatus());
    node->SetQuotaGroup(kStoreNs, 1);
    node->SetSharedTag(kStoreNs, 0xa11ce, "tenant a");
    return node;
  };
  auto one = open_node("one"), two = open_node("two");
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  auto put = [&](ChunkStore* node, uint64_t i, Durability d = Durability::kDurable) {
    const ChunkKey k = testing::KeyOf(seed, i);
    PutOptions o;
    o.durability = d;
    return node->Put({kStoreNs, k, std::nullopt, testing::PayloadOf(k, kStoreChunk)}, o);
  };
  for (uint64_t i = 0; i < kLimitChunks; ++i)
    ASSERT_TRUE(put(i % 2 ? two.get() : one.get(), i).ok()) << i;
  EXPECT_EQ(one->SharedAccountBytes("tenant a").value_or(0), kLimitChunks * kStoreChunk);
  for (ChunkStore* node : {one.get(), two.get()}) {
    const absl::StatusOr<PutResult> over = put(node, 100);
    ASSERT_FALSE(over.ok());
    EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
    EXPECT_NE(over.status().message().find("tenant a is at its rados quota of"), std::string::npos)
        << over.status();
    const ChunkKey k = testing::KeyOf(seed, 100);
    EXPECT_EQ(node->Lookup(kStoreNs, std::span(&k, 1))[0], Tier::kNone) << "nothing written";
  }
  // Stored already (this node's copy): not new bytes.
  EXPECT_TRUE(put(one.get(), 0).ok());
  // A memory put never goes to the shared tier.
  EXPECT_TRUE(put(one.get(), 101, Durability::kMemory).ok());
  // An erase gives the room back, on any node.
  ASSERT_EQ(one->Erase(kStoreNs, testing::KeyOf(seed, 1)), absl::OkStatus());
  EXPECT_EQ(two->SharedAccountBytes("tenant a").value_or(0), (kLimitChunks - 1) * kStoreChunk);
  EXPECT_TRUE(put(two.get(), 100).ok());
}

}  // namespace
}  // namespace kvc::storage
