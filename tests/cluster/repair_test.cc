// Node-side repair on real processes: Debian's etcd and four kvcached nodes on loopback,
// R = 2, every node with the cluster credential and a 1 s repair grace.
//   - Chaos: a data set stored through the cluster client; one node SIGKILLed and its data
//     folder deleted; with no client reading anything, the survivors copy every chunk back
//     to two copies (their Stats say under-replicated drains to 0); then a second node is
//     SIGKILLed and every acknowledged chunk still fetches byte-exact, for both tenants.
//   - Drain under load: `kvctl drain` while a writer and a reader run; the node leaves, and
//     every chunk acknowledged before, during and after sits on two of the three others.
//   - The peer calls take the cluster credential and nothing else (no tenant token), check
//     each payload against its checksum and each namespace against its derived id, and
//     store a copy in its own tenant's namespace only.
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "client/cluster_client.h"
#include "client/prefix_hash.h"
#include "cluster/placement.h"
#include "gtest/gtest.h"
#include "kvcache/v1/peer.grpc.pb.h"
#include "serve/local_cluster.h"
#include "storage/slot_format.h"
#include "tests/cachesvc/daemon.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/http_get.h"
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
constexpr char kTokenOps[] = "token-of-ops";  // sees the daemons' totals (repair state)
constexpr char kSecret[] = "cluster-secret-0123456789abcdef";
constexpr int kNodes = 4;

using ::kvc::testing::WaitFor;

class RepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
    std::ofstream(dir_.File("tokens")) << kTokenA << " alice\n"
                                       << kTokenB << " bob\n"
                                       << kTokenOps << " ops\n";
    std::ofstream(dir_.File("secret")) << kSecret << "\n";
    // A credential file must be its owner's alone (kvcached refuses one others may read).
    ASSERT_EQ(chmod(dir_.File("secret").c_str(), 0600), 0);
    etcd_ = std::make_unique<EtcdProcess>(dir_.File("etcd"));
    ASSERT_TRUE(etcd_->Start().ok());
    for (int i = 0; i < kNodes; ++i) StartNode(i);
    alice_ = Connect(kTokenA);
    bob_ = Connect(kTokenB);
    ASSERT_NE(alice_, nullptr);
    ASSERT_NE(bob_, nullptr);
    config_ = ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
    absl::StatusOr<RemoteNamespace> a = alice_->RegisterNamespace(config_, "mini", 64);
    absl::StatusOr<RemoteNamespace> b = bob_->RegisterNamespace(config_, "mini", 64);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    ns_a_ = *a;
    ns_b_ = *b;
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (int i = 0; i < kNodes; ++i) {  // what the nodes logged, to see why
      const std::string log = ReadFile(dir_.File("n" + std::to_string(i) + ".log"));
      std::printf("---- %s's log (last 4 KB)\n%s\n", NodeId(i).c_str(),
                  log.substr(log.size() > 4096 ? log.size() - 4096 : 0).c_str());
    }
  }

  void StartNode(int i) {
    std::vector<std::string> flags = {
        "--cluster", etcd_->url(), "--node-id", NodeId(i), "--cluster-lease-seconds", "2",
        "--auth-tokens", dir_.File("tokens"), "--admin-tenants", "ops", "--cluster-secret-file",
        dir_.File("secret"), "--repair-grace-seconds", "1", "--replicas", "2",
        "--repair-interval-seconds", "2", "--repair-drop-extra",
        // passes list ~40 chunks at a time: several shards a pass
        "--repair-shard-chunks", "40",
        // slots of the mini model's chunks: room for every copy
        "--max-chunk-bytes", "8192"};
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    if (i == 0) {  // node 0 also serves Prometheus metrics
      metrics_port_ = FreeLoopbackPort();
      flags.insert(flags.end(), {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port_)});
    }
    nodes_[i] = std::make_unique<Daemon>(NodeDir(i), std::move(flags),
                                         dir_.File("n" + std::to_string(i) + ".log"));
  }
  std::string NodeDir(int i) const { return dir_.File("node" + std::to_string(i)); }
  static std::string NodeId(int i) { return "n" + std::to_string(i); }

  std::unique_ptr<ClusterClient> Connect(const std::string& token) {
    ClientOptions o;
    o.address = etcd_->url();
    o.bearer_token = token;
    o.timeout_ms = 5000;
    o.replicas = 2;
    absl::StatusOr<std::unique_ptr<ClusterClient>> c = ClusterClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE(WaitFor([&] { return (*c)->membership()->nodes.size() == Live(); }, 10));
    return *std::move(c);
  }
  size_t Live() const {
    return static_cast<size_t>(
        std::count_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return n != nullptr; }));
  }

  // Node i's Stats as the ops tenant sees them (with the repair state).
  std::optional<pb::StatsResponse> StatsOf(int i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kTokenOps);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::StatsResponse resp;
    if (!nodes_[i]->stub().Stats(&ctx, pb::StatsRequest(), &resp).ok()) return std::nullopt;
    return resp;
  }
  // Every live node has finished a repair pass since `passes_before` and has nothing left.
  bool RepairSettled(const std::map<int, uint64_t>& passes_before) {
    for (int i = 0; i < kNodes; ++i) {
      if (!nodes_[i]) continue;
      std::optional<pb::StatsResponse> s = StatsOf(i);
      if (!s || !s->has_repair()) return false;
      const pb::RepairStats& r = s->repair();
      auto before = passes_before.find(i);
      if (r.pending() || r.running() || r.under_replicated_chunks() != 0 ||
          r.passes() <= (before == passes_before.end() ? 0 : before->second))
        return false;
    }
    return true;
  }
  // Each live node's pass count, a pass in flight counted as done: RepairSettled(Passes())
  // then waits for a pass that started after this call, not one that began before it and
  // saw the cluster as it was.
  std::map<int, uint64_t> Passes() {
    std::map<int, uint64_t> p;
    for (int i = 0; i < kNodes; ++i) {
      if (nodes_[i]) {
        std::optional<pb::StatsResponse> s = StatsOf(i);
        p[i] = s ? s->repair().passes() + (s->repair().running() ? 1 : 0) : 0;
      }
    }
    return p;
  }

  // Which live nodes hold each chunk of `p` (a direct Lookup on each: not a cluster read,
  // so no read repair); a node that would read it from the shared tier holds it too, unless
  // `own_copies_only`.
  std::vector<std::set<int>> HoldersOf(const RemoteNamespace& ns, const std::string& token,
                                       const Prefix& p, bool own_copies_only = false) {
    const size_t chunks = p.tokens.size() / ns.chunk_tokens;
    std::vector<std::set<int>> holders(chunks);
    for (int i = 0; i < kNodes; ++i) {
      if (!nodes_[i]) continue;
      ClientOptions o;
      o.address = nodes_[i]->address();
      o.bearer_token = token;
      absl::StatusOr<std::unique_ptr<CacheClient>> c = CacheClient::Connect(o);
      EXPECT_TRUE(c.ok()) << c.status();
      absl::StatusOr<LookupResult> l = (*c)->LookupEvery(ns, p.tokens);
      if (absl::IsNotFound(l.status())) continue;  // a new node that has not seen the namespace
      EXPECT_TRUE(l.ok()) << NodeId(i) << ": " << l.status();
      if (!l.ok()) continue;
      for (size_t k = 0; k < chunks && k < l->tiers.size(); ++k) {
        if (l->tiers[k] != Tier::kNone && !(own_copies_only && l->tiers[k] == Tier::kRados))
          holders[k].insert(i);
      }
    }
    return holders;
  }
  std::vector<int> CopiesOf(const RemoteNamespace& ns, const std::string& token, const Prefix& p) {
    std::vector<int> copies;
    for (const std::set<int>& h : HoldersOf(ns, token, p))
      copies.push_back(static_cast<int>(h.size()));
    return copies;
  }
  static int MinCopies(const std::vector<int>& copies) {
    return copies.empty() ? 0 : *std::min_element(copies.begin(), copies.end());
  }

  void ExpectFetchExact(ClusterClient& c, const RemoteNamespace& ns, const Prefix& p) {
    const std::vector<ChunkKey> keys = c.Keys(ns, p.tokens);
    std::vector<uint8_t> out(keys.size() * ns.chunk_bytes);
    std::string why;
    absl::StatusOr<size_t> n = c.Fetch(ns, keys, out, &why);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, keys.size()) << why;
    EXPECT_TRUE(out == p.payloads) << "fetched bytes differ from the stored ones";
  }

  // Stops node i for good: SIGKILL, its data folder deleted with it.
  void KillAndWipe(int i) {
    nodes_[i]->Stop(SIGKILL);
    nodes_[i].reset();
    std::filesystem::remove_all(NodeDir(i));
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  TempDir dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::array<std::unique_ptr<Daemon>, kNodes> nodes_;
  std::unique_ptr<ClusterClient> alice_, bob_;
  std::string config_;
  RemoteNamespace ns_a_, ns_b_;
  int metrics_port_ = 0;
  std::vector<std::string> extra_flags_;  // every node's, besides the fixture's
};

