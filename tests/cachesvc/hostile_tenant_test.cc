// Hostile tenants, round 3, on real kvcached processes (docs/security.md): every name a
// tenant or a peer supplies is bounded and so is a tenant's share of the registry; a
// registry that breaks a rule is refused at start naming the line; pins stay inside a
// tenant's limit and the tier's share, so a tenant inside its quota can always write; a
// Lookup names at most as many keys as any other call; Drain always takes the cluster
// credential.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "cachesvc/namespace_registry.h"
#include "client/prefix_hash.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "kvcache/v1/peer.grpc.pb.h"
#include "serve/local_cluster.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::TempDir;

constexpr uint64_t kPageBytes = 4096;

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

grpc::Status RegisterCallerKeyed(Daemon& d, const std::string& token, const std::string& model_id,
                                 uint32_t page_tokens, pb::RegisterNamespaceResponse* resp) {
  pb::RegisterNamespaceRequest req;
  req.set_model_id(model_id);
  req.set_key_mode(pb::KEY_MODE_CALLER);
  req.set_page_bytes(kPageBytes);
  req.set_chunk_tokens(page_tokens);
  return d.stub().RegisterNamespace(Ctx(token).get(), req, resp);
}

std::string RandomKey(std::mt19937_64& rng) {
  std::string k(16, '\0');
  for (char& c : k) c = static_cast<char>(rng());
  return k;
}

