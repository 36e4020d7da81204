#include "client/cluster_client.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/task_pool.h"
#include "client/prefix_hash.h"
#include "client/stats.h"
#include "cluster/etcd.h"
#include "cluster/placement.h"

namespace kvc::client {
using storage::ChunkKey;

struct ClusterClient::Node {
  cluster::NodeInfo info;
  std::shared_ptr<CacheClient> client;
  Mutex mu;
  std::set<uint32_t> namespaces ABSL_GUARDED_BY(mu);  // registered on this node
  std::atomic<int64_t> skip_until_ms{0};              // steady clock
};

namespace {

int64_t NowMs() { return SteadyMillis(); }

// A node's failure worth skipping it for: it did not answer, not a refusal of the request.
bool NodeTrouble(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) ||
         absl::IsAborted(s) || absl::IsInternal(s) || absl::IsUnknown(s);
}

std::vector<std::string> Ids(const std::vector<std::shared_ptr<ClusterClient::Node>>& nodes) {
  std::vector<std::string> ids;
  ids.reserve(nodes.size());
  for (const auto& n : nodes) ids.push_back(n->info.id);
  return ids;
}
}  // namespace

absl::StatusOr<std::unique_ptr<CacheApi>> ConnectCache(const ClientOptions& options) {
  if (absl::StartsWith(options.address, "etcd://")) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> c, ClusterClient::Connect(options));
    return std::unique_ptr<CacheApi>(std::move(c));
  }
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheClient> c, CacheClient::Connect(options));
  return std::unique_ptr<CacheApi>(std::move(c));
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(
    const ClientOptions& options) {
  KVC_ASSIGN_OR_RETURN(std::string endpoints, cluster::ParseEtcdUrl(options.address));
  if (!options.shm_socket.empty()) {
    return absl::InvalidArgumentError(
        "shared memory maps one daemon's arena; a cluster client uses gRPC to every node");
  }
  std::unique_ptr<ClusterClient> c(new ClusterClient(options));
  absl::StatusOr<std::unique_ptr<cluster::MembershipView>> view =
      cluster::MembershipView::Open(endpoints, options.etcd);
  if (!view.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot read the cluster membership from ",
                                               options.address, ": ", view.status().message()));
  }
  c->view_ = *std::move(view);
  if (options.repair_grace_ms >= 0)
    c->repair_thread_ = std::thread([p = c.get()] { p->RepairLoop(); });
  return c;
}

ClusterClient::~ClusterClient() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  repair_cv_.notify_all();
  if (repair_thread_.joinable()) repair_thread_.join();
}

void ClusterClient::RepairLoop() {
  MutexLock lk(mu_);
  while (true) {
    while (!stop_ && repairs_.empty()) repair_cv_.wait(mu_);
    if (stop_) return;
    RepairJob job = std::move(repairs_.front());
    repairs_.pop_front();
    lk.unlock();
    Repair(job);
    lk.lock();
    repairing_.erase(job.key);
  }
}

void ClusterClient::Repair(const RepairJob& job) {
  std::vector<std::shared_ptr<Node>> nodes = Members();
  auto find = [&](const std::string& id) -> Node* {
    for (const auto& n : nodes) {
      if (n->info.id == id) return n.get();
    }
    return nullptr;
  };
  Node* from = find(job.from);
  if (from == nullptr || !EnsureNamespace(*from, job.ns).ok()) return;
  std::vector<uint8_t> payload(job.ns.chunk_bytes);
  const ChunkKey key = job.key;
  absl::StatusOr<size_t> got = from->client->Fetch(job.ns, std::span(&key, 1), payload);
  if (!got.ok() || *got != 1) return;  // evicted or gone since: nothing to copy
  ChunkToStore chunk{job.parent, job.tokens, payload,
                     job.ns.caller_keys ? std::optional(key) : std::nullopt,
                     /*repair_copy=*/true};
  for (const std::string& id : job.to) {
    Node* to = find(id);
    if (to == nullptr || !EnsureNamespace(*to, job.ns).ok()) continue;
    absl::StatusOr<StoreResult> st =
        to->client->StoreChunks(job.ns, std::span(&chunk, 1), Durability::kDurable, 0);
    if (!st.ok() || st->keys.size() != 1 || st->keys[0] != key) continue;
    MutexLock lk(mu_);
    ++counters_.chunks_repaired;
    ++counters_.nodes[id].chunks_stored;
  }
}

