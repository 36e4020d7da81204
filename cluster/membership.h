// Membership: which kvcached nodes form the cluster, kept in etcd.
//
// Each node puts one key, kNodesPrefix + its id, whose value is its NodeInfo (JSON),
// under an etcd lease it keeps alive (NodeRegistration): a node that dies drops out when
// its lease expires (lease_seconds), one that stops cleanly revokes the lease and leaves at
// once. Clients read the prefix and watch it (MembershipView); when etcd cannot be reached
// they keep the membership they last saw and say it is stale. docs/cluster.md.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "cluster/etcd.h"
#include "cluster/placement.h"

namespace kvc::cluster {

inline constexpr char kNodesPrefix[] = "/kvcache/v1/nodes/";

struct NodeInfo {
  std::string id;           // stable across restarts (the data folder keeps it)
  std::string address;      // HOST:PORT clients dial
  uint64_t generation = 0;  // +1 at every start of the node
  // Random, kept in the data folder: tells this node's own earlier record (a restart
  // before its lease ran out) from another process claiming the same id. It guards
  // against mistakes, not against whoever can write to etcd (docs/security.md).
  std::string instance;
  uint64_t ram_bytes = 0, ssd_bytes = 0, hbm_bytes = 0;
  int64_t started_unix = 0;

  std::string ToJson() const;
  static absl::StatusOr<NodeInfo> FromJson(const std::string& json);
};

// A node id: 1–64 of [A-Za-z0-9._-]. InvalidArgument naming what is wrong.
absl::Status CheckNodeId(const std::string& id);

// Called with an event name and a detail for the daemon's log.
using MembershipLog = std::function<void(const std::string& event, const std::string& detail)>;

// Registration claims the node's key with create-if-absent, so a second process started
// with a live node's id never takes over (nor, when it exits, deletes) that node's entry:
// it is refused, naming the holder. A record under the key with this node's instance is
// its own (a restart on the same data folder) and is taken over. Another node advertising
// the same address is refused too. While running, the node checks its key at every
// refresh and claims it again when it has gone or names another address.
class NodeRegistration {
 public:
  struct Options {
    std::string endpoints;  // "H:P[,H:P…]"
    EtcdSecurity etcd;      // TLS and user, if etcd asks for them
    NodeInfo node;
    int lease_seconds = 5;
    MembershipLog log;
  };
  // Registers at once if etcd answers (else logs and keeps trying in the background).
  // FailedPrecondition naming the holder when another live node holds the id or the
  // address (after waiting up to one lease period for a dying holder's lease to end).
  static absl::StatusOr<std::unique_ptr<NodeRegistration>> Start(Options options);
  // Leaves the cluster: revokes the lease, so clients drop the node at once.
  ~NodeRegistration();
  bool registered() const;

 private:
  explicit NodeRegistration(Options o) : opt_(std::move(o)) {}
  void Loop();
  // Claims the key under a new lease (or `lease`, when nonzero); under no lock. OK when
  // registered; FailedPrecondition when another node holds the id or the address. With
  // `reclaim` (a registered node whose key was overwritten since: no node could have
  // claimed it through registration, so the record is a stray put), the record is
  // replaced instead.
  absl::Status Register(int64_t lease = 0, bool reclaim = false);
  // Whether the key still holds this node's record (a read of etcd).
  absl::StatusOr<bool> StillOurs();

  Options opt_;
  std::unique_ptr<Etcd> etcd_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not registered
  std::thread thread_;
};

class MembershipView {
 public:
  struct Snapshot {
    std::vector<NodeInfo> nodes;  // by id
    bool stale = false;           // etcd unreachable: the last membership seen
    std::string stale_reason;
    int64_t revision = 0;
    uint64_t version = 0;  // +1 at every change of `nodes`
  };
  // Reads the membership once (an error if etcd does not answer), then watches it.
  static absl::StatusOr<std::unique_ptr<MembershipView>> Open(const std::string& endpoints,
                                                              const EtcdSecurity& etcd = {});
  ~MembershipView();
  std::shared_ptr<const Snapshot> Current() const;

 private:
  MembershipView() = default;
  void Loop();
  absl::Status Reload();
  void Apply(bool put, const Etcd::KeyValue& kv);
  void MarkStale(const std::string& why);

  std::unique_ptr<Etcd> etcd_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const Snapshot> current_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvc::cluster