// The same cluster on a shared tier: a single-host Ceph cluster (scripts/ceph-up.sh) under
// every node (--rados-pool).
class RepairWithRadosTest : public RepairTest {
 protected:
  void SetUp() override {
    const testing::ProcessResult up = testing::RunProgram(
        std::string(KVC_SOURCE_DIR) + "/scripts/ceph-up.sh", {ceph_.File("ceph"), "kvc-repair"});
    ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
    extra_flags_ = {"--rados-pool", "kvc-repair", "--ceph-conf", ceph_.File("ceph") + "/ceph.conf"};
    RepairTest::SetUp();
  }
  void TearDown() override {
    RepairTest::TearDown();
    for (auto& n : nodes_) n.reset();  // before the cluster under them goes
    const testing::ProcessResult down = testing::RunProgram(
        std::string(KVC_SOURCE_DIR) + "/scripts/ceph-down.sh", {ceph_.File("ceph")});
    EXPECT_EQ(down.exit_code, 0) << down.err;
  }
  TempDir ceph_;
};

// Under RADOS, repair knows where the durable copy is: after a node and its disk are lost,
// the durable chunks it held are not copied between nodes (their new owners answer that
// RADOS holds them; Stats' left_to_shared_tier_chunks counts them) — only the
// memory-durability ones, which RADOS never had, are. Every chunk still fetches
// byte-exact: the durable ones through their new owners, from RADOS.
TEST_F(RepairWithRadosTest, RepairLeavesDurableChunksToRadosAndCopiesOnlyTheRest) {
  std::vector<Prefix> durable, memory;
  for (int i = 0; i < 4; ++i) {
    durable.push_back(MakePrefix(rng_, ns_a_, 16));
    ASSERT_TRUE(
        alice_->Store(ns_a_, std::nullopt, durable.back().tokens, durable.back().payloads).ok());
    memory.push_back(MakePrefix(rng_, ns_a_, 16));
    ASSERT_TRUE(alice_
                    ->Store(ns_a_, std::nullopt, memory.back().tokens, memory.back().payloads,
                            Durability::kMemory)
                    .ok());
  }
  ASSERT_TRUE(WaitFor([&] { return RepairSettled({}); }, 30)) << "no first pass";
  // What n1 held of each kind: after its loss, one owner of each of those chunks lacks it.
  auto held_by_n1 = [&](const std::vector<Prefix>& ps) {
    uint64_t n = 0;
    for (const Prefix& p : ps) {
      for (const std::set<int>& h : HoldersOf(ns_a_, kTokenA, p, /*own_copies_only=*/true))
        n += h.contains(1);
    }
    return n;
  };
  const uint64_t durable_on_n1 = held_by_n1(durable), memory_on_n1 = held_by_n1(memory);
  ASSERT_GT(durable_on_n1, 0u);
  ASSERT_GT(memory_on_n1, 0u);
  uint64_t copied_before = 0;
  for (int i : {0, 2, 3}) copied_before += StatsOf(i)->repair().copied_chunks();

  const std::map<int, uint64_t> before = Passes();
  KillAndWipe(1);
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(before); }, 60)) << "repair did not settle";
  uint64_t copied = 0, left = 0;
  for (int i : {0, 2, 3}) {
    const pb::RepairStats r = StatsOf(i)->repair();
    copied += r.copied_chunks();
    left += r.left_to_shared_tier_chunks();
  }
  copied -= copied_before;
  std::printf("n1 held %llu durable and %llu memory chunks: %llu copied, %llu left to RADOS\n",
              (unsigned long long)durable_on_n1, (unsigned long long)memory_on_n1,
              (unsigned long long)copied, (unsigned long long)left);
  EXPECT_EQ(copied, memory_on_n1) << "only what RADOS does not hold is copied";
  EXPECT_EQ(left, durable_on_n1);
  for (const Prefix& p : memory) EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 2);
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  for (const Prefix& p : durable) ExpectFetchExact(*reader, ns_a_, p);
  for (const Prefix& p : memory) ExpectFetchExact(*reader, ns_a_, p);
}

