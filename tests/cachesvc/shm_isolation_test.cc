// The shared-memory path against a hostile co-located tenant, on the real daemon: a
// tenant's mapping holds its own chunks and nobody else's, no fd it is handed can write
// them, only tenants given shared memory may lease, and one tenant's leases never starve
// another's.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <algorithm>
#include <fstream>
#include <random>

#include "cachesvc/arena_socket.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/cachesvc/daemon.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"
#include "wire/arena_handshake.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::client::CacheClient;
using ::kvc::client::ClientOptions;
using ::kvc::client::RemoteNamespace;

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::MakePrefix;
using ::kvc::testing::Prefix;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

const std::string& MiniConfig() {
  static const std::string text = ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  return text;
}

std::unique_ptr<CacheClient> ConnectAs(const Daemon& d, const std::string& token,
                                       const std::string& socket) {
  ClientOptions o;
  o.address = d.address();
  o.bearer_token = token;
  o.shm_socket = socket;
  absl::StatusOr<std::unique_ptr<CacheClient>> c = CacheClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Whether any 64-byte run starting a chunk of `payloads` occurs in `arena`.
size_t ChunksFoundIn(const std::vector<uint8_t>& arena, const std::vector<uint8_t>& payloads,
                     uint64_t chunk_bytes) {
  size_t found = 0;
  for (uint64_t at = 0; at < payloads.size(); at += chunk_bytes) {
    const auto needle = payloads.begin() + static_cast<ptrdiff_t>(at);
    if (std::search(arena.begin(), arena.end(), needle, needle + 64) != arena.end()) ++found;
  }
  return found;
}

TEST(SharedMemoryIsolationTest, ATenantMapsOnlyItsOwnChunksAndCannotWriteThem) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b globex\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--shm-tenants", "acme,globex"});
  const std::string socket = dir.File("data") + "/kvcached.sock";
  std::unique_ptr<CacheClient> a = ConnectAs(d, "tok-a", socket), b = ConnectAs(d, "tok-b", socket);
  ASSERT_TRUE(a->shared_memory()) << a->shared_memory_error();
  ASSERT_TRUE(b->shared_memory()) << b->shared_memory_error();
  const RemoteNamespace ns_a = *a->RegisterNamespace(MiniConfig(), "mini", 64);
  const RemoteNamespace ns_b = *b->RegisterNamespace(MiniConfig(), "mini", 64);
  const Prefix pa = MakePrefix(rng, ns_a, 3), pb_ = MakePrefix(rng, ns_b, 3);
  ASSERT_TRUE(a->Store(ns_a, std::nullopt, pa.tokens, pa.payloads).ok());
  ASSERT_TRUE(b->Store(ns_b, std::nullopt, pb_.tokens, pb_.payloads).ok());
  std::vector<uint8_t> out(pa.payloads.size());
  ASSERT_EQ(*a->Fetch(ns_a, a->Keys(ns_a, pa.tokens), out), 3u);  // from a's mapping
  ASSERT_EQ(out, pa.payloads);
  ASSERT_EQ(*b->Fetch(ns_b, b->Keys(ns_b, pb_.tokens), out), 3u);
  ASSERT_EQ(out, pb_.payloads);

  // Everything acme can see through the fd it is handed: its chunks, none of globex's.
  absl::StatusOr<wire::ReceivedArena> got = wire::ReceiveArenaFd(socket, "tok-a");
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<uint8_t> arena(got->bytes);
  ASSERT_EQ(pread(got->fd, arena.data(), arena.size(), 0), static_cast<ssize_t>(arena.size()));
  EXPECT_EQ(ChunksFoundIn(arena, pa.payloads, ns_a.chunk_bytes), 3u);
  EXPECT_EQ(ChunksFoundIn(arena, pb_.payloads, ns_b.chunk_bytes), 0u)
      << "acme's mapping shows globex's chunks";

  // Nothing acme does with that fd writes the arena.
  EXPECT_EQ(mmap(nullptr, got->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, got->fd, 0), MAP_FAILED);
  const std::string self = "/proc/self/fd/" + std::to_string(got->fd);
  const int rw = open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    EXPECT_EQ(mmap(nullptr, got->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    std::vector<uint8_t> junk(got->bytes, 0xEE);
    EXPECT_LT(pwrite(rw, junk.data(), junk.size(), 0), 0);
    EXPECT_NE(ftruncate(rw, 0), 0);
    close(rw);
  }
  close(got->fd);

  // Both tenants read back exactly what they stored, over gRPC and over shared memory.
  ClientOptions plain;
  plain.address = d.address();
  plain.bearer_token = "tok-a";
  std::unique_ptr<CacheClient> a_grpc = *CacheClient::Connect(plain);
  ASSERT_EQ(*a_grpc->Fetch(ns_a, a->Keys(ns_a, pa.tokens), out), 3u);
  EXPECT_EQ(out, pa.payloads);
  plain.bearer_token = "tok-b";
  std::unique_ptr<CacheClient> b_grpc = *CacheClient::Connect(plain);
  ASSERT_EQ(*b_grpc->Fetch(ns_b, b->Keys(ns_b, pb_.tokens), out), 3u);
  EXPECT_EQ(out, pb_.payloads);
  ASSERT_EQ(*b->Fetch(ns_b, b->Keys(ns_b, pb_.tokens), out), 3u);
  EXPECT_EQ(out, pb_.payloads);
}

class RawCaller {
 public:
  RawCaller(const Daemon& d, std::string token)
      : stub_(pb::KVCache::NewStub(
            grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()))),
        token_(std::move(token)) {}
  grpc::Status FetchRefs(uint32_t ns, const std::vector<storage::ChunkKey>& keys,
                         pb::FetchRefsResponse* resp) {
    pb::FetchRefsRequest req;
    req.set_namespace_id(ns);
    for (const storage::ChunkKey& k : keys)
      req.add_chunk_keys(std::string(reinterpret_cast<const char*>(k.bytes.data()), 16));
    return stub_->FetchRefs(Ctx().get(), req, resp);
  }
  grpc::Status Release(uint64_t lease) {
    pb::ReleaseRefsRequest req;
    req.set_lease_id(lease);
    pb::ReleaseRefsResponse resp;
    return stub_->ReleaseRefs(Ctx().get(), req, &resp);
  }

 private:
  std::unique_ptr<grpc::ClientContext> Ctx() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    ctx->AddMetadata("authorization", "Bearer " + token_);
    return ctx;
  }
  std::unique_ptr<pb::KVCache::Stub> stub_;
  std::string token_;
};