// Stores one durable page per key (random bytes); the call's status.
grpc::Status StorePages(Daemon& d, const std::string& token, uint32_t ns,
                        const std::vector<std::string>& keys, std::mt19937_64& rng) {
  auto ctx = Ctx(token);
  pb::StoreResponse resp;
  auto writer = d.stub().Store(ctx.get(), &resp);
  for (const std::string& key : keys) {
    pb::StoreRequest req;
    req.set_namespace_id(ns);
    req.set_chunk_key(key);
    std::string payload(kPageBytes, '\0');
    for (char& c : payload) c = static_cast<char>(rng());
    req.set_payload(payload);
    req.set_durability(pb::DURABILITY_DURABLE);
    if (!writer->Write(req)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

void ExpectRefused(const grpc::Status& s, grpc::StatusCode code, const std::string& says) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(says), std::string::npos)
      << "\"" << s.error_message() << "\" does not say \"" << says << "\"";
}

off_t FileBytes(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST(HostileTenantTest, ModelIdsAndEachTenantsShareOfTheRegistryAreBounded) {
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-m mallory\ntok-a alice\n";
  const std::string data = dir.File("data");
  Daemon d(data, {"--auth-tokens", dir.File("tokens"), "--max-registry-bytes-per-tenant", "4000"});
  pb::RegisterNamespaceResponse resp;
  // A 16 MB model_id is refused before anything is parsed or kept.
  ExpectRefused(RegisterCallerKeyed(d, "tok-m", std::string(16 << 20, 'x'), 64, &resp),
                grpc::StatusCode::INVALID_ARGUMENT,
                "model_id is 16777216 bytes; the limit is 256 (kvcached --max-name-bytes)");
  ExpectRefused(RegisterCallerKeyed(d, "tok-m", std::string(257, 'x'), 64, &resp),
                grpc::StatusCode::INVALID_ARGUMENT, "model_id is 257 bytes");
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-m", std::string(256, 'x'), 64, &resp).ok());
  EXPECT_LT(FileBytes(data + "/namespaces.jsonl"), 4000);
  // Distinct ids of 200 bytes until the tenant's share of the registry is taken.
  int registered = 1;
  grpc::Status last;
  for (int i = 0; i < 100 && last.ok(); ++i) {
    last = RegisterCallerKeyed(d, "tok-m", std::to_string(i) + std::string(200, 'y'), 64, &resp);
    registered += last.ok();
  }
  ExpectRefused(last, grpc::StatusCode::RESOURCE_EXHAUSTED, "tenant mallory's namespaces take");
  EXPECT_NE(last.error_message().find("--max-registry-bytes-per-tenant"), std::string::npos);
  std::printf("mallory registered %d namespaces within 4000 bytes\n", registered);
  EXPECT_GE(registered, 5);
  EXPECT_LE(registered, 10);
  EXPECT_LE(FileBytes(data + "/namespaces.jsonl"), 4000);
  // Another tenant is untouched by it, and the share holds across a restart.
  EXPECT_TRUE(RegisterCallerKeyed(d, "tok-a", "alice-model", 64, &resp).ok());
  d.Restart(SIGKILL);
  ExpectRefused(RegisterCallerKeyed(d, "tok-m", "after-restart" + std::string(200, 'y'), 64, &resp),
                grpc::StatusCode::RESOURCE_EXHAUSTED, "tenant mallory's namespaces take");
  EXPECT_TRUE(RegisterCallerKeyed(d, "tok-a", "alice-model-2", 64, &resp).ok());
}

// A registry line that breaks a rule stops the daemon at start, naming the line and the
// rule, instead of being taken silently (bob reading alice's pages) or aborting later.
TEST(HostileTenantTest, ARegistryThatBreaksARuleIsRefusedAtStartNamingTheLine) {
  const std::string line1 =
      R"({"id": 1, "tenant": "alice", "model_id": "m", "chunk_tokens": 64, "chunk_bytes": 4096, )"
      R"("vocab_size": 0, "root_key": "000102030405060708090a0b0c0d0e0f", "key_scope": 1, )"
      R"("key_mode": 1})";
  struct Case {
    std::string second_line;
    std::string says;
  } cases[] = {
      {R"({"id": 1, "tenant": "bob", "model_id": "m", "chunk_tokens": 64, "chunk_bytes": 4096, )"
       R"("vocab_size": 0, "root_key": "100102030405060708090a0b0c0d0e0f", "key_scope": 1, )"
       R"("key_mode": 1})",
       "namespaces.jsonl:2: storage id 1 is already"},
      {R"({"id": 2, "tenant": "bob", "model_id": "m", "chunk_tokens": 64, )"
       R"("chunk_bytes": 1099511627776, "vocab_size": 0, )"
       R"("root_key": "200102030405060708090a0b0c0d0e0f", "key_scope": 1, "key_mode": 1})",
       "namespaces.jsonl:2: chunk_bytes is 1099511627776"},
      {R"({"id": 2, "tenant": "bob", "model_id": ")" + std::string(300, 'z') +
           R"(", "chunk_tokens": 64, "chunk_bytes": 4096, "vocab_size": 0, )"
           R"("root_key": "300102030405060708090a0b0c0d0e0f", "key_scope": 1, "key_mode": 1})",
       "namespaces.jsonl:2: model_id is 300 bytes"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    const std::string data = dir.File("data");
    ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
    std::ofstream(data + "/namespaces.jsonl") << line1 << "\n" << c.second_line << "\n";
    // Bounded: a daemon that takes the registry would serve until the timeout ends it.
    const testing::ProcessResult r = testing::RunProgram(
        "/usr/bin/timeout", {"20", testing::kDaemon, "--data-dir", data, "--listen", "127.0.0.1:0",
                             "--ram-bytes", "4000000", "--ssd-bytes", "40000000"});
    EXPECT_EQ(r.exit_code, 1) << c.says;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
}

uint64_t SsdCapacityChunks(Daemon& d, const std::string& token) {
  pb::StatsResponse stats;
  EXPECT_TRUE(d.stub().Stats(Ctx(token).get(), {}, &stats).ok());
  return stats.ssd_capacity_chunks();
}

// A tenant without a quota pins every chunk it can: the tier's share for pins stops it, and
// a tenant inside its quota still stores durably (today's main: every durable write of the
// other tenant failed once the tier was pinned full).
TEST(HostileTenantTest, PinsNeverTakeMoreThanTheTiersShare) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-m mallory\ntok-a alice\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--default-pin-limit", "100000",
                              "--max-pinned-share", "0.5"});
  pb::RegisterNamespaceResponse nm, na;
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-m", "mallory-model", 16, &nm).ok());
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-a", "alice-model", 16, &na).ok());
  const uint64_t capacity = SsdCapacityChunks(d, "tok-m");
  ASSERT_GT(capacity, 20u);
  std::vector<std::string> mine;
  for (uint64_t i = 0; i < capacity; ++i) mine.push_back(RandomKey(rng));
  ASSERT_TRUE(StorePages(d, "tok-m", nm.namespace_id(), mine, rng).ok());
  pb::PinRequest pin;
  pin.set_namespace_id(nm.namespace_id());
  pin.set_ttl_seconds(UINT32_MAX);
  for (const std::string& k : mine) pin.add_chunk_keys(k);
  pb::PinResponse pinned;
  ExpectRefused(d.stub().Pin(Ctx("tok-m").get(), pin, &pinned),
                grpc::StatusCode::RESOURCE_EXHAUSTED, "tier's share for pinned chunks is taken");
  // What the refusal tells: the flag, never how full the tier is or who fills it.
  pb::StatsResponse stats;
  ASSERT_TRUE(d.stub().Stats(Ctx("tok-m").get(), {}, &stats).ok());
  ASSERT_TRUE(stats.has_quota());
  std::printf("mallory pinned %llu of %llu SSD slots\n",
              static_cast<unsigned long long>(stats.quota().pinned_chunks()),
              static_cast<unsigned long long>(capacity));
  EXPECT_LE(stats.quota().pinned_chunks(), capacity / 2);
  EXPECT_GE(stats.quota().pinned_chunks(), capacity / 2 - 2);
  // alice, far inside any quota, stores durably and finds what she stored.
  std::vector<std::string> hers;
  for (int i = 0; i < 20; ++i) hers.push_back(RandomKey(rng));
  ASSERT_TRUE(StorePages(d, "tok-a", na.namespace_id(), hers, rng).ok());
  pb::LookupRequest look;
  look.set_namespace_id(na.namespace_id());
  for (const std::string& k : hers) look.mutable_packed_chunk_keys()->append(k);
  look.set_every_chunk(true);
  pb::LookupResponse found;
  ASSERT_TRUE(d.stub().Lookup(Ctx("tok-a").get(), look, &found).ok());
  EXPECT_EQ(found.matched_chunks(), hers.size());
}