TEST_F(RepairTest, ChunksNobodyReadsSurviveTwoNodeLossesOneAfterTheOther) {
  std::vector<Prefix> alice, bob;
  for (int i = 0; i < 6; ++i) {
    alice.push_back(MakePrefix(rng_, ns_a_, 24));
    ASSERT_TRUE(
        alice_->Store(ns_a_, std::nullopt, alice.back().tokens, alice.back().payloads).ok());
  }
  bob.push_back(MakePrefix(rng_, ns_b_, 24));
  ASSERT_TRUE(bob_->Store(ns_b_, std::nullopt, bob.back().tokens, bob.back().payloads).ok());
  size_t chunks = 0;
  for (const Prefix& p : alice) {
    EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 2);
    chunks += p.tokens.size() / ns_a_.chunk_tokens;
  }
  ASSERT_TRUE(WaitFor([&] { return RepairSettled({}); }, 30)) << "no first pass";

  // The first loss: n1 and its disk, for good. Nobody reads anything from here on.
  const std::map<int, uint64_t> before = Passes();
  const auto killed_at = Clock::now();
  KillAndWipe(1);
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(before); }, 60)) << "repair did not settle";
  const double repair_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  uint64_t copied = 0, copied_bytes = 0;
  for (int i : {0, 2, 3}) {
    const pb::RepairStats r = StatsOf(i)->repair();
    copied += r.copied_chunks();
    copied_bytes += r.copied_bytes();
    EXPECT_EQ(r.unplaceable_chunks(), 0u) << NodeId(i);
  }
  std::printf(
      "repair after the loss of n1: %.1f s (lease 2 s + grace 1 s), %llu copies, %llu "
      "bytes, for %zu chunks of alice and 24 of bob\n",
      repair_s, (unsigned long long)copied, (unsigned long long)copied_bytes, chunks);
  EXPECT_GT(copied, 0u) << "n1 held nothing?";
  // What an operator sees: every node's repair state, and nothing left under-replicated.
  const testing::ProcessResult stats =
      testing::RunProgram(std::string(KVC_BIN_DIR) + "/kvctl",
                          {"--token", kTokenOps, "stats", "--cluster", etcd_->url()});
  std::printf("%s", stats.out.c_str());
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_NE(stats.out.find("under-repl."), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("idle"), std::string::npos) << stats.out;
  const size_t total = stats.out.find("\ncluster ");
  ASSERT_NE(total, std::string::npos) << stats.out;
  uint64_t left = 1;
  ASSERT_EQ(std::sscanf(stats.out.c_str() + total, "\ncluster %lu", &left), 1) << stats.out;
  EXPECT_EQ(left, 0u) << "kvctl says chunks are still under-replicated";
  // And Prometheus, scraping node 0: the same state as its Stats.
  const pb::RepairStats r0 = StatsOf(0)->repair();
  const std::string metrics = testing::HttpGet(metrics_port_, "/metrics");
  for (const std::string& want : std::vector<std::string>{
           "kvcache_repair_under_replicated_chunks 0", "kvcache_repair_pending 0",
           "kvcache_repair_copied_chunks_total " + std::to_string(r0.copied_chunks()),
           "kvcache_repair_passes_total ",  // (a periodic pass may have run since Stats)
           "kvcache_repair_unplaceable_chunks 0"}) {
    EXPECT_NE(metrics.find(want), std::string::npos) << "missing \"" << want << "\" in:\n"
                                                     << metrics.substr(0, 3000);
  }
  for (const Prefix& p : alice) EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 2);
  EXPECT_EQ(MinCopies(CopiesOf(ns_b_, kTokenB, bob[0])), 2);
  // The copies went to their own tenant's namespace: alice sees none of bob's chunks.
  EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, Prefix{bob[0].tokens, {}})), 0);

  // The second loss: every acknowledged chunk is still there, byte-exact.
  KillAndWipe(2);
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  for (const Prefix& p : alice) ExpectFetchExact(*reader, ns_a_, p);
  std::unique_ptr<ClusterClient> bob_reader = Connect(kTokenB);
  ASSERT_TRUE(bob_reader->RegisterNamespace(config_, "mini", 64).ok());
  ExpectFetchExact(*bob_reader, ns_b_, bob[0]);
}

