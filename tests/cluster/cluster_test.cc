// The cluster on real processes: etcd from Debian and three kvcached nodes on loopback,
// each with its own data folder. A prefix stored through one cluster client is found and
// fetched byte-exact by another and sits on exactly its ranked owners, node by node; a
// node killed during fetches is routed around (R = 2) or shortens the prefix (R = 1)
// and serves again after a restart; with etcd stopped nodes keep serving and clients say
// their membership is stale; tenants stay apart.
#include "client/cluster_client.h"
#include "client/stats.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "serve/local_cluster.h"
#include "tests/cachesvc/daemon.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/wait_for.h"

namespace kvc::client {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::serve::EtcdProcess;
using ::kvc::testing::Daemon;
using ::kvc::testing::MakePrefix;
using ::kvc::testing::Prefix;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;
using storage::ChunkKey;
using Clock = std::chrono::steady_clock;

constexpr char kTokenA[] = "token-of-alice";
constexpr char kTokenB[] = "token-of-bob";

using ::kvc::testing::WaitFor;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
    std::ofstream(dir_.File("tokens")) << kTokenA << " alice\n" << kTokenB << " bob\n";
    etcd_ = std::make_unique<EtcdProcess>(dir_.File("etcd"));
    ASSERT_TRUE(etcd_->Start().ok());
    for (int i = 0; i < 3; ++i) {
      nodes_.push_back(std::make_unique<Daemon>(
          dir_.File("node" + std::to_string(i)),
          std::vector<std::string>{"--cluster", etcd_->url(), "--node-id", NodeId(i),
                                   "--cluster-lease-seconds", "2", "--auth-tokens",
                                   dir_.File("tokens")}));
    }
    client_ = Connect(kTokenA, 2);
    config_ = ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
    absl::StatusOr<RemoteNamespace> ns = client_->RegisterNamespace(config_, "mini", 64);
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  static std::string NodeId(int i) { return "n" + std::to_string(i); }

  std::unique_ptr<ClusterClient> Connect(const std::string& token, uint32_t replicas,
                                         int repair_grace_ms = 30000,
                                         uint32_t lookup_extra_nodes = 2) {
    ClientOptions o;
    o.repair_grace_ms = repair_grace_ms;
    o.lookup_extra_nodes = lookup_extra_nodes;
    o.address = etcd_->url();
    o.bearer_token = token;
    o.timeout_ms = 5000;
    o.replicas = replicas;
    absl::StatusOr<std::unique_ptr<ClusterClient>> c = ClusterClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE(WaitFor([&] { return (*c)->membership()->nodes.size() == nodes_.size(); }, 10))
        << "the client sees " << (*c)->membership()->nodes.size() << " nodes";
    return *std::move(c);
  }

  // A direct client of node i (no cluster routing), to look at what it holds.
  std::unique_ptr<CacheClient> Direct(int i) {
    ClientOptions o;
    o.address = nodes_[i]->address();
    o.bearer_token = kTokenA;
    return *CacheClient::Connect(o);
  }

  void ExpectFetchExact(ClusterClient& c, const Prefix& p, size_t expect_chunks) {
    const std::vector<ChunkKey> keys = c.Keys(ns_, p.tokens);
    std::vector<uint8_t> out(keys.size() * ns_.chunk_bytes);
    std::string why;
    absl::StatusOr<size_t> n = c.Fetch(ns_, keys, out, &why);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, expect_chunks) << why;
    const size_t bytes = std::min(*n, expect_chunks) * ns_.chunk_bytes;
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + bytes, p.payloads.begin()))
        << "fetched bytes differ from the stored ones";
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  TempDir dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<Daemon>> nodes_;
  std::unique_ptr<ClusterClient> client_;
  std::string config_;
  RemoteNamespace ns_;
};