std::string ClusterClient::RandomSalt() {
  std::random_device rd;
  return absl::StrCat("reader-", rd(), "-", rd());
}

uint32_t ClusterClient::ReplicasFor(size_t members) const {
  const uint32_t want = options_.replicas > 0 ? options_.replicas : (members >= 2 ? 2 : 1);
  return static_cast<uint32_t>(std::min<size_t>(want, members));
}

uint32_t ClusterClient::replicas() const { return ReplicasFor(membership()->nodes.size()); }

std::vector<std::string> ClusterClient::Owners(const ChunkKey& key) const {
  std::shared_ptr<const Membership> m = membership();
  std::vector<std::string> ids;
  for (const auto& n : m->nodes) ids.push_back(n.id);
  std::vector<std::string> owners;
  for (size_t i : cluster::RankNodes(key, ids)) {
    if (owners.size() == ReplicasFor(ids.size())) break;
    owners.push_back(ids[i]);
  }
  return owners;
}

std::vector<std::shared_ptr<ClusterClient::Node>> ClusterClient::Members() {
  std::shared_ptr<const Membership> m = membership();
  std::vector<std::shared_ptr<Node>> out;
  MutexLock lk(mu_);
  for (const cluster::NodeInfo& info : m->nodes) {
    std::shared_ptr<Node>& n = nodes_[info.id];
    if (!n || n->info.address != info.address || n->info.generation != info.generation) {
      ClientOptions o = options_;
      o.address = info.address;
      o.shm_socket.clear();
      absl::StatusOr<std::unique_ptr<CacheClient>> client = CacheClient::Connect(o);
      if (!client.ok()) continue;  // a bad CA file fails every node alike, at Connect
      auto fresh = std::make_shared<Node>();
      fresh->info = info;
      fresh->client = *std::move(client);
      n = std::move(fresh);
    }
    out.push_back(n);
  }
  return out;
}

bool ClusterClient::Skipped(const Node& node) const { return node.skip_until_ms.load() > NowMs(); }

void ClusterClient::MarkFailed(Node& node, const absl::Status& why) {
  MutexLock lk(mu_);
  ++counters_.nodes[node.info.id].failures;
  if (NodeTrouble(why)) node.skip_until_ms.store(NowMs() + options_.node_backoff_ms);
}

absl::Status ClusterClient::EnsureNamespace(Node& node, const RemoteNamespace& ns) {
  Registration reg;
  {
    MutexLock lk(node.mu);
    if (node.namespaces.count(ns.id) > 0) return absl::OkStatus();
  }
  {
    MutexLock lk(mu_);
    auto it = namespaces_.find(ns.id);
    if (it == namespaces_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("namespace ", ns.id, " was not registered through this cluster client"));
    }
    reg = it->second;
  }
  KVC_ASSIGN_OR_RETURN(RemoteNamespace got, reg.registrar(*node.client));
  if (got.id != ns.id || got.root != ns.root || got.chunk_bytes != ns.chunk_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node.info.id, " gives the namespace id ", got.id, " (expected ",
                     ns.id, "): is it running with --cluster?"));
  }
  MutexLock lk(node.mu);
  node.namespaces.insert(ns.id);
  return absl::OkStatus();
}

absl::StatusOr<RemoteNamespace> ClusterClient::RegisterNamespace(
    const std::string& model_config_json, const std::string& model_id, uint32_t chunk_tokens) {
  return Register([=](CacheClient& c) {
    return c.RegisterNamespace(model_config_json, model_id, chunk_tokens);
  });
}

absl::StatusOr<RemoteNamespace> ClusterClient::RegisterKeyedNamespace(const std::string& model_id,
                                                                      uint64_t page_bytes,
                                                                      uint32_t page_tokens) {
  return Register(
      [=](CacheClient& c) { return c.RegisterKeyedNamespace(model_id, page_bytes, page_tokens); });
}