// An operator lists and removes any tenant's pins (kvctl pins / unpin --tenant, with an
// admin token); a tenant cannot do either for another.
TEST(HostileTenantTest, AnOperatorListsAndRemovesATenantsPins) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-m mallory\ntok-a alice\ntok-o ops\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--admin-tenants", "ops"});
  pb::RegisterNamespaceResponse nm;
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-m", "mallory-model", 16, &nm).ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back(RandomKey(rng));
  ASSERT_TRUE(StorePages(d, "tok-m", nm.namespace_id(), keys, rng).ok());
  pb::PinRequest pin;
  pin.set_namespace_id(nm.namespace_id());
  pin.set_ttl_seconds(UINT32_MAX);
  for (const std::string& k : keys) pin.add_chunk_keys(k);
  pb::PinResponse pinned;
  ASSERT_TRUE(d.stub().Pin(Ctx("tok-m").get(), pin, &pinned).ok());
  ASSERT_EQ(pinned.pinned(), 10u);
  const std::string kvctl = std::string(KVC_BIN_DIR) + "/kvctl";
  const auto run = [&](const std::string& token, std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", d.address(), "--token", token});
    return testing::RunProgram(kvctl, args);
  };
  testing::ProcessResult listed = run("tok-o", {"pins", "--tenant", "mallory"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("tenant mallory has 10 pinned chunks"), std::string::npos)
      << listed.out;
  storage::ChunkKey first;
  std::memcpy(first.bytes.data(), keys[0].data(), 16);
  EXPECT_NE(listed.out.find(first.Hex()), std::string::npos) << "the tenant's own key is listed";
  for (const char* cmd : {"pins", "unpin"}) {
    const testing::ProcessResult refused = run("tok-a", {cmd, "--tenant", "mallory"});
    EXPECT_EQ(refused.exit_code, 1) << cmd;
    EXPECT_NE(refused.err.find("may not see or change another tenant's pins"), std::string::npos)
        << refused.err;
  }
  const testing::ProcessResult unpinned = run("tok-o", {"unpin", "--tenant", "mallory"});
  ASSERT_EQ(unpinned.exit_code, 0) << unpinned.err;
  EXPECT_NE(unpinned.out.find("unpinned 10 chunks of tenant mallory"), std::string::npos)
      << unpinned.out;
  pb::StatsResponse stats;
  ASSERT_TRUE(d.stub().Stats(Ctx("tok-m").get(), {}, &stats).ok());
  EXPECT_EQ(stats.quota().pinned_chunks(), 0u);
  listed = run("tok-o", {"pins", "--tenant", "mallory"});
  EXPECT_NE(listed.out.find("tenant mallory has 0 pinned chunks"), std::string::npos) << listed.out;
}

