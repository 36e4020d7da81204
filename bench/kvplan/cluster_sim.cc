#include "bench/kvplan/cluster_sim.h"

#include <algorithm>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvplan/capacity.h"
#include "bench/trace/tier_sim.h"
#include "cluster/placement.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"

namespace kvc {
namespace {

using storage::ChunkKey;
using storage::ChunkKeyHash;

// One node: a fixed number of chunk slots, least recently used evicted first.
struct Node {
  std::string id;
  int64_t capacity = -1;  // slots; -1 unlimited
  bool live = true;
  std::list<ChunkKey> lru;  // most recent first
  std::unordered_map<ChunkKey, std::list<ChunkKey>::iterator, ChunkKeyHash> where;
  uint64_t served = 0, evictions = 0;
};

class ClusterModel {
 public:
  ClusterModel(int nodes, int replicas, int64_t slots_per_node, uint64_t chunk_bytes,
               bool anti_entropy, bool rados)
      : replicas_(replicas), chunk_bytes_(chunk_bytes), anti_entropy_(anti_entropy), rados_(rados) {
    for (int i = 0; i < nodes; ++i) {
      Node n;
      n.id = "n" + std::to_string(i);
      n.capacity = slots_per_node;
      nodes_.push_back(std::move(n));
      live_ids_.push_back(nodes_.back().id);
      live_index_.push_back(static_cast<size_t>(i));
    }
  }

  // The leading cached chunks of `keys` (read, and read-repaired), then the rest stored;
  // `reader`: the client's read salt (its pick among a chunk's copies).
  size_t Serve(const std::vector<ChunkKey>& keys, const std::string& reader) {
    size_t hit = 0;
    while (hit < keys.size()) {
      const ChunkKey& k = keys[hit];
      if (Holders(k) == 0) {
        if (!rados_ || !in_rados_.contains(k)) break;
        // No live node holds it: its first owner reads it from RADOS and keeps a copy.
        rados_read_bytes_ += chunk_bytes_;
        ++rados_hits_;
        Insert(Owners(k).front(), k);
        ++hit;
        continue;
      }
      const std::vector<size_t> owners = Owners(k);
      // Read from the client's pick among the live holders (cluster::FirstHolder, as the
      // clients do), holders in rank order.
      std::vector<size_t> holders;
      for (size_t i : RankLive(k)) {
        if (nodes_[i].where.contains(k)) holders.push_back(i);
      }
      Node& from = nodes_[holders[cluster::FirstHolder(k, reader, holders.size())]];
      Touch(from, k);
      ++from.served;
      // Read repair: the missing owners get a copy.
      for (size_t i : owners) {
        if (!nodes_[i].where.contains(k)) {
          Insert(i, k);
          read_repair_bytes_ += chunk_bytes_;
        }
      }
      ++hit;
    }
    for (size_t c = hit; c < keys.size(); ++c) {
      for (size_t i : Owners(keys[c])) Insert(i, keys[c]);
      // Each owner stores it, but the payload crosses once: the others renew the object.
      if (rados_ && in_rados_.insert(keys[c]).second) rados_write_bytes_ += chunk_bytes_;
    }
    return hit;
  }