absl::StatusOr<RemoteNamespace> ClusterClient::Register(const Registrar& registrar) {
  std::vector<std::shared_ptr<Node>> nodes = Members();
  if (nodes.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the cluster at ", options_.address, " has no nodes"));
  }
  std::vector<absl::StatusOr<RemoteNamespace>> got(nodes.size(), absl::UnknownError("not asked"));
  pool_->ParallelFor(nodes.size(), [&](size_t i) { got[i] = registrar(*nodes[i]->client); });
  std::optional<RemoteNamespace> ns;
  absl::Status first_error = absl::OkStatus();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!got[i].ok()) {
      if (first_error.ok()) {
        first_error =
            absl::Status(got[i].status().code(),
                         absl::StrCat("node ", nodes[i]->info.id, ": ", got[i].status().message()));
      }
      if (NodeTrouble(got[i].status())) MarkFailed(*nodes[i], got[i].status());
      continue;
    }
    if (!ns) {
      ns = *got[i];
    } else if (got[i]->id != ns->id || got[i]->root != ns->root ||
               got[i]->chunk_bytes != ns->chunk_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nodes disagree on the namespace: node ", nodes[i]->info.id, " gives id ", got[i]->id,
          ", another ", ns->id, " (is every node running with --cluster?)"));
    }
  }
  // A request every node refuses (a bad config) is the caller's error; a node that is down
  // learns the namespace when it is next used.
  if (!ns) return first_error;
  {
    MutexLock lk(mu_);
    namespaces_[ns->id] = {registrar, *ns};
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!got[i].ok()) continue;
    MutexLock lk(nodes[i]->mu);
    nodes[i]->namespaces.insert(ns->id);
  }
  return *ns;
}

absl::StatusOr<LookupResult> ClusterClient::Lookup(const RemoteNamespace& ns,
                                                   std::span<const uint32_t> tokens) {
  for (size_t i = 0; ns.vocab_size > 0 && i < tokens.size(); ++i) {
    if (tokens[i] >= ns.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", i, "] is ", tokens[i], ", outside the vocabulary of ", ns.vocab_size));
    }
  }
  if (ns.caller_keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace ", ns.id, " is caller-keyed: look up by keys (LookupKeys), not tokens"));
  }
  std::vector<ChunkKey> keys = Keys(ns, tokens);  // hashed once; every node is asked by key
  return LookupImpl(ns, std::move(keys), tokens);
}

absl::StatusOr<LookupResult> ClusterClient::LookupKeys(const RemoteNamespace& ns,
                                                       std::span<const ChunkKey> keys) {
  return LookupImpl(ns, std::vector<ChunkKey>(keys.begin(), keys.end()), {});
}