TEST_F(ClusterTest, PrefixSitsOnItsRankedOwnersAndAnotherClientFetchesIt) {
  const Prefix p = MakePrefix(rng_, ns_, 64);
  absl::StatusOr<StoreResult> st = client_->Store(ns_, std::nullopt, p.tokens, p.payloads);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->stored, 64u * 2) << "R = 2: two copies of each chunk";

  std::unique_ptr<ClusterClient> other = Connect(kTokenA, 2);
  absl::StatusOr<RemoteNamespace> ns2 = other->RegisterNamespace(config_, "mini", 64);
  ASSERT_TRUE(ns2.ok()) << ns2.status();
  EXPECT_EQ(ns2->id, ns_.id) << "the same namespace has the same id on every node";
  absl::StatusOr<LookupResult> look = other->Lookup(ns_, p.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, 64u);
  ExpectFetchExact(*other, p, 64);

  // Node by node: chunk c is on node i exactly when i is one of its two ranked owners.
  std::vector<std::vector<client::Tier>> held(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    absl::StatusOr<LookupResult> l = Direct(i)->LookupEvery(ns_, p.tokens);
    ASSERT_TRUE(l.ok()) << l.status();
    held[i] = l->tiers;
  }
  int misplaced = 0;
  std::set<std::string> serving;
  for (size_t c = 0; c < 64; ++c) {
    const std::vector<std::string> owners = client_->Owners(look->keys[c]);
    ASSERT_EQ(owners.size(), 2u);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const bool owner = std::find(owners.begin(), owners.end(), NodeId(i)) != owners.end();
      if (owner != (held[i][c] != client::Tier::kNone)) ++misplaced;
    }
    EXPECT_EQ(look->nodes[c], owners[0]) << "chunk " << c << " is served by its first owner";
    serving.insert(look->nodes[c]);
  }
  EXPECT_EQ(misplaced, 0);
  EXPECT_EQ(serving.size(), nodes_.size()) << "a 64-chunk prefix streams from every node";
  const ClusterClient::Counters counters = other->counters();
  uint64_t fetched = 0;
  for (const auto& [id, n] : counters.nodes) fetched += n.chunks_fetched;
  EXPECT_EQ(fetched, 64u);
}

TEST_F(ClusterTest, ASettledClusterIsAskedOnlyByEachChunksRankedNodes) {
  const Prefix p = MakePrefix(rng_, ns_, 16);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());  // R = 2
  // Settled (no grace to wait out), R = 1 and no extra nodes: each chunk is asked of its
  // first owner alone, which holds it.
  std::unique_ptr<ClusterClient> narrow = Connect(kTokenA, 1, /*repair_grace_ms=*/0, 0);
  ASSERT_TRUE(narrow->RegisterNamespace(config_, "mini", 64).ok());
  absl::StatusOr<LookupResult> look = narrow->Lookup(ns_, p.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, 16u);
  ClusterClient::Counters c = narrow->counters();
  EXPECT_EQ(c.lookups, 1u);
  EXPECT_EQ(c.wide_lookups, 0u);
  EXPECT_EQ(c.lookup_keys_asked, 16u) << "one node per chunk";
  for (size_t k = 0; k < 16; ++k) EXPECT_EQ(look->nodes[k], narrow->Owners(look->keys[k])[0]);
  ExpectFetchExact(*narrow, p, 16);
  // A client within the grace period after it saw the membership asks every member.
  std::unique_ptr<ClusterClient> unsettled = Connect(kTokenA, 1, /*repair_grace_ms=*/60000, 0);
  ASSERT_TRUE(unsettled->RegisterNamespace(config_, "mini", 64).ok());
  look = unsettled->Lookup(ns_, p.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, 16u);
  c = unsettled->counters();
  EXPECT_EQ(c.wide_lookups, 1u);
  EXPECT_EQ(c.lookup_keys_asked, 16u * nodes_.size());
}