  // Kills the live node holding the most chunks; returns its id and the chunks that had
  // no other copy.
  std::pair<std::string, uint64_t> FailFullestNode() {
    size_t dead = live_index_.front();
    for (size_t i : live_index_) {
      if (nodes_[i].where.size() > nodes_[dead].where.size()) dead = i;
    }
    Node& d = nodes_[dead];
    d.live = false;
    live_ids_.clear();
    live_index_.clear();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].live) {
        live_ids_.push_back(nodes_[i].id);
        live_index_.push_back(i);
      }
    }
    uint64_t lost = 0;
    for (const ChunkKey& k : d.lru) {
      auto h = holders_.find(k);
      if (h != holders_.end() && --h->second == 0) {
        holders_.erase(h);
        if (!in_rados_.contains(k)) ++lost;  // RADOS still holds it otherwise
        continue;
      }
      if (!anti_entropy_) continue;
      // Anti-entropy: a surviving copy is sent to the owners the new membership names.
      for (size_t i : Owners(k)) {
        if (!nodes_[i].where.contains(k)) {
          Insert(i, k, /*cold=*/true);
          anti_entropy_bytes_ += chunk_bytes_;
        }
      }
    }
    d.lru.clear();
    d.where.clear();
    return {d.id, lost};
  }

  uint64_t read_repair_bytes() const { return read_repair_bytes_; }
  uint64_t rados_read_bytes() const { return rados_read_bytes_; }
  uint64_t rados_write_bytes() const { return rados_write_bytes_; }
  uint64_t rados_hits() const { return rados_hits_; }
  uint64_t rados_chunks() const { return in_rados_.size(); }
  uint64_t anti_entropy_bytes() const { return anti_entropy_bytes_; }
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  int Holders(const ChunkKey& k) const {
    auto h = holders_.find(k);
    return h == holders_.end() ? 0 : h->second;
  }
  std::vector<size_t> RankLive(const ChunkKey& k) const {
    std::vector<size_t> out;
    for (size_t r : cluster::RankNodes(k, live_ids_)) out.push_back(live_index_[r]);
    return out;
  }
  std::vector<size_t> Owners(const ChunkKey& k) const {
    std::vector<size_t> out;
    const size_t want = std::min<size_t>(static_cast<size_t>(replicas_), live_ids_.size());
    for (size_t r : cluster::TopRanked(k, live_ids_, want)) out.push_back(live_index_[r]);
    return out;
  }
  void Touch(Node& n, const ChunkKey& k) { n.lru.splice(n.lru.begin(), n.lru, n.where.at(k)); }
  // cold: the copy enters as least recently used (a repair copy nobody asked for must not
  // push out what requests are using; measured: entering as most recent, anti-entropy
  // lowered the hit rate when nodes were full).
  void Insert(size_t i, const ChunkKey& k, bool cold = false) {
    Node& n = nodes_[i];
    if (n.where.contains(k)) {
      if (!cold) Touch(n, k);
      return;
    }
    if (n.capacity == 0) return;
    if (n.capacity > 0 && static_cast<int64_t>(n.where.size()) >= n.capacity) {
      const ChunkKey victim = n.lru.back();
      n.lru.pop_back();
      n.where.erase(victim);
      ++n.evictions;
      auto h = holders_.find(victim);
      if (h != holders_.end() && --h->second == 0) holders_.erase(h);
    }
    n.where[k] = cold ? n.lru.insert(n.lru.end(), k) : n.lru.insert(n.lru.begin(), k);
    ++holders_[k];
  }

  int replicas_;
  uint64_t chunk_bytes_;
  bool anti_entropy_;
  bool rados_;
  std::unordered_set<ChunkKey, ChunkKeyHash> in_rados_;  // every chunk stored (rados_)
  uint64_t rados_read_bytes_ = 0, rados_write_bytes_ = 0, rados_hits_ = 0;
  std::vector<Node> nodes_;
  std::vector<std::string> live_ids_;
  std::vector<size_t> live_index_;
  std::unordered_map<ChunkKey, int, ChunkKeyHash> holders_;  // live copies of each chunk
  uint64_t read_repair_bytes_ = 0, anti_entropy_bytes_ = 0;
};

struct Window {
  double from_s = 0;
  uint64_t prompt_tokens = 0, hit_tokens = 0;
  double hit_rate() const {
    return prompt_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens) : 0;
  }
};

nlohmann::json Balance(const std::vector<Node>& nodes) {
  std::vector<double> held, served;
  for (const Node& n : nodes) {
    if (!n.live) continue;
    held.push_back(static_cast<double>(n.where.size()));
    served.push_back(static_cast<double>(n.served));
  }
  const auto stats = [](const std::vector<double>& v) {
    double sum = 0, most = 0, least = v.empty() ? 0 : v[0];
    for (double x : v) {
      sum += x;
      most = std::max(most, x);
      least = std::min(least, x);
    }
    const double mean = v.empty() ? 0 : sum / static_cast<double>(v.size());
    return nlohmann::json{{"mean", mean},
                          {"max", most},
                          {"min", least},
                          {"max_over_mean", mean > 0 ? most / mean : 0}};
  };
  return {{"chunks_held", stats(held)}, {"chunks_served", stats(served)}};
}

}  // namespace