absl::StatusOr<LookupResult> ClusterClient::LookupImpl(const RemoteNamespace& ns,
                                                       std::vector<ChunkKey> keys,
                                                       std::span<const uint32_t> tokens) {
  std::vector<std::shared_ptr<Node>> nodes = Members();
  LookupResult r;
  r.keys = std::move(keys);
  if (nodes.empty()) return r;
  const std::vector<std::string> ids = Ids(nodes);
  const uint32_t want = ReplicasFor(nodes.size());
  // Lookup by ranking: each key goes to its R owners and the next lookup_extra_nodes,
  // unless the cluster is unsettled — the membership changed within the repair grace
  // period, or repairs are queued or running — when a copy may sit anywhere: then every
  // member is asked about every key.
  bool wide = false;
  {
    MutexLock lk(mu_);
    const uint64_t version = membership()->version;
    if (version != seen_version_) {
      seen_version_ = version;
      membership_changed_ = Clock::now();
    }
    wide = Clock::now() - membership_changed_ <
               std::chrono::milliseconds(std::max(options_.repair_grace_ms, 0)) ||
           !repairs_.empty() || !repairing_.empty();
  }
  const cluster::LookupPlan plan = cluster::PlanLookup(
      r.keys, ids, wide ? nodes.size() : static_cast<size_t>(want) + options_.lookup_extra_nodes);
  std::vector<absl::StatusOr<LookupResult>> per(nodes.size(), absl::UnknownError("not asked"));
  std::vector<char> skipped(nodes.size(), 0);
  pool_->ParallelFor(nodes.size(), [&](size_t i) {
    if (plan[i].empty()) return;
    if (Skipped(*nodes[i])) {
      skipped[i] = 1;
      per[i] = absl::UnavailableError(
          absl::StrCat("node ", nodes[i]->info.id, " skipped after a recent failure"));
      return;
    }
    absl::Status s = EnsureNamespace(*nodes[i], ns);
    if (!s.ok()) {
      per[i] = s;
      return;
    }
    std::vector<ChunkKey> asked;
    asked.reserve(plan[i].size());
    for (size_t c : plan[i]) asked.push_back(r.keys[c]);
    absl::StatusOr<LookupResult> got = nodes[i]->client->LookupKeysEvery(ns, asked);
    if (!got.ok()) {
      per[i] = got.status();
      return;
    }
    // Back to one tier per key of the whole lookup (none where this node was not asked).
    LookupResult all;
    all.tiers.assign(r.keys.size(), Tier::kNone);
    for (size_t j = 0; j < plan[i].size() && j < got->tiers.size(); ++j)
      all.tiers[plan[i][j]] = got->tiers[j];
    for (uint32_t j : got->deleted) {
      if (j < plan[i].size()) all.deleted.push_back(static_cast<uint32_t>(plan[i][j]));
    }
    per[i] = std::move(all);
  });
  size_t asked = 0, answered = 0;
  absl::Status first_error = absl::OkStatus();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (plan[i].empty()) continue;
    ++asked;
    if (per[i].ok()) {  // LookupKeysEvery answers a tier for every key, or an error
      ++answered;
      continue;
    }
    if (first_error.ok()) first_error = per[i].status();
    if (!skipped[i]) MarkFailed(*nodes[i], per[i].status());
  }
  if (answered == 0 && asked > 0) {
    return absl::UnavailableError(
        absl::StrCat("no node of the cluster answered Lookup: ", first_error.message()));
  }
  MutexLock lk(mu_);
  const cluster::FanOut fan = cluster::FanOutOf(plan);
  ++counters_.lookups;
  counters_.wide_lookups += wide ? 1 : 0;
  counters_.lookup_nodes_asked += fan.nodes;
  counters_.lookup_keys_asked += fan.keys;
  if (holders_.size() > (1u << 16)) holders_.clear();  // a hint cache, bounded
  // Repairs only on a settled cluster: every node asked answered, and the membership has
  // not changed for the grace period (a restarting node keeps its chunks and is not
  // replaced).
  const bool may_repair =
      options_.repair_grace_ms >= 0 && answered == asked &&
      Clock::now() - membership_changed_ >= std::chrono::milliseconds(options_.repair_grace_ms);
  // A chunk some node says its tenant deleted is missing everywhere: a node that still
  // holds a copy missed the Delete (its repair erases it), and nothing copies it back.
  std::vector<char> deleted(r.keys.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!per[i].ok()) continue;
    for (uint32_t c : per[i]->deleted) deleted[c] = 1;
  }
  for (size_t c = 0; c < r.keys.size(); ++c) {
    std::vector<std::string> holders;
    Tier tier = Tier::kNone;
    if (deleted[c]) {
      holders_.erase(r.keys[c]);
      continue;
    }
    // Nodes with a copy of their own first (best-ranked first), then those that would read
    // it from the shared tier (TIER_RADOS: under RADOS every node can): a fetch goes to a
    // copy in RAM or on SSD when there is one.
    const std::vector<size_t> ranked = cluster::RankNodes(r.keys[c], ids);
    for (const bool shared : {false, true}) {
      for (size_t i : ranked) {
        if (!per[i].ok()) continue;
        const Tier t = per[i]->tiers[c];
        if (t == Tier::kNone || (t == Tier::kRados) != shared) continue;
        if (holders.empty()) tier = t;
        holders.push_back(ids[i]);
      }
    }
    if (holders.empty()) {
      holders_.erase(r.keys[c]);
      continue;
    }
    if (r.matched_chunks == c) {
      ++r.matched_chunks;
      r.tiers.push_back(tier);
      r.nodes.push_back(holders.front());
    }
    // A copy is stored by its key (caller-keyed) or by its tokens, which only Lookup has.
    const bool storable = ns.caller_keys || tokens.size() >= (c + 1) * ns.chunk_tokens;
    if (may_repair && storable && holders.size() < want && repairs_.size() < 4096 &&
        repairing_.insert(r.keys[c]).second) {
      RepairJob job{ns,
                    c == 0 ? std::nullopt : std::optional<ChunkKey>(r.keys[c - 1]),
                    ns.caller_keys
                        ? std::vector<uint32_t>{}
                        : std::vector<uint32_t>(tokens.begin() + c * ns.chunk_tokens,
                                                tokens.begin() + (c + 1) * ns.chunk_tokens),
                    r.keys[c],
                    holders.front(),
                    {}};
      for (size_t i : cluster::RankNodes(r.keys[c], ids)) {  // the owners that lack it, best first
        if (job.to.size() + holders.size() == want) break;
        if (std::find(holders.begin(), holders.end(), ids[i]) == holders.end()) {
          job.to.push_back(ids[i]);
        }
      }
      repairs_.push_back(std::move(job));
      repair_cv_.notify_one();
    }
    holders_[r.keys[c]] = std::move(holders);
  }
  return r;
}