TEST_F(RepairTest, ADrainedNodeHandsEveryChunkOverUnderLoad) {
  std::vector<Prefix> before;
  for (int i = 0; i < 4; ++i) {
    before.push_back(MakePrefix(rng_, ns_a_, 16));
    ASSERT_TRUE(
        alice_->Store(ns_a_, std::nullopt, before.back().tokens, before.back().payloads).ok());
  }
  // A writer and a reader keep going through the drain.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Prefix> written;
  std::atomic<int> write_failures{0}, read_failures{0}, reads{0};
  std::mt19937_64 writer_rng(seed_ ^ 0x5EED);
  std::thread writer([&] {
    std::unique_ptr<ClusterClient> c = Connect(kTokenA);
    ASSERT_TRUE(c->RegisterNamespace(config_, "mini", 64).ok());
    while (!stop) {
      Prefix p = MakePrefix(writer_rng, ns_a_, 4);
      if (c->Store(ns_a_, std::nullopt, p.tokens, p.payloads).ok()) {
        std::lock_guard lk(mu);
        written.push_back(std::move(p));
      } else {
        ++write_failures;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::thread reader([&] {
    std::unique_ptr<ClusterClient> c = Connect(kTokenA);
    ASSERT_TRUE(c->RegisterNamespace(config_, "mini", 64).ok());
    for (size_t k = 0; !stop; ++k) {
      const Prefix& p = before[k % before.size()];
      const std::vector<ChunkKey> keys = c->Keys(ns_a_, p.tokens);
      std::vector<uint8_t> out(keys.size() * ns_a_.chunk_bytes);
      absl::StatusOr<size_t> n = c->Fetch(ns_a_, keys, out);
      if (!n.ok() || *n != keys.size() || out != p.payloads) ++read_failures;
      ++reads;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const testing::ProcessResult drained =
      testing::RunProgram(std::string(KVC_BIN_DIR) + "/kvctl",
                          {"drain", NodeId(3), "--cluster", etcd_->url(), "--cluster-secret-file",
                           dir_.File("secret"), "--wait-seconds", "60"});
  std::printf("%s", drained.out.c_str());
  EXPECT_EQ(drained.exit_code, 0) << drained.err;
  EXPECT_NE(drained.out.find("left the cluster"), std::string::npos) << drained.out;
  // The node exits by itself once it has handed everything over.
  int status = -1;
  EXPECT_TRUE(WaitFor([&] { return waitpid(nodes_[3]->pid(), &status, WNOHANG) > 0; }, 30));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  nodes_[3]->Forget();
  nodes_[3].reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  writer.join();
  reader.join();
  EXPECT_EQ(read_failures.load(), 0) << "of " << reads.load() << " reads";
  std::printf("drain under load: %zu prefixes written during it (%d stores failed), %d reads\n",
              written.size(), write_failures.load(), reads.load());
  EXPECT_GT(written.size(), 0u);
  // No chunk acknowledged before or during the drain is below two copies on the others
  // once the grace for the changed membership has passed (chunks a client wrote to n3
  // just as it left are copied back by the others' repair).
  const std::map<int, uint64_t> passes = Passes();
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(passes); }, 30));
  // A chunk a client put on a third node while n3 refused it is an extra copy once its owners
  // hold it; a node whose pass ran before an owner's copy landed drops its copy in the next.
  const std::map<int, uint64_t> copied = Passes();
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(copied); }, 30));
  for (const Prefix& p : before) EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 2);
  for (const Prefix& p : written) EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 2);
  std::unique_ptr<ClusterClient> c = Connect(kTokenA);
  ASSERT_TRUE(c->RegisterNamespace(config_, "mini", 64).ok());
  for (const Prefix& p : written) ExpectFetchExact(*c, ns_a_, p);
}