// Every tenant has a pin limit, a default when no quota names one.
TEST(HostileTenantTest, ATenantWithoutAQuotaHasTheDefaultPinLimit) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-b bob\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--default-pin-limit", "5"});
  pb::RegisterNamespaceResponse nb;
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-b", "bob-model", 16, &nb).ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(RandomKey(rng));
  ASSERT_TRUE(StorePages(d, "tok-b", nb.namespace_id(), keys, rng).ok());
  pb::PinRequest pin;
  pin.set_namespace_id(nb.namespace_id());
  pin.set_ttl_seconds(3600);
  for (int i = 0; i < 5; ++i) pin.add_chunk_keys(keys[i]);
  pb::PinResponse pinned;
  ASSERT_TRUE(d.stub().Pin(Ctx("tok-b").get(), pin, &pinned).ok());
  EXPECT_EQ(pinned.pinned(), 5u);
  pin.clear_chunk_keys();
  pin.add_chunk_keys(keys[5]);
  ExpectRefused(d.stub().Pin(Ctx("tok-b").get(), pin, &pinned),
                grpc::StatusCode::RESOURCE_EXHAUSTED, "tenant bob may pin 5 chunks");
}

// A caller-keyed namespace that does not say its page size gets the same key limit per
// Lookup as every other call (today's main took 1.3 M keys in one Lookup of such a one).
TEST(HostileTenantTest, ALookupNamesAtMostAsManyKeysAsAnyCall) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  pb::RegisterNamespaceResponse ns;
  ASSERT_TRUE(RegisterCallerKeyed(d, "", "no-page-tokens", 0, &ns).ok());
  const auto lookup = [&](size_t n) {
    pb::LookupRequest look;
    look.set_namespace_id(ns.namespace_id());
    std::string& packed = *look.mutable_packed_chunk_keys();
    packed.resize(16 * n);
    for (char& c : packed) c = static_cast<char>(rng());
    pb::LookupResponse resp;
    return d.stub().Lookup(Ctx("").get(), look, &resp);
  };
  EXPECT_TRUE(lookup(65536).ok());
  ExpectRefused(lookup(65537), grpc::StatusCode::INVALID_ARGUMENT, "65536");
  ExpectRefused(lookup(200000), grpc::StatusCode::INVALID_ARGUMENT, "65536");
}

// Each tenant's Lookups are charged their keys against --lookup-keys-per-second: past its
// burst a flooding tenant's calls wait for their cost at that rate (they cannot keep the
// cores busy), past the wait bound they are refused naming the budget, and another tenant
// is served at once meanwhile (today's main: six 65,536-key calls take ~50 ms, none waits).
TEST(HostileTenantTest, ATenantsLookupsArePacedByWhatTheyCostAndNoOtherTenantWaits) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-f flood\ntok-q quiet\n";
  constexpr double kRate = 200000;  // keys/s; the burst is one 65,536-key call
  Daemon d(dir.File("data"),
           {"--auth-tokens", dir.File("tokens"), "--lookup-keys-per-second", absl::StrCat(kRate)});
  pb::RegisterNamespaceResponse nf, nq;
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-f", "flood-model", 0, &nf).ok());
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-q", "quiet-model", 16, &nq).ok());
  const auto lookup = [&](const std::string& token, uint32_t ns, size_t n) {
    pb::LookupRequest look;
    look.set_namespace_id(ns);
    std::string& packed = *look.mutable_packed_chunk_keys();
    packed.resize(16 * n);
    for (char& c : packed) c = static_cast<char>(rng());
    pb::LookupResponse resp;
    return d.stub().Lookup(Ctx(token).get(), look, &resp);
  };
  // Six calls one after another: the first two run at once (the burst), each later one
  // waits for its 65,537 keys at the rate — at least 4 × 0.328 s in all.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(lookup("tok-f", nf.namespace_id(), 65536).ok());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("six 65,536-key Lookups at %.0f keys/s took %.2f s\n", kRate, took);
  EXPECT_GE(took, 4 * 65537 / kRate * 0.98);
  // Eight at once: those that would wait past a second are refused, naming the budget.
  std::vector<std::thread> flood;
  std::atomic<int> refused{0};
  std::string refusal;
  Mutex refusal_mu;
  for (int i = 0; i < 8; ++i) {
    flood.emplace_back([&, key_seed = rng()] {
      pb::LookupRequest look;
      look.set_namespace_id(nf.namespace_id());
      std::mt19937_64 r(key_seed);
      std::string& packed = *look.mutable_packed_chunk_keys();
      packed.resize(16 * 65536);
      for (char& c : packed) c = static_cast<char>(r());
      pb::LookupResponse resp;
      grpc::Status s = d.stub().Lookup(Ctx("tok-f").get(), look, &resp);
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++refused;
        MutexLock lk(refusal_mu);
        refusal = s.error_message();
      }
    });
  }
  // Meanwhile the quiet tenant's call is neither held nor refused.
  const auto quiet_start = std::chrono::steady_clock::now();
  EXPECT_TRUE(lookup("tok-q", nq.namespace_id(), 1).ok());
  const double quiet_took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - quiet_start).count();
  for (std::thread& t : flood) t.join();
  std::printf("quiet's one-key Lookup under the flood: %.3f s; %d of 8 flood calls refused\n",
              quiet_took, refused.load());
  EXPECT_LT(quiet_took, 4 * 65537 / kRate);  // far less than the flood's own waits
  EXPECT_GE(refused.load(), 1);
  EXPECT_NE(refusal.find("tenant flood is past its Lookup budget of 200000 keys/s"),
            std::string::npos)
      << refusal;
}