absl::StatusOr<size_t> ClusterClient::Fetch(const RemoteNamespace& ns,
                                            std::span<const ChunkKey> keys, std::span<uint8_t> out,
                                            std::string* short_reason) {
  if (out.size() != keys.size() * ns.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("output buffer is ", out.size(), " bytes; ",
                                                   keys.size(), " chunks need ",
                                                   keys.size() * ns.chunk_bytes));
  }
  std::vector<std::shared_ptr<Node>> nodes = Members();
  const std::vector<std::string> ids = Ids(nodes);
  // Each chunk's candidates, in the order to ask them: the holders a recent Lookup saw,
  // then every other member by rank; nodes being skipped go last.
  std::vector<std::vector<size_t>> cands(keys.size());
  {
    MutexLock lk(mu_);
    for (size_t c = 0; c < keys.size(); ++c) {
      std::vector<size_t> seen;  // the holders a recent Lookup saw, still members
      if (auto it = holders_.find(keys[c]); it != holders_.end()) {
        for (const std::string& id : it->second) {
          auto pos = std::find(ids.begin(), ids.end(), id);
          if (pos != ids.end()) seen.push_back(pos - ids.begin());
        }
      }
      std::vector<size_t> order =
          cluster::FetchOrder(keys[c], ids, seen, ReplicasFor(ids.size()), read_salt_);
      std::stable_partition(order.begin(), order.end(),
                            [&](size_t i) { return !Skipped(*nodes[i]); });
      cands[c] = std::move(order);
    }
  }
  std::vector<size_t> next(keys.size(), 0);  // index into cands[c] of the node to ask
  std::vector<bool> done(keys.size(), false);
  std::string first_missing_reason;
  uint64_t failovers = 0;
  std::map<std::string, uint64_t> served;
  while (true) {
    // Only the leading run is useful: stop at the first chunk no node is left to ask for.
    size_t limit = keys.size();
    for (size_t c = 0; c < keys.size(); ++c) {
      if (!done[c] && next[c] >= cands[c].size()) {
        limit = c;
        break;
      }
    }
    std::map<size_t, std::vector<size_t>> share;  // node → chunk indices, in order
    for (size_t c = 0; c < limit; ++c) {
      if (!done[c]) share[cands[c][next[c]]].push_back(c);
    }
    if (share.empty()) break;
    std::vector<std::pair<size_t, std::vector<size_t>>> work(share.begin(), share.end());
    std::vector<absl::StatusOr<size_t>> got(work.size(), absl::UnknownError("not asked"));
    std::vector<std::string> reasons(work.size());
    pool_->ParallelFor(work.size(), [&](size_t w) {
      Node& node = *nodes[work[w].first];
      const std::vector<size_t>& idx = work[w].second;
      if (absl::Status s = EnsureNamespace(node, ns); !s.ok()) {
        got[w] = s;
        return;
      }
      std::vector<ChunkKey> sub;
      std::vector<uint8_t*> dst;
      sub.reserve(idx.size());
      dst.reserve(idx.size());
      for (size_t c : idx) {
        sub.push_back(keys[c]);
        dst.push_back(out.data() + c * ns.chunk_bytes);  // each chunk straight to its place
      }
      got[w] = node.client->FetchScattered(ns, sub, dst, &reasons[w]);
    });
    for (size_t w = 0; w < work.size(); ++w) {
      Node& node = *nodes[work[w].first];
      const std::vector<size_t>& idx = work[w].second;
      if (!got[w].ok()) {
        MarkFailed(node, got[w].status());
        for (size_t c : idx) ++next[c];  // ask the next node for all of them
        continue;
      }
      const size_t n = *got[w];
      for (size_t j = 0; j < n; ++j) {
        done[idx[j]] = true;
        if (next[idx[j]] > 0) ++failovers;
      }
      served[node.info.id] += n;
      if (n < idx.size()) {  // idx[n] is not on this node; those after it were not asked
        ++next[idx[n]];
        if (first_missing_reason.empty()) first_missing_reason = reasons[w];
      }
    }
  }
  size_t leading = 0;
  while (leading < keys.size() && done[leading]) ++leading;
  if (leading < keys.size() && short_reason != nullptr) {
    *short_reason =
        absl::StrCat("chunk ", leading, " (", keys[leading].Hex(), ") is on no reachable node",
                     first_missing_reason.empty() ? "" : ": ", first_missing_reason);
  }
  {
    MutexLock lk(mu_);
    counters_.fetch_failovers += failovers;
    for (const auto& [id, n] : served) counters_.nodes[id].chunks_fetched += n;
  }
  return leading;
}