TEST_F(RepairTest, AJoiningNodeGetsItsShareAndTheOldHoldersDropTheirExtraCopies) {
  KillAndWipe(3);
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 3; }, 10));
  std::vector<Prefix> data;
  for (int i = 0; i < 6; ++i) {
    data.push_back(MakePrefix(rng_, ns_a_, 16));
    ASSERT_TRUE(alice_->Store(ns_a_, std::nullopt, data.back().tokens, data.back().payloads).ok());
  }
  StartNode(3);  // an empty folder: a new node under the old id
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 4; }, 10));
  // Each chunk ends on exactly its two owners under the new membership: the new node got
  // its share from the old owners, and a node that no longer owns a chunk dropped its copy
  // once both owners held one (--repair-drop-extra). Nobody read anything.
  const std::vector<std::string> ids = {NodeId(0), NodeId(1), NodeId(2), NodeId(3)};
  auto on_owners = [&](size_t* on_new) {
    *on_new = 0;
    for (const Prefix& p : data) {
      const std::vector<ChunkKey> keys = alice_->Keys(ns_a_, p.tokens);
      const std::vector<std::set<int>> holders = HoldersOf(ns_a_, kTokenA, p);
      for (size_t k = 0; k < keys.size(); ++k) {
        std::set<int> owners;
        for (size_t o : cluster::TopRanked(keys[k], ids, 2)) owners.insert(static_cast<int>(o));
        if (holders[k] != owners) return false;
        *on_new += holders[k].contains(3);
      }
    }
    return true;
  };
  size_t on_new = 0;
  EXPECT_TRUE(WaitFor([&] { return on_owners(&on_new); }, 30))
      << "chunks are not exactly on their owners";
  EXPECT_GT(on_new, 0u) << "the new node got nothing";
  uint64_t dropped = 0;
  for (int i = 0; i < 3; ++i) dropped += StatsOf(i)->repair().dropped_copies();
  EXPECT_EQ(dropped, on_new) << "every copy the new node took was dropped by the node it replaced";
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  for (const Prefix& p : data) ExpectFetchExact(*reader, ns_a_, p);
}

// A Delete stays deleted: chunks deleted while a node was away (killed, its folder kept) do
// not come back when it returns — not through its repair (the others refuse its copies and
// tell it to erase them), and not through a client's read (a Lookup treats a chunk some
// node deleted as missing, and its read repair is refused) — while everything not deleted
// is still there.
TEST_F(RepairTest, ADeleteStaysDeletedWhenANodeThatMissedItReturns) {
  std::vector<Prefix> kept, gone;
  for (int i = 0; i < 4; ++i) {
    kept.push_back(MakePrefix(rng_, ns_a_, 8));
    gone.push_back(MakePrefix(rng_, ns_a_, 8));
    for (const Prefix* p : {&kept.back(), &gone.back()}) {
      ASSERT_TRUE(alice_->Store(ns_a_, std::nullopt, p->tokens, p->payloads).ok());
    }
  }
  // n3 holds its share of what is to be deleted when it goes away.
  size_t on_n3 = 0;
  for (const Prefix& p : gone) {
    for (const std::set<int>& h : HoldersOf(ns_a_, kTokenA, p)) on_n3 += h.contains(3);
  }
  ASSERT_GT(on_n3, 0u);
  nodes_[3]->Stop(SIGKILL);
  nodes_[3].reset();
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 3; }, 10));
  uint32_t deleted = 0;
  for (const Prefix& p : gone) {
    absl::StatusOr<uint32_t> d = alice_->Delete(ns_a_, alice_->Keys(ns_a_, p.tokens));
    ASSERT_TRUE(d.ok()) << d.status();
    deleted += *d;
  }
  EXPECT_GT(deleted, 0u);
  for (const Prefix& p : gone) EXPECT_EQ(MinCopies(CopiesOf(ns_a_, kTokenA, p)), 0);
  StartNode(3);  // back, with the copies it held
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 4; }, 10));
  // At once, before any repair: a client's Lookup finds none of the deleted chunks.
  std::unique_ptr<ClusterClient> reader = Connect(kTokenA);
  ASSERT_TRUE(reader->RegisterNamespace(config_, "mini", 64).ok());
  for (const Prefix& p : gone) {
    absl::StatusOr<LookupResult> l = reader->Lookup(ns_a_, p.tokens);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->matched_chunks, 0u) << "a deleted chunk was found";
  }
  // After repair has run everywhere, no node holds any of them.
  const std::map<int, uint64_t> before = Passes();
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(before); }, 40));
  const std::map<int, uint64_t> again = Passes();
  ASSERT_TRUE(WaitFor([&] { return RepairSettled(again); }, 40));
  for (const Prefix& p : gone) {
    const std::vector<std::set<int>> holders = HoldersOf(ns_a_, kTokenA, p);
    for (size_t k = 0; k < holders.size(); ++k) {
      EXPECT_TRUE(holders[k].empty())
          << "chunk " << k << " of a deleted prefix came back on " << holders[k].size() << " nodes";
    }
    absl::StatusOr<LookupResult> l = reader->Lookup(ns_a_, p.tokens);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->matched_chunks, 0u);
  }
  for (const Prefix& p : kept) ExpectFetchExact(*reader, ns_a_, p);
  // Storing a deleted prefix again is the tenant's new decision: it is kept.
  ASSERT_TRUE(alice_->Store(ns_a_, std::nullopt, gone[0].tokens, gone[0].payloads).ok());
  ExpectFetchExact(*reader, ns_a_, gone[0]);
}

