// LocalCluster: etcd and N kvcached nodes on loopback, each node with its own data folder,
// for programs that bring their own cluster (kvdemo --nodes, kvbench cluster). Etcd is
// Debian's (/usr/bin/etcd) with a scratch data folder; everything is stopped by the
// destructor.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cluster/etcd.h"
#include "serve/kvcached_process.h"

namespace kvc::serve {

// Debian's etcd on free loopback ports. Stop keeps its folder, so Start again restores
// the members and leases it had.
class EtcdProcess {
 public:
  explicit EtcdProcess(std::string data_dir, std::string binary = "/usr/bin/etcd");
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Serve clients over TLS with this certificate and require client certificates signed
  // by ca_file (--client-cert-auth); `client` is how this class itself connects (its
  // readiness check). Call before Start.
  void UseTls(std::string cert_file, std::string key_file, std::string ca_file,
              cluster::EtcdSecurity client);
  absl::Status Start();  // returns once it answers a read
  void Stop();
  std::string endpoint() const;  // 127.0.0.1:PORT
  std::string url() const { return "etcd://" + endpoint(); }

 private:
  std::string dir_, binary_;
  std::string cert_file_, key_file_, ca_file_;  // set: TLS
  cluster::EtcdSecurity client_;
  int client_port_ = 0, peer_port_ = 0;
  pid_t pid_ = -1;
};

class LocalCluster {
 public:
  // `extra`: flags for every node (capacities, auth); node i gets the id "n<i>" and the
  // folder DIR/n<i>.
  LocalCluster(std::string kvcached_binary, std::string dir, int nodes,
               std::vector<std::string> extra = {});
  // Starts etcd and the nodes; returns once every node is registered.
  absl::Status Start();
  std::string url() const { return etcd_->url(); }
  int size() const { return static_cast<int>(nodes_.size()); }
  KvcachedProcess& node(int i) { return *nodes_[i]; }
  static std::string NodeId(int i) { return "n" + std::to_string(i); }
  // Waits until `count` nodes are registered in etcd (up to `seconds`).
  absl::Status WaitForMembers(size_t count, double seconds);
  // Waits until node i's record in etcd has the address it listens on now (after a
  // restart the old record may still be there until its lease expires).
  absl::Status WaitForNode(int i, double seconds);

 private:
  std::string binary_, dir_;
  std::vector<std::string> extra_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<KvcachedProcess>> nodes_;
};

}  // namespace kvc::serve