absl::StatusOr<StoreResult> ClusterClient::Store(const RemoteNamespace& ns,
                                                 std::optional<ChunkKey> parent,
                                                 std::span<const uint32_t> tokens,
                                                 std::span<const uint8_t> payloads,
                                                 Durability durability, uint32_t ttl_seconds) {
  KVC_ASSIGN_OR_RETURN(ChainedChunks chained, ChainChunks(ns, parent, tokens, payloads));
  KVC_ASSIGN_OR_RETURN(StoreResult r,
                       StoreOnOwners(ns, chained.chunks, chained.keys, durability, ttl_seconds));
  r.tokens = chained.chunks.size() * ns.chunk_tokens;
  return r;
}

absl::StatusOr<StoreResult> ClusterClient::StoreChunks(const RemoteNamespace& ns,
                                                       std::span<const ChunkToStore> chunks,
                                                       Durability durability,
                                                       uint32_t ttl_seconds) {
  std::vector<ChunkKey> keys;
  for (size_t c = 0; c < chunks.size(); ++c) {
    KVC_RETURN_IF_ERROR(CheckChunk(ns, chunks[c], c));
    keys.push_back(ns.caller_keys ? *chunks[c].key
                                  : NextChunkKey(chunks[c].parent ? *chunks[c].parent : ns.root,
                                                 chunks[c].tokens));
  }
  return StoreOnOwners(ns, chunks, keys, durability, ttl_seconds);
}

absl::StatusOr<StoreResult> ClusterClient::StoreOnOwners(const RemoteNamespace& ns,
                                                         std::span<const ChunkToStore> each,
                                                         std::span<const ChunkKey> keys,
                                                         Durability durability,
                                                         uint32_t ttl_seconds) {
  const size_t chunks = each.size();
  std::vector<std::shared_ptr<Node>> nodes = Members();
  if (nodes.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the cluster at ", options_.address, " has no nodes"));
  }
  const std::vector<std::string> ids = Ids(nodes);
  const uint32_t want = ReplicasFor(nodes.size());
  StoreResult r;
  r.keys.assign(keys.begin(), keys.end());
  std::vector<std::vector<size_t>> order(chunks);  // each chunk's nodes by rank
  for (size_t c = 0; c < chunks; ++c) {
    order[c] = cluster::RankNodes(keys[c], ids);
    // The owners are the first `want` by rank; one being skipped is stood in for by the
    // next node (its copy is found by the reads' fallback along the ranking).
    std::stable_partition(order[c].begin(), order[c].end(),
                          [&](size_t i) { return !Skipped(*nodes[i]); });
  }
  std::vector<uint32_t> copies(chunks, 0);
  std::vector<size_t> next(chunks, 0);
  absl::Status last_error = absl::OkStatus();
  while (true) {
    std::map<size_t, std::vector<size_t>> share;
    for (size_t c = 0; c < chunks; ++c) {
      // Ask as many more nodes as copies are missing.
      for (uint32_t asked = copies[c]; asked < want && next[c] < order[c].size(); ++asked) {
        share[order[c][next[c]++]].push_back(c);
      }
    }
    if (share.empty()) break;
    std::vector<std::pair<size_t, std::vector<size_t>>> work(share.begin(), share.end());
    std::vector<absl::StatusOr<StoreResult>> got(work.size(), absl::UnknownError("not asked"));
    pool_->ParallelFor(work.size(), [&](size_t w) {
      Node& node = *nodes[work[w].first];
      if (absl::Status s = EnsureNamespace(node, ns); !s.ok()) {
        got[w] = s;
        return;
      }
      std::vector<ChunkToStore> sub;
      for (size_t c : work[w].second) sub.push_back(each[c]);
      got[w] = node.client->StoreChunks(ns, sub, durability, ttl_seconds);
    });
    for (size_t w = 0; w < work.size(); ++w) {
      Node& node = *nodes[work[w].first];
      if (!got[w].ok()) {
        MarkFailed(node, got[w].status());
        last_error = absl::Status(got[w].status().code(), absl::StrCat("node ", node.info.id, ": ",
                                                                       got[w].status().message()));
        if (!NodeTrouble(got[w].status())) return last_error;  // the request is wrong
        continue;
      }
      for (size_t c : work[w].second) ++copies[c];
      r.stored += got[w]->stored;
      r.already_present += got[w]->already_present;
      MutexLock lk(mu_);
      counters_.nodes[node.info.id].chunks_stored += got[w]->stored + got[w]->already_present;
    }
  }
  for (size_t c = 0; c < chunks; ++c) {
    if (copies[c] < want) {
      return absl::UnavailableError(absl::StrCat("chunk ", c, " has ", copies[c], " of ", want,
                                                 " copies: ", last_error.message()));
    }
  }
  return r;
}