TEST_F(ClusterTest, KilledNodeIsRoutedAroundAndServesAgainAfterRestart) {
  const Prefix two = MakePrefix(rng_, ns_, 64);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, two.tokens, two.payloads).ok());
  std::unique_ptr<ClusterClient> single = Connect(kTokenA, 1);
  ASSERT_TRUE(single->RegisterNamespace(config_, "mini", 64).ok());
  const Prefix one = MakePrefix(rng_, ns_, 64);
  absl::StatusOr<StoreResult> st1 = single->Store(ns_, std::nullopt, one.tokens, one.payloads);
  ASSERT_TRUE(st1.ok()) << st1.status();
  EXPECT_EQ(st1->stored, 64u) << "R = 1: one copy each";
  // With R = 1 the prefix ends at the first chunk owned by the node about to die.
  const std::vector<ChunkKey> one_keys = single->Keys(ns_, one.tokens);
  size_t first_on_victim = one_keys.size();
  for (size_t c = 0; c < one_keys.size() && first_on_victim == one_keys.size(); ++c) {
    if (single->Owners(one_keys[c])[0] == NodeId(1)) first_on_victim = c;
  }
  ASSERT_LT(first_on_victim, one_keys.size()) << "seed " << seed_;

  // Fetch in a loop while node 1 is killed: every fetch is whole and byte-exact.
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA, 2);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  std::atomic<bool> stop{false}, killed{false};
  std::atomic<int> fetches{0}, after_kill{0}, bad{0};
  std::thread loop([&] {
    const std::vector<ChunkKey> keys = reader->Keys(ns_, two.tokens);
    std::vector<uint8_t> out(keys.size() * ns_.chunk_bytes);
    while (!stop) {
      const bool was_killed = killed;
      absl::StatusOr<size_t> n = reader->Fetch(ns_, keys, out);
      if (!n.ok() || *n != keys.size() || out != two.payloads) ++bad;
      ++fetches;
      if (was_killed) ++after_kill;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  nodes_[1]->Stop(SIGKILL);
  killed = true;
  ASSERT_TRUE(WaitFor([&] { return after_kill >= 5; }, 20));
  stop = true;
  loop.join();
  EXPECT_EQ(bad, 0) << "of " << fetches << " fetches, " << after_kill << " after the kill";
  EXPECT_GT(reader->counters().fetch_failovers + reader->counters().nodes["n1"].failures, 0u)
      << "the dead node was asked and skipped";

  // R = 1: the lookup reports the shorter prefix and the fetch stops there, bytes right.
  absl::StatusOr<LookupResult> look = single->Lookup(ns_, one.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, first_on_victim);
  ExpectFetchExact(*single, one, first_on_victim);

  // The node drops out of the membership when its lease expires, and comes back.
  EXPECT_TRUE(WaitFor([&] { return single->membership()->nodes.size() == 2; }, 10));
  nodes_[1]->Start();
  ASSERT_TRUE(WaitFor([&] { return single->membership()->nodes.size() == 3; }, 10));
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<LookupResult> l = single->Lookup(ns_, one.tokens);
        return l.ok() && l->matched_chunks == 64;
      },
      10))
      << "the restarted node serves its SSD chunks again";
  ExpectFetchExact(*single, one, 64);
}

TEST_F(ClusterTest, ChunksOfANodeGoneLongerThanTheGraceAreCopiedBackToTwo) {
  const Prefix p = MakePrefix(rng_, ns_, 48);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA, 2, /*repair_grace_ms=*/300);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  nodes_[1]->Stop(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return reader->membership()->nodes.size() == 2; }, 10));
  // Two nodes left and R = 2: once repaired, each holds every chunk.
  const auto copies_on = [&](int i) {
    absl::StatusOr<LookupResult> l = Direct(i)->LookupEvery(ns_, p.tokens);
    return l.ok() ? std::count_if(l->tiers.begin(), l->tiers.end(),
                                  [](client::Tier t) { return t != client::Tier::kNone; })
                  : -1;
  };
  EXPECT_LT(copies_on(0) + copies_on(2), 96) << "n1 held some chunks";
  EXPECT_TRUE(WaitFor(
      [&] {
        EXPECT_TRUE(reader->Lookup(ns_, p.tokens).ok());  // reads find and repair
        return copies_on(0) == 48 && copies_on(2) == 48;
      },
      15));
  EXPECT_GT(reader->counters().chunks_repaired, 0u);
  nodes_[0]->Stop(SIGKILL);  // the repaired copies serve alone
  ExpectFetchExact(*reader, p, 48);
}

TEST_F(ClusterTest, AJoiningNodeTakesNewWritesAndOldChunksAreStillFound) {
  const Prefix before = MakePrefix(rng_, ns_, 48);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, before.tokens, before.payloads).ok());
  nodes_.push_back(std::make_unique<Daemon>(
      dir_.File("node3"), std::vector<std::string>{"--cluster", etcd_->url(), "--node-id", "n3",
                                                   "--cluster-lease-seconds", "2", "--auth-tokens",
                                                   dir_.File("tokens")}));
  ASSERT_TRUE(WaitFor([&] { return client_->membership()->nodes.size() == 4; }, 10));
  // Chunks whose owners changed are found along the ranking, on the nodes they were
  // written to.
  absl::StatusOr<LookupResult> look = client_->Lookup(ns_, before.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, 48u);
  ExpectFetchExact(*client_, before, 48);
  // New writes go to the owners under the new membership, n3 included for its share.
  const Prefix after = MakePrefix(rng_, ns_, 48);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, after.tokens, after.payloads).ok());
  absl::StatusOr<LookupResult> on_n3 = Direct(3)->LookupEvery(ns_, after.tokens);
  ASSERT_TRUE(on_n3.ok()) << on_n3.status();
  const std::vector<ChunkKey> keys = client_->Keys(ns_, after.tokens);
  int owned = 0, misplaced = 0;
  for (size_t c = 0; c < keys.size(); ++c) {
    const std::vector<std::string> owners = client_->Owners(keys[c]);
    const bool owner = std::find(owners.begin(), owners.end(), "n3") != owners.end();
    owned += owner;
    misplaced += owner != (on_n3->tiers[c] != client::Tier::kNone);
  }
  EXPECT_GT(owned, 0) << "seed " << seed_;
  EXPECT_EQ(misplaced, 0);
}

