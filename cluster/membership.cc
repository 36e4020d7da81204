#include "cluster/membership.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvc::cluster {

std::string NodeInfo::ToJson() const {
  nlohmann::json j = {{"id", id},
                      {"address", address},
                      {"generation", generation},
                      {"ram_bytes", ram_bytes},
                      {"ssd_bytes", ssd_bytes},
                      {"hbm_bytes", hbm_bytes},
                      {"started_unix", started_unix},
                      {"instance", instance},
                      {"placement", kPlacementRuleName}};
  return j.dump();
}

absl::StatusOr<NodeInfo> NodeInfo::FromJson(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("address") ||
      !j["address"].is_string()) {
    return absl::InvalidArgumentError("node record is not an object with id and address");
  }
  NodeInfo n;
  n.id = j["id"].get<std::string>();
  n.address = j["address"].get<std::string>();
  const auto u64 = [&](const char* k) -> uint64_t {
    return j.contains(k) && j[k].is_number_unsigned() ? j[k].get<uint64_t>() : 0;
  };
  n.generation = u64("generation");
  n.ram_bytes = u64("ram_bytes");
  n.ssd_bytes = u64("ssd_bytes");
  n.hbm_bytes = u64("hbm_bytes");
  n.started_unix = static_cast<int64_t>(u64("started_unix"));
  if (j.contains("instance") && j["instance"].is_string()) n.instance = j["instance"];
  KVC_RETURN_IF_ERROR(CheckNodeId(n.id));
  return n;
}