// A miss names the caller's key, never the key storage holds the chunk under (internal:
// bound to the namespace).
TEST(HostileTenantTest, AFetchMissNamesTheCallersKeyNotTheStoredOne) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  pb::RegisterNamespaceResponse ns;
  ASSERT_TRUE(RegisterCallerKeyed(d, "", "misses", 16, &ns).ok());
  const std::string key = RandomKey(rng);
  pb::FetchRequest fetch;
  fetch.set_namespace_id(ns.namespace_id());
  fetch.add_chunk_keys(key);
  auto ctx = Ctx("");
  auto reader = d.stub().Fetch(ctx.get(), fetch);
  pb::FetchResponse got;
  EXPECT_FALSE(reader->Read(&got));
  const grpc::Status s = reader->Finish();
  storage::ChunkKey k, root;
  std::memcpy(k.bytes.data(), key.data(), 16);
  std::memcpy(root.bytes.data(), ns.root_key().data(), 16);
  ExpectRefused(s, grpc::StatusCode::NOT_FOUND,
                "chunk_keys[0]: chunk " + k.Hex() + " is not cached");
  EXPECT_EQ(s.error_message().find(client::BoundChunkKeyV2(root, k).Hex()), std::string::npos)
      << s.error_message();
}

// A cluster node without tenants takes Holds and Replicate without a credential (every
// namespace is "default"'s), but never Drain, which ends the node; and a peer's names are
// bounded as a tenant's are.
TEST(HostileTenantTest, DrainAlwaysTakesTheClusterCredentialAndPeerNamesAreBounded) {
  TempDir dir;
  serve::EtcdProcess etcd(dir.File("etcd"));
  ASSERT_TRUE(etcd.Start().ok());
  Daemon d(dir.File("node"), {"--cluster", etcd.url(), "--node-id", "n0"});
  auto peer = pb::ClusterPeer::NewStub(
      grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  pb::DrainResponse drained;
  ExpectRefused(peer->Drain(Ctx("").get(), {}, &drained), grpc::StatusCode::PERMISSION_DENIED,
                "Drain takes the cluster credential");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  pb::StatsResponse stats;
  EXPECT_TRUE(d.stub().Stats(Ctx("").get(), {}, &stats).ok()) << "the node left after a Drain";
  EXPECT_EQ(kill(d.pid(), 0), 0);
  // A peer namespace with a 1 MB model_id is refused, naming the field.
  pb::HoldsRequest holds;
  holds.mutable_ns()->set_tenant("default");
  holds.mutable_ns()->set_model_id(std::string(1 << 20, 'x'));
  holds.mutable_ns()->set_root_key(std::string(16, '\x01'));
  holds.mutable_ns()->set_chunk_bytes(kPageBytes);
  holds.set_packed_chunk_keys(std::string(16, '\x02'));
  pb::HoldsResponse held;
  ExpectRefused(peer->Holds(Ctx("").get(), holds, &held), grpc::StatusCode::INVALID_ARGUMENT,
                "peer namespace: model_id is 1048576 bytes");
  // Bytes that are no request are the caller's mistake, named (not UNIMPLEMENTED).
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  for (const char* method : {"Holds", "Replicate"}) {
    const std::string path = std::string("/kvcache.v1.ClusterPeer/") + method;
    const grpc::internal::RpcMethod m(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel);
    grpc::Slice slice(std::string("\xff\xff\xff\xff\x0f", 5));
    grpc::ByteBuffer request(&slice, 1), response;
    ExpectRefused(grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
                      channel.get(), m, Ctx("").get(), request, &response),
                  grpc::StatusCode::INVALID_ARGUMENT, "does not parse");
  }
}