absl::StatusOr<nlohmann::json> RunClusterSimulate(const ModelConfig& config,
                                                  const SimulateOptions& o,
                                                  const ClusterSimOptions& c) {
  if (c.nodes < 1) return absl::InvalidArgumentError(absl::StrCat("--nodes is ", c.nodes));
  if (c.replicas < 1 || c.replicas > c.nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas is ", c.replicas, "; it must be 1 to --nodes (", c.nodes, ")"));
  }
  if (static_cast<int>(c.fail_at_hours.size()) > c.nodes - 1) {
    return absl::InvalidArgumentError(absl::StrCat(c.fail_at_hours.size(), " --fail-node-at for ",
                                                   c.nodes,
                                                   " nodes: at most one node must remain"));
  }
  std::vector<double> fail_s;
  for (double h : c.fail_at_hours) {
    if (h < 0) return absl::InvalidArgumentError(absl::StrCat("--fail-node-at ", h, " is < 0"));
    fail_s.push_back(h * 3600);
  }
  std::sort(fail_s.begin(), fail_s.end());
  Workload w;
  w.context_tokens = o.chunk_tokens;
  w.chunk_tokens = o.chunk_tokens;
  KVC_ASSIGN_OR_RETURN(CapacityPlan plan, PlanCapacity(config, w));
  const uint64_t chunk_bytes = static_cast<uint64_t>(plan.layout.chunk_bytes);
  KVC_ASSIGN_OR_RETURN(std::vector<trace::Request> requests, trace::ReadTrace(o.trace, o.limit));
  if (requests.empty()) return absl::InvalidArgumentError("trace \"" + o.trace + "\" is empty");
  const auto keys = trace::RequestKeys(
      requests, o.chunk_tokens, static_cast<uint32_t>(config.vocab_size), storage::ChunkKey{});
  // Per node: RAM and SSD slots together (an LRU over both).
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  int64_t slots = -1;
  if (o.ram_gib >= 0 && o.ssd_gib >= 0) {
    slots = static_cast<int64_t>(o.ram_gib * kGiB /
                                 static_cast<double>(storage::RamSlotBytes(chunk_bytes))) +
            static_cast<int64_t>(o.ssd_gib * kGiB /
                                 static_cast<double>(storage::SlotBytesFor(chunk_bytes)));
  }
  nlohmann::json j;
  j["trace"] = {
      {"path", o.trace}, {"requests", requests.size()}, {"seconds", trace::TraceSeconds(requests)}};
  j["nodes"] = c.nodes;
  j["replicas"] = c.replicas;
  j["chunk_bytes"] = chunk_bytes;
  j["slots_per_node"] = slots;
  j["policies"] = nlohmann::json::array();
  const double start = requests.front().arrival_s;
  struct Policy {
    const char* name;
    bool anti_entropy, rados;
  };
  std::vector<Policy> policies = {{"read-repair-only", false, false},
                                  {"anti-entropy", true, false}};
  if (c.rados) policies.push_back({"rados", false, true});
  for (const Policy& policy : policies) {
    const bool anti_entropy = policy.anti_entropy;
    ClusterModel m(c.nodes, c.replicas, slots, chunk_bytes, anti_entropy, policy.rados);
    std::vector<Window> windows(1);
    nlohmann::json failures = nlohmann::json::array();
    size_t next_failure = 0;
    uint64_t prompt = 0, hit = 0;
    nlohmann::json balance_before;
    for (size_t r = 0; r < requests.size(); ++r) {
      const double t = requests[r].arrival_s - start;
      while (next_failure < fail_s.size() && t >= fail_s[next_failure]) {
        if (next_failure == 0) balance_before = Balance(m.nodes());
        const uint64_t ae_before = m.anti_entropy_bytes();
        auto [id, lost] = m.FailFullestNode();
        failures.push_back({{"at_hours", fail_s[next_failure] / 3600},
                            {"node", id},
                            {"chunks_without_a_copy", lost},
                            {"anti_entropy_bytes", m.anti_entropy_bytes() - ae_before}});
        windows.push_back(Window{fail_s[next_failure], 0, 0});
        ++next_failure;
      }
      // 64 clients, taking requests in turn: each has its own read salt.
      const size_t reused = m.Serve(keys[r], absl::StrCat("client-", r % 64));
      const uint64_t hit_tokens = reused * static_cast<uint64_t>(o.chunk_tokens);
      const uint64_t tokens = static_cast<uint64_t>(requests[r].input_tokens);
      prompt += tokens;
      hit += hit_tokens;
      windows.back().prompt_tokens += tokens;
      windows.back().hit_tokens += hit_tokens;
    }
    nlohmann::json wj = nlohmann::json::array();
    for (const Window& win : windows) {
      wj.push_back({{"from_hours", win.from_s / 3600}, {"hit_rate", win.hit_rate()}});
    }
    if (balance_before.is_null()) balance_before = Balance(m.nodes());
    nlohmann::json rados_j;
    if (policy.rados) {
      const uint64_t hit_chunks = hit / static_cast<uint64_t>(o.chunk_tokens);
      rados_j = {
          {"read_bytes", m.rados_read_bytes()},
          {"write_bytes", m.rados_write_bytes()},
          {"chunks_held", m.rados_chunks()},
          {"bytes_held", m.rados_chunks() * chunk_bytes},
          {"share_of_reused_chunks",
           hit_chunks ? static_cast<double>(m.rados_hits()) / static_cast<double>(hit_chunks) : 0}};
    }
    j["policies"].push_back(
        {{"name", policy.name},
         {"rados", rados_j},
         {"hit_rate", prompt ? static_cast<double>(hit) / static_cast<double>(prompt) : 0},
         {"windows", wj},
         {"failures", failures},
         {"read_repair_bytes", m.read_repair_bytes()},
         {"anti_entropy_bytes", m.anti_entropy_bytes()},
         {"balance_before_first_failure", balance_before},
         {"balance_at_end", Balance(m.nodes())}});
  }
  return j;
}