TEST_F(ClusterTest, NodesKeepServingWithoutEtcdAndRegisterAgainWhenItReturns) {
  const Prefix p = MakePrefix(rng_, ns_, 32);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  etcd_->Stop();
  ASSERT_TRUE(WaitFor([&] { return client_->membership()->stale; }, 10))
      << "a client says when its membership may be out of date";
  EXPECT_EQ(client_->membership()->nodes.size(), 3u) << "it keeps the last membership seen";
  EXPECT_FALSE(client_->membership()->stale_reason.empty());
  std::this_thread::sleep_for(std::chrono::seconds(3));  // longer than the nodes' leases
  ExpectFetchExact(*client_, p, 32);
  const Prefix q = MakePrefix(rng_, ns_, 8);
  absl::StatusOr<StoreResult> st = client_->Store(ns_, std::nullopt, q.tokens, q.payloads);
  EXPECT_TRUE(st.ok()) << "stores go on with the last membership: " << st.status();

  ASSERT_TRUE(etcd_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return !client_->membership()->stale; }, 15));
  EXPECT_TRUE(WaitFor([&] { return client_->membership()->nodes.size() == 3; }, 15))
      << "every node registers again";
  std::unique_ptr<ClusterClient> fresh = Connect(kTokenA, 2);
  ASSERT_TRUE(fresh->RegisterNamespace(config_, "mini", 64).ok());
  ExpectFetchExact(*fresh, p, 32);
}

TEST_F(ClusterTest, TenantsNeverSeeEachOthersChunks) {
  const Prefix p = MakePrefix(rng_, ns_, 16);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  std::unique_ptr<ClusterClient> bob = Connect(kTokenB, 2);
  absl::StatusOr<RemoteNamespace> bob_ns = bob->RegisterNamespace(config_, "mini", 64);
  ASSERT_TRUE(bob_ns.ok()) << bob_ns.status();
  EXPECT_NE(bob_ns->id, ns_.id) << "a namespace belongs to its tenant";
  absl::StatusOr<LookupResult> look = bob->Lookup(*bob_ns, p.tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->matched_chunks, 0u);
  const std::vector<ChunkKey> keys = client_->Keys(ns_, p.tokens);
  std::vector<uint8_t> out(keys.size() * bob_ns->chunk_bytes);
  absl::StatusOr<size_t> n = bob->Fetch(*bob_ns, keys, out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u) << "alice's keys under bob's namespace fetch nothing";
  // Alice's namespace id used by bob is not found on any node.
  absl::StatusOr<LookupResult> foreign = bob->Lookup(ns_, p.tokens);
  EXPECT_FALSE(foreign.ok() && foreign->matched_chunks > 0);
  absl::StatusOr<uint32_t> deleted = bob->Delete(*bob_ns, keys);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 0u);
  ExpectFetchExact(*client_, p, 16);
}