TEST(SharedMemoryIsolationTest, OnlyShmTenantsLeaseAndEachWithinItsOwnLimit) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b globex\ntok-c initech\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--shm-tenants", "acme,initech",
                              "--max-leases-per-tenant", "3"});
  struct Tenant {
    std::string token;
    RemoteNamespace ns;
    std::vector<storage::ChunkKey> keys;
  };
  std::vector<Tenant> t;
  for (const char* token : {"tok-a", "tok-b", "tok-c"}) {
    std::unique_ptr<CacheClient> c = ConnectAs(d, token, "");
    const RemoteNamespace ns = *c->RegisterNamespace(MiniConfig(), "mini", 64);
    const Prefix p = MakePrefix(rng, ns, 2);
    ASSERT_TRUE(c->Store(ns, std::nullopt, p.tokens, p.payloads).ok());
    t.push_back({token, ns, c->Keys(ns, p.tokens)});
  }
  RawCaller acme(d, "tok-a"), globex(d, "tok-b"), initech(d, "tok-c");
  pb::FetchRefsResponse resp;
  // A tenant not given shared memory gets no lease at all.
  grpc::Status s = globex.FetchRefs(t[1].ns.id, t[1].keys, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(resp.refs_size(), 0);
  // acme up to its limit, then refused by name…
  std::vector<uint64_t> leases;
  for (int i = 0; i < 3; ++i) {
    resp.Clear();
    s = acme.FetchRefs(t[0].ns.id, t[0].keys, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.refs_size(), 2);
    leases.push_back(resp.lease_id());
  }
  resp.Clear();
  s = acme.FetchRefs(t[0].ns.id, t[0].keys, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("acme"), std::string::npos) << s.error_message();
  // …while initech still gets its own.
  resp.Clear();
  s = initech.FetchRefs(t[2].ns.id, t[2].keys, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.refs_size(), 2);
  // A released lease makes room again; a foreign one cannot be released.
  EXPECT_EQ(initech.Release(leases[0]).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(acme.Release(leases[0]).ok());
  resp.Clear();
  EXPECT_TRUE(acme.FetchRefs(t[0].ns.id, t[0].keys, &resp).ok());
}

}  // namespace
}  // namespace kvc::cachesvc