std::string ClusterSimulateToText(const nlohmann::json& j) {
  const int64_t slots = j["slots_per_node"].get<int64_t>();
  std::string out = absl::StrFormat(
      "trace %s: %d requests over %.0f s; %d nodes, R = %d, %s slots of %d B per node\n\n",
      j["trace"]["path"].get<std::string>(), j["trace"]["requests"].get<int64_t>(),
      j["trace"]["seconds"].get<double>(), j["nodes"].get<int>(), j["replicas"].get<int>(),
      slots < 0 ? std::string("unlimited") : absl::StrCat(slots), j["chunk_bytes"].get<int64_t>());
  for (const nlohmann::json& p : j["policies"]) {
    absl::StrAppendFormat(&out,
                          "%s: hit rate %.4f; repair moved %.2f GB (reads) + %.2f GB "
                          "(anti-entropy)\n",
                          p["name"].get<std::string>(), p["hit_rate"].get<double>(),
                          p["read_repair_bytes"].get<double>() / 1e9,
                          p["anti_entropy_bytes"].get<double>() / 1e9);
    for (const nlohmann::json& w : p["windows"]) {
      absl::StrAppendFormat(&out, "  from %.2f h: hit rate %.4f\n", w["from_hours"].get<double>(),
                            w["hit_rate"].get<double>());
    }
    if (!p["rados"].is_null()) {
      const nlohmann::json& r = p["rados"];
      absl::StrAppendFormat(&out,
                            "  RADOS: holds %.2f GB (%d chunks); wrote %.2f GB, read %.2f GB; "
                            "%.1f%% of reused chunks came from it\n",
                            r["bytes_held"].get<double>() / 1e9, r["chunks_held"].get<int64_t>(),
                            r["write_bytes"].get<double>() / 1e9,
                            r["read_bytes"].get<double>() / 1e9,
                            100 * r["share_of_reused_chunks"].get<double>());
    }
    for (const nlohmann::json& f : p["failures"]) {
      absl::StrAppendFormat(&out,
                            "  %.2f h: %s dies; %d chunks left with no copy; %.2f GB copied "
                            "at once\n",
                            f["at_hours"].get<double>(), f["node"].get<std::string>(),
                            f["chunks_without_a_copy"].get<int64_t>(),
                            f["anti_entropy_bytes"].get<double>() / 1e9);
    }
    const nlohmann::json& b = p["balance_before_first_failure"];
    absl::StrAppendFormat(&out,
                          "  balance: chunks held max/mean %.3f, chunks served max/mean %.3f\n",
                          b["chunks_held"]["max_over_mean"].get<double>(),
                          b["chunks_served"]["max_over_mean"].get<double>());
  }
  return out;
}

}  // namespace kvc