// A hostile tenant knows the victim's root key (public facts: tenant name, model, chunk
// size) and stores into its own namespace with the victim's chain as parent — which a
// cluster node accepts, since a chunk's parent is usually on another node. Its keys are
// then the victim's keys. Neither its answers nor the victim's stores may depend on that.
TEST_F(ClusterTest, ATenantCanNeitherProbeNorSquatAnotherTenantsKeys) {
  std::unique_ptr<ClusterClient> bob = Connect(kTokenB, 2);
  absl::StatusOr<RemoteNamespace> bob_ns = bob->RegisterNamespace(config_, "mini", 64);
  ASSERT_TRUE(bob_ns.ok()) << bob_ns.status();
  const Prefix cached = MakePrefix(rng_, ns_, 6);    // alice stores it first
  const Prefix upcoming = MakePrefix(rng_, ns_, 6);  // alice stores it after bob
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, cached.tokens, cached.payloads).ok());

  // The probe: a prompt alice cached and one she has not answer alike.
  for (const Prefix* p : {&cached, &upcoming}) {
    const Prefix forged = MakePrefix(rng_, ns_, 6);  // bob's own bytes under alice's keys
    absl::StatusOr<StoreResult> st = bob->Store(*bob_ns, ns_.root, p->tokens, forged.payloads);
    ASSERT_TRUE(st.ok()) << (p == &cached ? "cached" : "upcoming") << ": " << st.status();
    EXPECT_EQ(st->stored, 6u * 2) << "bob's chunks are his own, whatever alice holds";
    EXPECT_EQ(st->already_present, 0u);
    EXPECT_EQ(st->keys, client_->Keys(ns_, p->tokens)) << "the test forges alice's keys";
  }
  // The squat: alice's store of the prompt bob forged first is whole, and hers alone.
  absl::StatusOr<StoreResult> mine =
      client_->Store(ns_, std::nullopt, upcoming.tokens, upcoming.payloads);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->stored, 6u * 2);
  for (const Prefix* p : {&cached, &upcoming}) {
    absl::StatusOr<LookupResult> look = client_->Lookup(ns_, p->tokens);
    ASSERT_TRUE(look.ok()) << look.status();
    EXPECT_EQ(look->matched_chunks, 6u);
    ExpectFetchExact(*client_, *p, 6);
  }
  // Each node counts bob's and alice's copies apart: 2 × (6 + 6) chunks each.
  uint64_t ssd_chunks = 0;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<pb::StatsResponse> s = Direct(i)->Stats();
    ASSERT_TRUE(s.ok()) << s.status();
    ssd_chunks += s->ssd_chunks();
  }
  EXPECT_EQ(ssd_chunks, 2u * 12u) << "alice's chunks on the nodes, seen by alice";
}

// Another process started with a live node's id (on a folder of its own) is refused,
// naming the holder, and leaves the live node's entry in place; so is one advertising a
// live node's address.
TEST_F(ClusterTest, ASecondProcessWithALiveNodesIdOrAddressIsRefused) {
  auto start = [&](const std::string& folder, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--data-dir",
                                     dir_.File(folder),
                                     "--ram-bytes",
                                     "4000000",
                                     "--ssd-bytes",
                                     "40000000",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--cluster",
                                     etcd_->url(),
                                     "--cluster-lease-seconds",
                                     "2",
                                     "--auth-tokens",
                                     dir_.File("tokens")};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::RunProgram(testing::kDaemon, args);
  };
  testing::ProcessResult same_id = start("impostor", {"--node-id", NodeId(1)});
  EXPECT_EQ(same_id.exit_code, 1);
  EXPECT_NE(same_id.err.find("node id n1 is held by another live node at " + nodes_[1]->address()),
            std::string::npos)
      << same_id.err;
  testing::ProcessResult same_address =
      start("twin", {"--node-id", "n9", "--advertise", nodes_[0]->address()});
  EXPECT_EQ(same_address.exit_code, 1);
  EXPECT_NE(same_address.err.find("address " + nodes_[0]->address() + " is advertised by node n0"),
            std::string::npos)
      << same_address.err;
  // Past a lease period after they exited, every node is still there, at its address.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  std::unique_ptr<ClusterClient> fresh = Connect(kTokenA, 2);
  ASSERT_NE(fresh, nullptr);
  const auto members = fresh->membership();
  ASSERT_EQ(members->nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(members->nodes[i].id, NodeId(i));
    EXPECT_EQ(members->nodes[i].address, nodes_[i]->address());
  }
}