// A pinned copy on a node that no longer owns it stays (--repair-drop-extra drops only
// unpinned ones): the owners may hold the chunk unpinned, and the pin would be gone
// everywhere. The new owner still gets its copy.
TEST_F(RepairTest, APinnedCopyIsNeverDroppedAsAnExtraOne) {
  KillAndWipe(3);
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 3; }, 10));
  std::vector<Prefix> data;
  for (int i = 0; i < 6; ++i) {
    data.push_back(MakePrefix(rng_, ns_a_, 16));
    ASSERT_TRUE(alice_->Store(ns_a_, std::nullopt, data.back().tokens, data.back().payloads).ok());
    const std::vector<ChunkKey> keys = alice_->Keys(ns_a_, data.back().tokens);
    ASSERT_TRUE(alice_->Pin(ns_a_, keys, 3600).ok());
  }
  std::vector<std::vector<std::set<int>>> before;
  for (const Prefix& p : data) before.push_back(HoldersOf(ns_a_, kTokenA, p));
  StartNode(3);
  ASSERT_TRUE(WaitFor([&] { return alice_->membership()->nodes.size() == 4; }, 10));
  const std::vector<std::string> ids = {NodeId(0), NodeId(1), NodeId(2), NodeId(3)};
  // Wait until every chunk the new node owns has reached it.
  auto new_node_has_its_share = [&] {
    for (const Prefix& p : data) {
      const std::vector<ChunkKey> keys = alice_->Keys(ns_a_, p.tokens);
      const std::vector<std::set<int>> holders = HoldersOf(ns_a_, kTokenA, p);
      for (size_t k = 0; k < keys.size(); ++k) {
        for (size_t o : cluster::TopRanked(keys[k], ids, 2)) {
          if (!holders[k].contains(static_cast<int>(o))) return false;
        }
      }
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(new_node_has_its_share, 30)) << "the new node did not get its share";
  // Two more passes on every old node: time to drop what it would drop.
  std::vector<uint64_t> passes;
  for (int i = 0; i < 3; ++i) passes.push_back(StatsOf(i)->repair().passes());
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < 3; ++i) {
          if (StatsOf(i)->repair().passes() < passes[i] + 2) return false;
        }
        return true;
      },
      30));
  uint64_t dropped = 0;
  for (int i = 0; i < 3; ++i) dropped += StatsOf(i)->repair().dropped_copies();
  EXPECT_EQ(dropped, 0u) << "pinned copies were dropped";
  for (size_t p = 0; p < data.size(); ++p) {
    const std::vector<std::set<int>> holders = HoldersOf(ns_a_, kTokenA, data[p]);
    for (size_t k = 0; k < holders.size(); ++k) {
      for (int h : before[p][k])
        EXPECT_TRUE(holders[k].contains(h)) << "node " << h << " dropped it";
    }
  }
}