absl::Status CheckNodeId(const std::string& id) {
  if (id.empty() || id.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("node id \"", id, "\" must be 1 to 64 characters"));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return absl::InvalidArgumentError(
          absl::StrCat("node id \"", id, "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

// --- NodeRegistration ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<NodeRegistration>> NodeRegistration::Start(Options options) {
  KVC_RETURN_IF_ERROR(CheckNodeId(options.node.id));
  if (options.lease_seconds < 1) return absl::InvalidArgumentError("lease_seconds must be ≥ 1");
  if (!options.log) options.log = [](const std::string&, const std::string&) {};
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<Etcd> etcd, Etcd::Connect(options.endpoints, options.etcd));
  std::unique_ptr<NodeRegistration> r(new NodeRegistration(std::move(options)));
  r->etcd_ = std::move(etcd);
  // A holder may be a node that just died: its entry goes when its lease ends, so look
  // again for one lease period before refusing.
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(r->opt_.lease_seconds * 1000 + 500);
  absl::Status s = r->Register();
  while (absl::IsFailedPrecondition(s) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    s = r->Register();
  }
  if (absl::IsFailedPrecondition(s)) return s;
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

absl::Status NodeRegistration::Register(int64_t lease, bool reclaim) {
  const std::string key = kNodesPrefix + opt_.node.id;
  auto refuse = [&](const std::string& why) {
    opt_.log("cluster_register_refused", why);
    return absl::FailedPreconditionError(why);
  };
  // Another node advertising this address would get this node's clients (and tokens).
  absl::StatusOr<Etcd::RangeResult> all = etcd_->RangePrefix(kNodesPrefix);
  absl::Status s = all.status();
  if (s.ok()) {
    for (const Etcd::KeyValue& kv : all->kvs) {
      absl::StatusOr<NodeInfo> other = NodeInfo::FromJson(kv.value);
      if (!other.ok() || kv.key == key || other->address != opt_.node.address) continue;
      if (other->instance == opt_.node.instance) continue;  // this node, renamed
      return refuse(absl::StrCat("address ", opt_.node.address, " is advertised by node ",
                                 other->id, " (generation ", other->generation,
                                 "); each node needs an address of its own (--advertise)"));
    }
  }
  const bool own_lease = lease == 0;
  if (s.ok() && own_lease) {
    absl::StatusOr<int64_t> granted = etcd_->GrantLease(opt_.lease_seconds);
    s = granted.status();
    if (s.ok()) lease = *granted;
  }
  absl::StatusOr<std::optional<Etcd::KeyValue>> held = absl::UnknownError("");
  if (s.ok()) {
    held = etcd_->CreateIfAbsent(key, opt_.node.ToJson(), lease);
    s = held.status();
  }
  if (s.ok() && held->has_value()) {
    absl::StatusOr<NodeInfo> holder = NodeInfo::FromJson((*held)->value);
    if (holder.ok() && !holder->instance.empty() && holder->instance == opt_.node.instance) {
      // This node's own record from before a restart (or from before a lost lease):
      // taken over under the new lease, so the old lease's end no longer removes it.
      s = etcd_->Put(key, opt_.node.ToJson(), lease);
    } else if (reclaim) {
      opt_.log("cluster_entry_reclaimed",
               absl::StrCat("node ", opt_.node.id,
                            " replaced a record it did not write: ", (*held)->value));
      s = etcd_->Put(key, opt_.node.ToJson(), lease);
    } else {
      if (own_lease) (void)etcd_->RevokeLease(lease);
      return refuse(
          holder.ok() ? absl::StrCat("node id ", opt_.node.id, " is held by another live node at ",
                                     holder->address, " (generation ", holder->generation,
                                     ", started at unix time ", holder->started_unix,
                                     "); stop it, or start this node with another --node-id")
                      : absl::StrCat("node id ", opt_.node.id,
                                     " is held by a record that is not "
                                     "a node's; remove the key ",
                                     key, " from etcd"));
    }
  }
  if (!s.ok()) {
    if (own_lease && lease != 0) (void)etcd_->RevokeLease(lease);
    opt_.log("cluster_register_failed", std::string(s.message()));
    return s;
  }
  MutexLock lk(mu_);
  lease_ = lease;
  opt_.log("cluster_registered",
           absl::StrCat("node ", opt_.node.id, " at ", opt_.node.address, ", generation ",
                        opt_.node.generation, ", lease ", lease, " (", opt_.lease_seconds, " s)"));
  return absl::OkStatus();
}

absl::StatusOr<bool> NodeRegistration::StillOurs() {
  KVC_ASSIGN_OR_RETURN(std::optional<Etcd::KeyValue> kv, etcd_->Get(kNodesPrefix + opt_.node.id));
  if (!kv.has_value()) return false;
  absl::StatusOr<NodeInfo> n = NodeInfo::FromJson(kv->value);
  return n.ok() && n->instance == opt_.node.instance && n->address == opt_.node.address;
}

void NodeRegistration::Loop() {
  // Refresh three times per lease period: one lost refresh does not drop the node.
  const auto period = std::chrono::milliseconds(opt_.lease_seconds * 1000 / 3);
  bool etcd_down = false;
  while (true) {
    int64_t lease;
    {
      MutexLock lk(mu_);
      if (WaitForFlag(cv_, mu_, stop_, lease_ == 0 ? std::chrono::milliseconds(500) : period)) {
        break;
      }
      lease = lease_;
    }
    if (lease == 0) {
      (void)Register();
      continue;
    }
    absl::StatusOr<int64_t> ttl = etcd_->KeepAlive(lease);
    if (ttl.ok()) {
      if (etcd_down) opt_.log("cluster_etcd_back", "lease kept");
      etcd_down = false;
      // The lease alone does not say the entry is there: someone may have deleted the key
      // or written another record under it. Claim it back (under the same lease).
      absl::StatusOr<bool> ours = StillOurs();
      if (ours.ok() && !*ours) {
        opt_.log("cluster_entry_lost",
                 absl::StrCat("the key of node ", opt_.node.id,
                              " is gone or names another node; registering again"));
        (void)Register(lease, /*reclaim=*/true);
      }
      continue;
    }
    if (absl::IsNotFound(ttl.status())) {  // expired while etcd or this node was away
      opt_.log("cluster_lease_expired", std::string(ttl.status().message()));
      MutexLock lk(mu_);
      lease_ = 0;
      continue;
    }
    if (!etcd_down) opt_.log("cluster_etcd_unreachable", std::string(ttl.status().message()));
    etcd_down = true;  // keep the lease id: etcd restores leases when it comes back
  }
}

bool NodeRegistration::registered() const {
  MutexLock lk(mu_);
  return lease_ != 0;
}

NodeRegistration::~NodeRegistration() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) {
    absl::Status s = etcd_->RevokeLease(lease_);
    opt_.log(s.ok() ? "cluster_left" : "cluster_leave_failed",
             s.ok() ? "lease revoked" : std::string(s.message()));
  }
}

