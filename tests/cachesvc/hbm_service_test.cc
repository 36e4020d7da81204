// FetchDeviceRefs through the real service, store and gRPC on loopback, in this process,
// with the HBM tier over a host-memory arena (so it runs without a GPU; the CUDA arena and
// its IPC mapping are tests/kernels/hbm_ipc_test.cc): chunks are promoted from RAM and
// from SSD with their bytes intact, repeat fetches are T0 hits, leases keep slots,
// deletes end the prefix, and only trusted tenants may map the tier.
#include <grpcpp/grpcpp.h>

#include <grpcpp/grpcpp.h>
#include <algorithm>
#include <fstream>
#include <random>

#include "cachesvc/service.h"
#include "client/client.h"
#include "client/stats.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/host_arena.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::client::CacheClient;
using ::kvc::client::ClientOptions;
using ::kvc::client::DeviceRefs;
using ::kvc::client::LookupResult;
using ::kvc::client::RemoteNamespace;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A kvcached in this process: store (RAM + SSD), registry, service with an HBM tier of
// `hbm_slots` chunk slots over host memory, served on a free loopback port.
class InProcessDaemon {
 public:
  InProcessDaemon(const std::string& dir, uint64_t ram_bytes, uint64_t hbm_slots,
                  const std::string& tokens_file = "", std::set<std::string> device_tenants = {},
                  bool write_through = false) {
    storage::StoreOptions so;
    so.data_dir = dir;
    so.max_chunk_bytes = 16 << 10;  // the mini model's 64-token chunk (6,784 B) fits
    so.ram_bytes = ram_bytes;
    so.ssd_bytes = 64 << 20;
    so.slab_bytes = 16 << 20;
    arena_ = std::make_shared<testing::HostArena>(hbm_slots * so.max_chunk_bytes);
    so.hbm_arena = arena_;
    so.hbm_write_through = write_through;
    store_ = *storage::ChunkStore::Open(so);
    registry_ = *NamespaceRegistry::Open(dir);
    if (!tokens_file.empty()) auth_ = *Authenticator::FromFile(tokens_file);
    ServiceOptions opt;
    opt.max_chunk_bytes = so.max_chunk_bytes;
    opt.device_tenants = std::move(device_tenants);
    service_ = std::make_unique<KvCacheService>(store_.get(), registry_.get(), &auth_, opt);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    b.SetMaxReceiveMessageSize(4 << 20);
    b.SetMaxSendMessageSize(4 << 20);
    server_ = b.BuildAndStart();
  }
  ~InProcessDaemon() {
    server_->Shutdown();
    server_->Wait();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const storage::DeviceArena& arena() const { return *arena_; }
  storage::StoreStats stats() const { return store_->Stats(); }

 private:
  std::unique_ptr<storage::ChunkStore> store_;
  std::unique_ptr<NamespaceRegistry> registry_;
  Authenticator auth_;
  std::shared_ptr<testing::HostArena> arena_;
  std::unique_ptr<KvCacheService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

std::unique_ptr<CacheClient> Connect(const std::string& address, const std::string& token = "") {
  ClientOptions o;
  o.address = address;
  o.bearer_token = token;
  return *CacheClient::Connect(o);
}

using ::kvc::testing::MakePrefix;
using ::kvc::testing::Prefix;

// The bytes of every leased chunk, read back from the arena at the answer's offsets.
std::vector<uint8_t> ReadRefs(const storage::DeviceArena& arena, const DeviceRefs& refs) {
  std::vector<uint8_t> out;
  for (const auto& c : refs.chunks) {
    std::vector<uint8_t> b(c.length);
    EXPECT_TRUE(arena.Read(c.offset, b).ok());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

const std::string kMini = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";

TEST(HbmServiceTest, PromotesFromRamAndSsdAndLeasesIntactBytes) {
  testing::TempDir dir;
  // A RAM tier of few chunks (48 KiB: six of the mini model's, two pages each): some of
  // the prefix is on SSD only when it is fetched.
  InProcessDaemon d(dir.File("data"), /*ram_bytes=*/48 << 10, /*hbm_slots=*/16);
  auto client = Connect(d.address());
  absl::StatusOr<RemoteNamespace> ns = client->RegisterNamespace(ReadAll(kMini), "mini", 64);
  ASSERT_TRUE(ns.ok()) << ns.status();
  std::mt19937_64 rng(testing::FreshSeed());
  const Prefix p = MakePrefix(rng, *ns, 8);
  ASSERT_TRUE(client->Store(*ns, std::nullopt, p.tokens, p.payloads).ok());
  const std::vector<storage::ChunkKey> keys = client->Keys(*ns, p.tokens);
  absl::StatusOr<LookupResult> where = client->Lookup(*ns, p.tokens);
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(std::count(where->tiers.begin(), where->tiers.end(), client::Tier::kSsd) > 0, true)
      << "some chunks must come from SSD";
  absl::StatusOr<DeviceRefs> refs = client->FetchDeviceRefs(*ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->chunks.size(), keys.size());
  EXPECT_NE(refs->lease_id, 0u);
  EXPECT_EQ(refs->ipc_handle, "host-arena");
  EXPECT_EQ(refs->arena_id, 42u);
  EXPECT_EQ(ReadRefs(d.arena(), *refs), p.payloads);
  EXPECT_EQ(d.stats().hbm_leased, keys.size());
  EXPECT_EQ(d.stats().hbm_promotions, keys.size());
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());
  EXPECT_EQ(d.stats().hbm_leased, 0u);
  EXPECT_EQ(client->ReleaseDeviceRefs(refs->lease_id).code(), absl::StatusCode::kNotFound);
  // Lookup now reports every chunk in T0.
  where = client->Lookup(*ns, p.tokens);
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(std::count(where->tiers.begin(), where->tiers.end(), client::Tier::kHbm),
            static_cast<long>(keys.size()));
  // Again: all T0 hits, no new promotion.
  refs = client->FetchDeviceRefs(*ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(d.stats().hbm_promotions, keys.size());
  EXPECT_EQ(client->Stats()->hbm_hits(), keys.size());
  EXPECT_EQ(client->Stats()->hbm_chunks(), keys.size());
  EXPECT_EQ(ReadRefs(d.arena(), *refs), p.payloads);
}

TEST(HbmServiceTest, DeletesAndMissingChunksEndThePrefixAndFullTiersLeaseWhatFits) {
  testing::TempDir dir;
  InProcessDaemon d(dir.File("data"), 64 << 20, /*hbm_slots=*/4);
  auto client = Connect(d.address());
  const RemoteNamespace ns = *client->RegisterNamespace(ReadAll(kMini), "mini", 64);
  std::mt19937_64 rng(testing::FreshSeed());
  const Prefix p = MakePrefix(rng, ns, 6);
  ASSERT_TRUE(client->Store(ns, std::nullopt, p.tokens, p.payloads).ok());
  const std::vector<storage::ChunkKey> keys = client->Keys(ns, p.tokens);
  // Four slots for six chunks, all leased by one answer: the first four.
  absl::StatusOr<DeviceRefs> refs = client->FetchDeviceRefs(ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->chunks.size(), 4u);
  EXPECT_EQ(ReadRefs(d.arena(), *refs),
            std::vector<uint8_t>(p.payloads.begin(), p.payloads.begin() + 4 * ns.chunk_bytes));
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());
  // A deleted chunk leaves T0 too, and the prefix stops before it.
  ASSERT_TRUE(client->Delete(ns, std::span(keys).subspan(1, 1)).ok());
  EXPECT_EQ(d.stats().hbm_chunks, 3u);
  refs = client->FetchDeviceRefs(ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(refs->chunks.size(), 1u);
  // Nothing cached at all: no lease.
  const Prefix other = MakePrefix(rng, ns, 2);
  refs = client->FetchDeviceRefs(ns, client->Keys(ns, other.tokens));
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(refs->chunks.size(), 0u);
  EXPECT_EQ(refs->lease_id, 0u);
}

TEST(HbmServiceTest, WriteThroughPutsStoredChunksInHbmAtOnce) {
  testing::TempDir dir;
  InProcessDaemon d(dir.File("data"), 64 << 20, 16, "", {}, /*write_through=*/true);
  auto client = Connect(d.address());
  const RemoteNamespace ns = *client->RegisterNamespace(ReadAll(kMini), "mini", 64);
  std::mt19937_64 rng(testing::FreshSeed());
  const Prefix p = MakePrefix(rng, ns, 5);
  ASSERT_TRUE(client->Store(ns, std::nullopt, p.tokens, p.payloads).ok());
  EXPECT_EQ(d.stats().hbm_chunks, 5u);
  absl::StatusOr<DeviceRefs> refs = client->FetchDeviceRefs(ns, client->Keys(ns, p.tokens));
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(refs->chunks.size(), 5u);
  EXPECT_EQ(d.stats().hbm_hits, 5u) << "every chunk found in T0, none promoted";
  EXPECT_EQ(d.stats().hbm_promotions, 0u);
  EXPECT_EQ(ReadRefs(d.arena(), *refs), p.payloads);
}

TEST(HbmServiceTest, OnlyTrustedTenantsMayMapTheTier) {
  testing::TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b beta\n";
  InProcessDaemon d(dir.File("data"), 64 << 20, 4, dir.File("tokens"), {"acme"});
  auto a = Connect(d.address(), "tok-a"), b = Connect(d.address(), "tok-b");
  std::mt19937_64 rng(testing::FreshSeed());
  for (CacheClient* c : {a.get(), b.get()}) {
    const RemoteNamespace ns = *c->RegisterNamespace(ReadAll(kMini), "mini", 64);
    const Prefix p = MakePrefix(rng, ns, 1);
    ASSERT_TRUE(c->Store(ns, std::nullopt, p.tokens, p.payloads).ok());
    absl::StatusOr<DeviceRefs> refs = c->FetchDeviceRefs(ns, c->Keys(ns, p.tokens));
    if (c == a.get()) {
      ASSERT_TRUE(refs.ok()) << refs.status();
      EXPECT_EQ(refs->chunks.size(), 1u);
    } else {
      EXPECT_EQ(refs.status().code(), absl::StatusCode::kPermissionDenied) << refs.status();
    }
  }
}

}  // namespace
}  // namespace kvc::cachesvc