// A credential a node must not run with is refused at start, naming what is wrong.
TEST_F(RepairTest, ABadClusterCredentialIsRefusedAtStart) {
  const std::string kvcached = std::string(KVC_BIN_DIR) + "/kvcached";
  std::ofstream(dir_.File("short-secret")) << "too-short\n";
  std::ofstream(dir_.File("tenant-secret")) << "token-of-alice-0123456789\n";
  std::ofstream(dir_.File("tokens2")) << "token-of-alice-0123456789 alice\n";
  std::ofstream(dir_.File("guessable-secret")) << std::string(16, 'a') << "\n";
  std::ofstream(dir_.File("readable-secret")) << kSecret << "\n";
  ASSERT_EQ(chmod(dir_.File("guessable-secret").c_str(), 0600), 0);
  ASSERT_EQ(chmod(dir_.File("tenant-secret").c_str(), 0600), 0);
  ASSERT_EQ(chmod(dir_.File("readable-secret").c_str(), 0644), 0);
  struct Case {
    std::vector<std::string> flags;
    const char* says;
  } cases[] = {
      {{"--cluster", etcd_->url(), "--cluster-secret-file", dir_.File("short-secret")},
       "the credential is 9 characters; use at least 16"},
      {{"--cluster", etcd_->url(), "--auth-tokens", dir_.File("tokens2"), "--cluster-secret-file",
        dir_.File("tenant-secret")},
       "also a tenant's token"},
      {{"--cluster", etcd_->url(), "--cluster-secret-file", dir_.File("missing")}, "missing"},
      {{"--cluster", etcd_->url(), "--cluster-secret-file", dir_.File("guessable-secret")},
       "the credential looks guessable"},
      {{"--cluster", etcd_->url(), "--cluster-secret-file", dir_.File("readable-secret")},
       "may be read by its group or others (mode 0644)"},
      {{"--cluster-secret-file", dir_.File("secret")}, "only means something with --cluster"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--data-dir", dir_.File("refused"), "--listen", "127.0.0.1:0"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const testing::ProcessResult r = testing::RunProgram(kvcached, args);
    EXPECT_EQ(r.exit_code, 1) << c.says;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
}

TEST_F(RepairTest, PeerCallsTakeTheClusterCredentialAndCheckWhatTheyStore) {
  auto stub = pb::ClusterPeer::NewStub(
      grpc::CreateChannel(nodes_[0]->address(), grpc::InsecureChannelCredentials()));
  // A chunk of alice's, as a peer would copy it.
  const Prefix p = MakePrefix(rng_, ns_a_, 1);
  const ChunkKey key = alice_->Keys(ns_a_, p.tokens)[0];
  pb::ReplicateRequest req;
  pb::PeerNamespace* ns = req.mutable_ns();
  ns->set_namespace_id(ns_a_.id);
  ns->set_tenant("alice");
  ns->set_root_key(std::string(reinterpret_cast<const char*>(ns_a_.root.bytes.data()), 16));
  ns->set_model_id("mini");
  ns->set_chunk_tokens(ns_a_.chunk_tokens);
  ns->set_chunk_bytes(ns_a_.chunk_bytes);
  ns->set_vocab_size(ns_a_.vocab_size);
  pb::ReplicaChunk* c = req.add_chunks();
  c->set_chunk_key(std::string(reinterpret_cast<const char*>(key.bytes.data()), 16));
  c->set_payload(std::string(p.payloads.begin(), p.payloads.end()));
  c->set_checksum(storage::PayloadChecksum(p.payloads));
  auto call = [&](const pb::ReplicateRequest& r, const char* md_key, const std::string& md_value) {
    grpc::ClientContext ctx;
    if (md_key != nullptr) ctx.AddMetadata(md_key, md_value);
    pb::ReplicateResponse resp;
    return stub->Replicate(&ctx, r, &resp);
  };
  auto holds = [&] {
    pb::HoldsRequest h;
    *h.mutable_ns() = req.ns();
    h.set_packed_chunk_keys(c->chunk_key());
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-kvcache-peer", kSecret);
    pb::HoldsResponse resp;
    EXPECT_TRUE(stub->Holds(&ctx, h, &resp).ok());
    return resp.tiers_size() == 1 && resp.tiers(0) != pb::TIER_NONE;
  };
  // No credential, a tenant's token (either way), a wrong credential: refused.
  EXPECT_EQ(call(req, nullptr, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(req, "authorization", std::string("Bearer ") + kTokenA).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(req, "x-kvcache-peer", kTokenA).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(req, "x-kvcache-peer", std::string(kSecret) + "x").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A payload that does not match its checksum, or a namespace id its tenant and root do
  // not derive: refused, and nothing stored.
  pb::ReplicateRequest bad = req;
  (*bad.mutable_chunks(0)->mutable_payload())[7] ^= 1;
  grpc::Status s = call(bad, "x-kvcache-peer", kSecret);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  bad = req;
  bad.mutable_ns()->set_namespace_id(ns_a_.id + 1);
  s = call(bad, "x-kvcache-peer", kSecret);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  bad = req;
  bad.mutable_ns()->set_tenant("bob");  // alice's root under bob: another derived id
  s = call(bad, "x-kvcache-peer", kSecret);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_FALSE(holds());
  // The right call stores it in alice's namespace: alice finds it there, bob does not.
  s = call(req, "x-kvcache-peer", kSecret);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(holds());
  ClientOptions o;
  o.address = nodes_[0]->address();
  o.bearer_token = kTokenA;
  std::unique_ptr<CacheClient> direct = *CacheClient::Connect(o);
  std::vector<uint8_t> out(ns_a_.chunk_bytes);
  absl::StatusOr<size_t> n = direct->Fetch(ns_a_, std::vector<ChunkKey>{key}, out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE(out == p.payloads);
  EXPECT_EQ(MinCopies(CopiesOf(ns_b_, kTokenB, p)), 0);
}

}  // namespace
}  // namespace kvc::client