namespace {
// Runs `call` on every member that is not being skipped and sums the counts.
template <typename Call>
absl::StatusOr<uint32_t> OnEveryNode(TaskPool& pool,
                                     const std::vector<std::shared_ptr<ClusterClient::Node>>& nodes,
                                     Call call) {
  std::vector<absl::StatusOr<uint32_t>> got(nodes.size(), 0u);
  pool.ParallelFor(nodes.size(), [&](size_t i) { got[i] = call(*nodes[i]); });
  uint32_t sum = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!got[i].ok()) {
      return absl::Status(got[i].status().code(), absl::StrCat("node ", nodes[i]->info.id, ": ",
                                                               got[i].status().message()));
    }
    sum += *got[i];
  }
  return sum;
}
}  // namespace

absl::StatusOr<uint32_t> ClusterClient::Pin(const RemoteNamespace& ns,
                                            std::span<const ChunkKey> keys, uint32_t ttl_seconds) {
  return OnEveryNode(*pool_, Members(), [&](Node& n) -> absl::StatusOr<uint32_t> {
    KVC_RETURN_IF_ERROR(EnsureNamespace(n, ns));
    return n.client->Pin(ns, keys, ttl_seconds);
  });
}

absl::StatusOr<uint32_t> ClusterClient::Unpin(const RemoteNamespace& ns,
                                              std::span<const ChunkKey> keys) {
  return OnEveryNode(*pool_, Members(), [&](Node& n) -> absl::StatusOr<uint32_t> {
    KVC_RETURN_IF_ERROR(EnsureNamespace(n, ns));
    return n.client->Unpin(ns, keys);
  });
}

absl::StatusOr<uint32_t> ClusterClient::Delete(const RemoteNamespace& ns,
                                               std::span<const ChunkKey> keys) {
  {
    MutexLock lk(mu_);
    for (const ChunkKey& k : keys) holders_.erase(k);
  }
  return OnEveryNode(*pool_, Members(), [&](Node& n) -> absl::StatusOr<uint32_t> {
    KVC_RETURN_IF_ERROR(EnsureNamespace(n, ns));
    return n.client->Delete(ns, keys);
  });
}

ClusterClient::Counters ClusterClient::counters() const {
  MutexLock lk(mu_);
  return counters_;
}

std::vector<NodeStats> ClusterClient::Stats() {
  std::vector<std::shared_ptr<Node>> nodes = Members();
  std::vector<NodeStats> out(nodes.size());
  pool_->ParallelFor(nodes.size(), [&](size_t i) {
    out[i].node = nodes[i]->info;
    out[i].stats = nodes[i]->client->Stats();
  });
  return out;
}

}  // namespace kvc::client