// --- MembershipView -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MembershipView>> MembershipView::Open(
    const std::string& endpoints, const EtcdSecurity& etcd_security) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<Etcd> etcd, Etcd::Connect(endpoints, etcd_security));
  std::unique_ptr<MembershipView> v(new MembershipView());
  v->etcd_ = std::move(etcd);
  {
    MutexLock lk(v->mu_);
    v->current_ = std::make_shared<Snapshot>();
  }
  KVC_RETURN_IF_ERROR(v->Reload());
  v->thread_ = std::thread([p = v.get()] { p->Loop(); });
  return v;
}

MembershipView::~MembershipView() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  etcd_->CancelWatches();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const MembershipView::Snapshot> MembershipView::Current() const {
  MutexLock lk(mu_);
  return current_;
}

absl::Status MembershipView::Reload() {
  KVC_ASSIGN_OR_RETURN(Etcd::RangeResult r, etcd_->RangePrefix(kNodesPrefix));
  auto snap = std::make_shared<Snapshot>();
  for (const Etcd::KeyValue& kv : r.kvs) {
    // A node's id is its key's: a record whose value names another id (or that is not a
    // node's record) is ignored, as the watch does (Apply).
    absl::StatusOr<NodeInfo> n = NodeInfo::FromJson(kv.value);
    if (n.ok() && kNodesPrefix + n->id == kv.key) snap->nodes.push_back(*std::move(n));
  }
  std::sort(snap->nodes.begin(), snap->nodes.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.id < b.id; });
  snap->revision = r.revision;
  MutexLock lk(mu_);
  snap->version = current_->version + 1;
  current_ = std::move(snap);
  return absl::OkStatus();
}

void MembershipView::Apply(bool put, const Etcd::KeyValue& kv) {
  const std::string id = kv.key.substr(std::string(kNodesPrefix).size());
  MutexLock lk(mu_);
  auto snap = std::make_shared<Snapshot>(*current_);
  auto it = std::find_if(snap->nodes.begin(), snap->nodes.end(),
                         [&](const NodeInfo& n) { return n.id == id; });
  if (it != snap->nodes.end()) snap->nodes.erase(it);
  if (put) {
    absl::StatusOr<NodeInfo> n = NodeInfo::FromJson(kv.value);
    if (n.ok() && n->id == id) {
      snap->nodes.insert(
          std::lower_bound(snap->nodes.begin(), snap->nodes.end(), *n,
                           [](const NodeInfo& a, const NodeInfo& b) { return a.id < b.id; }),
          *n);
    }
  }
  ++snap->version;
  current_ = std::move(snap);
}

void MembershipView::MarkStale(const std::string& why) {
  MutexLock lk(mu_);
  if (current_->stale) return;
  auto snap = std::make_shared<Snapshot>(*current_);
  snap->stale = true;
  snap->stale_reason = why;
  current_ = std::move(snap);
}

void MembershipView::Loop() {
  while (true) {
    int64_t from;
    {
      MutexLock lk(mu_);
      if (stop_) return;
      from = current_->revision + 1;
    }
    absl::Status s = etcd_->WatchPrefix(
        kNodesPrefix, from, [this](bool put, const Etcd::KeyValue& kv) { Apply(put, kv); });
    if (absl::IsCancelled(s)) return;
    MarkStale(std::string(s.message()));
    // Back off, then read the whole membership again (it may have changed while away).
    while (true) {
      MutexLock lk(mu_);
      if (WaitForFlag(cv_, mu_, stop_, std::chrono::milliseconds(500))) return;
      lk.unlock();
      if (Reload().ok()) break;
    }
  }
}

}  // namespace kvc::cluster