// A node whose entry is overwritten claims it back; a record under another key naming a
// node (a rename) is not taken for that node, by the watch nor by a client's first read.
TEST_F(ClusterTest, AnOverwrittenEntryIsClaimedBackAndRecordsNamingAnotherKeyAreIgnored) {
  absl::StatusOr<std::string> endpoints = cluster::ParseEtcdUrl(etcd_->url());
  ASSERT_TRUE(endpoints.ok()) << endpoints.status();
  absl::StatusOr<std::unique_ptr<cluster::Etcd>> etcd = cluster::Etcd::Connect(*endpoints);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  cluster::NodeInfo forged;
  forged.id = NodeId(1);
  forged.address = "127.0.0.1:1";
  ASSERT_TRUE(
      (*etcd)->Put(std::string(cluster::kNodesPrefix) + NodeId(1), forged.ToJson(), 0).ok());
  forged.id = NodeId(2);
  forged.address = "127.0.0.1:2";
  ASSERT_TRUE((*etcd)->Put(std::string(cluster::kNodesPrefix) + "rogue", forged.ToJson(), 0).ok());
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<std::optional<cluster::Etcd::KeyValue>> kv =
            (*etcd)->Get(std::string(cluster::kNodesPrefix) + NodeId(1));
        if (!kv.ok() || !kv->has_value()) return false;
        absl::StatusOr<cluster::NodeInfo> n = cluster::NodeInfo::FromJson((*kv)->value);
        return n.ok() && n->address == nodes_[1]->address();
      },
      5))
      << "n1 did not claim its entry back";
  std::unique_ptr<ClusterClient> fresh = Connect(kTokenA, 2);  // its first read
  ASSERT_NE(fresh, nullptr);
  auto right = [&](const ClusterClient& c) {
    const auto members = c.membership();
    if (members->nodes.size() != 3) return false;
    for (int i = 0; i < 3; ++i) {
      if (members->nodes[i].id != NodeId(i) || members->nodes[i].address != nodes_[i]->address())
        return false;
    }
    return true;
  };
  EXPECT_TRUE(right(*fresh)) << "a client's first read";
  EXPECT_TRUE(WaitFor([&] { return right(*client_); }, 5)) << "a client's watch";
}

TEST_F(ClusterTest, KvctlShowsEveryNodeAndSaysWhenMembershipIsStale) {
  const Prefix p = MakePrefix(rng_, ns_, 8);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  const std::string kvctl = std::string(KVC_BIN_DIR) + "/kvctl";
  testing::ProcessResult r =
      testing::RunProgram(kvctl, {"--token", kTokenA, "stats", "--cluster", etcd_->url()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cluster: 3 nodes, 2 copies per chunk, membership current"),
            std::string::npos)
      << r.out;
  uint64_t ssd_chunks = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t at = r.out.find("\n" + NodeId(i) + " ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_NE(r.out.find(nodes_[i]->address(), at), std::string::npos) << r.out;
    absl::StatusOr<pb::StatsResponse> s = Direct(i)->Stats();
    ASSERT_TRUE(s.ok());
    ssd_chunks += s->ssd_chunks();
  }
  EXPECT_EQ(ssd_chunks, 8u * client_->replicas()) << "8 durable chunks, R copies each";
}

TEST(ClusterPlacement, RankingMatchesThePublishedVectors) {
  // Computed independently (Python's xxhash) and published in docs/cluster.md.
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/cluster/placement_vectors.json");
  ASSERT_TRUE(in);
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["rule"], cluster::kPlacementRuleName);
  const std::vector<std::string> nodes = doc["nodes"];
  ASSERT_GE(doc["vectors"].size(), 4u);
  for (const auto& v : doc["vectors"]) {
    ChunkKey key;
    const std::string hex = v["key"];
    for (size_t i = 0; i < 16; ++i) key.bytes[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
    std::vector<std::string> ranking;
    for (size_t i : cluster::RankNodes(key, nodes)) ranking.push_back(nodes[i]);
    EXPECT_EQ(ranking, v["ranking"].get<std::vector<std::string>>()) << hex;
    for (const std::string& n : nodes) {
      char w[17];
      std::snprintf(w, sizeof w, "%016llx",
                    static_cast<unsigned long long>(cluster::RendezvousWeight(key, n)));
      EXPECT_EQ(w, v["weights"][n].get<std::string>()) << hex << " " << n;
    }
  }
}

TEST(ClusterPlacement, LookupPlansMatchThePublishedVectors) {
  // Written by the Python client's planner (scripts/lookup_plan_vectors.py).
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/cluster/lookup_plan_vectors.json");
  ASSERT_TRUE(in);
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["rule"], cluster::kPlacementRuleName);
  std::vector<ChunkKey> keys;
  for (const std::string hex : doc["keys"]) {
    ChunkKey key;
    for (size_t i = 0; i < 16; ++i) key.bytes[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
    keys.push_back(key);
  }
  ASSERT_GE(doc["cases"].size(), 6u);
  for (const auto& c : doc["cases"]) {
    const std::vector<std::string> nodes = c["nodes"];
    const size_t ask = c["ask"];
    const cluster::LookupPlan plan = cluster::PlanLookup(keys, nodes, ask);
    ASSERT_EQ(plan.size(), nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      EXPECT_EQ(plan[i], c["plan"][nodes[i]].get<std::vector<size_t>>())
          << nodes.size() << " nodes, ask " << ask << ", node " << nodes[i];
    }
  }
}

TEST(ClusterPlacement, ALookupOfAFleetAsksEachKeyOfItsTopRankedNodesOnly) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  std::vector<std::string> nodes;
  for (int i = 0; i < 128; ++i) nodes.push_back("gpu-host-" + std::to_string(rng() % 100000));
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::vector<ChunkKey> keys(64);
  for (ChunkKey& k : keys)
    for (uint8_t& b : k.bytes) b = static_cast<uint8_t>(rng());
  const size_t ask = 4;  // R = 2, two extra
  const cluster::LookupPlan plan = cluster::PlanLookup(keys, nodes, ask);
  std::vector<std::set<size_t>> asked_of(keys.size());
  for (size_t i = 0; i < plan.size(); ++i)
    for (size_t c : plan[i]) asked_of[c].insert(i);
  for (size_t c = 0; c < keys.size(); ++c) {
    const std::vector<size_t> ranked = cluster::RankNodes(keys[c], nodes);
    EXPECT_EQ(asked_of[c], std::set<size_t>(ranked.begin(), ranked.begin() + ask)) << c;
  }
  const cluster::FanOut f = cluster::FanOutOf(plan);
  EXPECT_EQ(f.keys, keys.size() * ask) << "each key asked of exactly `ask` nodes";
  EXPECT_LE(f.nodes, nodes.size());
  const cluster::FanOut every = cluster::FanOutOf(cluster::PlanLookup(keys, nodes, nodes.size()));
  EXPECT_EQ(every.keys, keys.size() * nodes.size());
  std::printf("%zu nodes, %zu keys: %zu calls and %zu keys asked (every member: %zu and %zu)\n",
              nodes.size(), keys.size(), f.nodes, f.keys, every.nodes, every.keys);
}

