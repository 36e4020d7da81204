#include "serve/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"

namespace kvc::serve {

EtcdProcess::EtcdProcess(std::string data_dir, std::string binary)
    : dir_(std::move(data_dir)), binary_(std::move(binary)) {
  client_port_ = FreeLoopbackPort();
  do {
    peer_port_ = FreeLoopbackPort();
  } while (peer_port_ == client_port_);
}

EtcdProcess::~EtcdProcess() { Stop(); }

std::string EtcdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

void EtcdProcess::UseTls(std::string cert_file, std::string key_file, std::string ca_file,
                         cluster::EtcdSecurity client) {
  cert_file_ = std::move(cert_file);
  key_file_ = std::move(key_file);
  ca_file_ = std::move(ca_file);
  client_ = std::move(client);
}

absl::Status EtcdProcess::Start() {
  if (access(binary_.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(binary_, " is missing: install etcd-server (scripts/install-deps.sh)"));
  }
  const std::string client =
      absl::StrCat(cert_file_.empty() ? "http" : "https", "://127.0.0.1:", client_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> args = {binary_,
                                   "--name=local",
                                   "--data-dir=" + dir_,
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=local=" + peer,
                                   "--log-level=error"};
  if (!cert_file_.empty()) {
    args.insert(args.end(), {"--cert-file=" + cert_file_, "--key-file=" + key_file_,
                             "--client-cert-auth", "--trusted-ca-file=" + ca_file_});
  }
  // Made before fork: the child of a threaded process may only make async-signal-safe
  // calls before exec (no allocation).
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log = open((dir_ + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  pid_ = fork();
  if (pid_ == 0) {
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (log >= 0) close(log);
  if (pid_ < 0) return absl::InternalError("fork");
  // Ready when it answers a read, on a fresh connection each time (etcd accepts
  // connections before it serves them).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (true) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Etcd> etcd,
                         cluster::Etcd::Connect(endpoint(), client_));
    etcd->call_timeout_ms = 300;
    const absl::Status s = etcd->RangePrefix("/").status();
    if (s.ok()) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > until) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("etcd did not start (", s.message(), "; its log: ", dir_, ".log)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void EtcdProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

LocalCluster::LocalCluster(std::string kvcached_binary, std::string dir, int nodes,
                           std::vector<std::string> extra)
    : binary_(std::move(kvcached_binary)), dir_(std::move(dir)), extra_(std::move(extra)) {
  etcd_ = std::make_unique<EtcdProcess>(dir_ + "/etcd");
  for (int i = 0; i < nodes; ++i) {
    std::vector<std::string> args = extra_;
    args.insert(args.end(), {"--cluster", etcd_->url(), "--node-id", NodeId(i)});
    nodes_.push_back(std::make_unique<KvcachedProcess>(binary_, dir_ + "/" + NodeId(i), args));
  }
}

absl::Status LocalCluster::Start() {
  KVC_RETURN_IF_ERROR(etcd_->Start());
  for (auto& n : nodes_) {
    KVC_RETURN_IF_ERROR(n->Start());
  }
  return WaitForMembers(nodes_.size(), 10);
}

absl::Status LocalCluster::WaitForMembers(size_t count, double seconds) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Etcd> etcd,
                       cluster::Etcd::Connect(etcd_->endpoint()));
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  size_t seen = 0;
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<cluster::Etcd::RangeResult> r = etcd->RangePrefix(cluster::kNodesPrefix);
    if (r.ok() && (seen = r->kvs.size()) == count) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(seen, " of ", count, " nodes registered in etcd after ", seconds, " s"));
}

absl::Status LocalCluster::WaitForNode(int i, double seconds) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Etcd> etcd,
                       cluster::Etcd::Connect(etcd_->endpoint()));
  const std::string key = std::string(cluster::kNodesPrefix) + NodeId(i);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<cluster::Etcd::RangeResult> r = etcd->RangePrefix(key);
    if (r.ok()) {
      for (const cluster::Etcd::KeyValue& kv : r->kvs) {
        absl::StatusOr<cluster::NodeInfo> n = cluster::NodeInfo::FromJson(kv.value);
        if (kv.key == key && n.ok() && n->address == nodes_[i]->address()) return absl::OkStatus();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("node ", NodeId(i), " did not register its new address in ", seconds, " s"));
}

}  // namespace kvc::serve