// Two model_ids, one of alice's and one of mallory's, whose caller-keyed namespaces derive
// the same cluster id (found by the birthday bound over 2 × 2^17 names: ~16 pairs expected).
std::pair<std::string, std::string> CollidingModelIds() {
  constexpr uint32_t kNames = 1 << 17;
  std::unordered_map<uint32_t, uint32_t> alice;
  const auto id_of = [](const std::string& tenant, const std::string& model) {
    return DerivedNamespaceId(tenant, client::CallerNamespaceRoot(tenant, model, kPageBytes, 16));
  };
  for (uint32_t i = 0; i < kNames; ++i) alice[id_of("alice", "a-" + std::to_string(i))] = i;
  for (uint32_t j = 0; j < kNames; ++j) {
    const std::string m = "m-" + std::to_string(j);
    if (auto it = alice.find(id_of("mallory", m)); it != alice.end()) {
      return {"a-" + std::to_string(it->second), m};
    }
  }
  return {};
}

// A cluster namespace id is derived from public facts, so another tenant can find one that
// equals alice's. Ids are scoped per tenant: mallory registering it first changes nothing
// for alice — she registers, stores and reads her own pages (today's main: ALREADY_EXISTS,
// "already taken", which also told mallory alice uses that model).
TEST(HostileTenantTest, AnotherTenantsNamespaceOnTheSameClusterIdChangesNothing) {
  std::mt19937_64 rng(testing::FreshSeed());
  const auto [alice_model, mallory_model] = CollidingModelIds();
  ASSERT_FALSE(alice_model.empty()) << "no two names derive one id";
  std::printf("alice's %s and mallory's %s derive one namespace id\n", alice_model.c_str(),
              mallory_model.c_str());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-m mallory\ntok-a alice\n";
  serve::EtcdProcess etcd(dir.File("etcd"));
  ASSERT_TRUE(etcd.Start().ok());
  Daemon d(dir.File("node"),
           {"--cluster", etcd.url(), "--node-id", "n0", "--auth-tokens", dir.File("tokens")});
  pb::RegisterNamespaceResponse nm, na;
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-m", mallory_model, 16, &nm).ok());
  const grpc::Status registered = RegisterCallerKeyed(d, "tok-a", alice_model, 16, &na);
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  EXPECT_EQ(na.namespace_id(), nm.namespace_id()) << "the names were chosen to collide";
  // Each stores a page under one key; each reads back its own bytes.
  const std::string key = RandomKey(rng);
  std::mt19937_64 rng_m(rng()), rng_a(rng());
  ASSERT_TRUE(StorePages(d, "tok-m", nm.namespace_id(), {key}, rng_m).ok());
  const std::mt19937_64 alice_bytes = rng_a;
  ASSERT_TRUE(StorePages(d, "tok-a", na.namespace_id(), {key}, rng_a).ok());
  pb::FetchRequest fetch;
  fetch.set_namespace_id(na.namespace_id());
  fetch.add_chunk_keys(key);
  auto ctx = Ctx("tok-a");
  auto reader = d.stub().Fetch(ctx.get(), fetch);
  pb::FetchResponse got;
  ASSERT_TRUE(reader->Read(&got));
  EXPECT_TRUE(reader->Finish().ok());
  std::mt19937_64 expect = alice_bytes;
  std::string want(kPageBytes, '\0');
  for (char& c : want) c = static_cast<char>(expect());
  EXPECT_EQ(got.payload(), want) << "alice read bytes that are not hers";
  // And a second registration of alice's is the same namespace, not a collision.
  ASSERT_TRUE(RegisterCallerKeyed(d, "tok-a", alice_model, 16, &na).ok());
  EXPECT_EQ(na.namespace_id(), nm.namespace_id());
}

}  // namespace
}  // namespace kvc::cachesvc