TEST(ClusterPlacement, AJoiningNodeTakesOnlyItsShare) {
  // Rendezvous hashing moves only the keys the new node wins: about 1/(n+1) of them.
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const std::vector<std::string> before = {"a", "b", "c"};
  const std::vector<std::string> after = {"a", "b", "c", "d"};
  int moved = 0, wrong = 0;
  const int n = 20000;
  for (int k = 0; k < n; ++k) {
    ChunkKey key;
    for (uint8_t& b : key.bytes) b = static_cast<uint8_t>(rng());
    const std::string first_before = before[cluster::RankNodes(key, before)[0]];
    const std::string first_after = after[cluster::RankNodes(key, after)[0]];
    if (first_before != first_after) {
      ++moved;
      if (first_after != "d") ++wrong;  // a key moved between old nodes
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_NEAR(moved / static_cast<double>(n), 1.0 / after.size(), 0.02) << "seed " << seed;
}

TEST(ClusterUrl, BadAddressesAreNamed) {
  EXPECT_TRUE(cluster::ParseEtcdUrl("etcd://127.0.0.1:2379,127.0.0.2:2379").ok());
  for (const char* bad : {"http://127.0.0.1:2379", "etcd://", "etcd://host", "etcd://h:x"}) {
    absl::StatusOr<std::string> e = cluster::ParseEtcdUrl(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << bad;
  }
}

}  // namespace
}  // namespace kvc::client

namespace kvc::client {
namespace {

// A caller-keyed namespace (an engine's own page keys) through the C++ cluster client:
// each page on its two ranked owners; after an owner dies and the grace passes, LookupKeys
// copies the pages it finds short back to two (stored by their keys: no tokens exist);
// then the other original owner dies too and every page is still fetched byte-exact.
TEST_F(ClusterTest, CallerKeyedPagesSitOnTheirOwnersAndAreRepairedByKey) {
  std::unique_ptr<ClusterClient> c = Connect(kTokenA, 2, /*repair_grace_ms=*/300);
  const uint64_t page = 1000 + rng_() % 3000;
  absl::StatusOr<RemoteNamespace> ns = c->RegisterKeyedNamespace("sglang:m", page, 16);
  ASSERT_TRUE(ns.ok()) << ns.status();
  ASSERT_TRUE(ns->caller_keys);
  constexpr size_t kPages = 24;
  std::vector<ChunkKey> keys;
  std::vector<uint8_t> pages(kPages * page);
  for (uint8_t& b : pages) b = static_cast<uint8_t>(rng_());
  std::vector<ChunkToStore> chunks(kPages);
  for (size_t i = 0; i < kPages; ++i) {
    keys.push_back(*CallerKey(*ns, "page-" + std::to_string(rng_())));
    chunks[i].key = keys.back();
    chunks[i].payload = std::span(pages).subspan(i * page, page);
  }
  absl::StatusOr<StoreResult> st = c->StoreChunks(*ns, chunks);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->stored, 2 * kPages);
  EXPECT_EQ(c->LookupKeys(*ns, keys)->matched_chunks, kPages);
  EXPECT_EQ(c->Lookup(*ns, std::vector<uint32_t>(16, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto copies_on = [&](int i) {
    std::unique_ptr<CacheClient> d = Direct(i);
    absl::StatusOr<RemoteNamespace> dns = d->RegisterKeyedNamespace("sglang:m", page, 16);
    if (!dns.ok()) return -1L;
    absl::StatusOr<LookupResult> l = d->LookupKeysEvery(*dns, keys);
    return l.ok() ? static_cast<long>(std::count_if(l->tiers.begin(), l->tiers.end(),
                                                    [](Tier t) { return t != Tier::kNone; }))
                  : -1L;
  };
  long placed = 0;
  for (int i = 0; i < 3; ++i) placed += copies_on(i);
  EXPECT_EQ(placed, static_cast<long>(2 * kPages));
  nodes_[1]->Stop(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return c->membership()->nodes.size() == 2; }, 10));
  EXPECT_TRUE(WaitFor(
      [&] {
        EXPECT_TRUE(c->LookupKeys(*ns, keys).ok());  // finds the short pages and repairs them
        return copies_on(0) == static_cast<long>(kPages) &&
               copies_on(2) == static_cast<long>(kPages);
      },
      15));
  EXPECT_GT(c->counters().chunks_repaired, 0u);
  nodes_[0]->Stop(SIGKILL);
  std::vector<uint8_t> out(pages.size());
  absl::StatusOr<size_t> got = c->Fetch(*ns, keys, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, kPages);
  EXPECT_EQ(out, pages);
}

}  // namespace
}  // namespace kvc::client

namespace kvc::client {
namespace {

// Readers pick among a chunk's copies by their own salt: over many readers each copy gets
// about its share (a hot chunk's reads no longer all land on its best-ranked holder).
TEST(ClusterPlacement, FetchOrdersMatchThePublishedVectors) {
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/cluster/lookup_plan_vectors.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<ChunkKey> keys;
  for (const auto& hex : doc["keys"]) {
    ChunkKey k;
    const std::string h = hex;
    for (size_t i = 0; i < 16; ++i)
      k.bytes[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
    keys.push_back(k);
  }
  int checked = 0;
  for (const auto& c : doc["fetch_orders"]) {
    const std::vector<std::string> nodes = doc["memberships"][c["membership"].get<size_t>()];
    std::vector<size_t> holders;
    for (const std::string h : c["holders"]) {
      auto pos = std::find(nodes.begin(), nodes.end(), h);
      if (pos != nodes.end()) holders.push_back(static_cast<size_t>(pos - nodes.begin()));
    }
    std::vector<std::string> got;
    for (size_t i : cluster::FetchOrder(keys[c["key"].get<size_t>()], nodes, holders,
                                        c["replicas"].get<size_t>(), c["salt"].get<std::string>()))
      got.push_back(nodes[i]);
    EXPECT_EQ(got, c["order"].get<std::vector<std::string>>()) << c.dump();
    ++checked;
  }
  EXPECT_GE(checked, 100);
}

TEST(ClusterPlacement, ReadersOfAChunkShareItsCopies) {
  std::mt19937_64 rng(testing::FreshSeed());
  ChunkKey key;
  for (uint8_t& b : key.bytes) b = static_cast<uint8_t>(rng());
  EXPECT_EQ(cluster::FirstHolder(key, "r", 0), 0u);
  EXPECT_EQ(cluster::FirstHolder(key, "r", 1), 0u);
  for (size_t holders : {2u, 3u}) {
    std::vector<int> picked(holders, 0);
    constexpr int kReaders = 3000;
    for (int r = 0; r < kReaders; ++r) {
      const size_t i = cluster::FirstHolder(key, "reader-" + std::to_string(rng()), holders);
      ASSERT_LT(i, holders);
      ++picked[i];
      EXPECT_EQ(cluster::FirstHolder(key, "same", holders),
                cluster::FirstHolder(key, "same", holders));
    }
    for (size_t i = 0; i < holders; ++i) {
      const double share = static_cast<double>(picked[i]) / kReaders;
      EXPECT_NEAR(share, 1.0 / static_cast<double>(holders), 0.05)
          << "copy " << i << " of " << holders;
    }
  }
}

}  // namespace
}  // namespace kvc::client
