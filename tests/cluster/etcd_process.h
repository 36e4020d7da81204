// An etcd server for cluster tests: Debian's etcd on free loopback ports with a scratch
// data folder, started and stopped by the test (stopping keeps the folder, so a restart
// has the same members and leases).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/daemon.h"

namespace kvc::testing {

inline const char kEtcdBinary[] = "/usr/bin/etcd";

class EtcdProcess {
 public:
  explicit EtcdProcess(std::string dir)
      : dir_(std::move(dir)), client_port_(FreePort()), peer_port_(FreePort()) {
    while (peer_port_ == client_port_) peer_port_ = FreePort();
    Start();
  }
  ~EtcdProcess() {
    if (pid_ > 0) Stop();
  }
  void Start() {
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {kEtcdBinary,
                                     "--name=test",
                                     "--data-dir=" + dir_,
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=test=" + peer,
                                     "--log-level=error"};
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      FILE* log = std::fopen((dir_ + ".log").c_str(), "a");
      if (log != nullptr) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(kEtcdBinary, argv.data());
      _exit(127);
    }
    // Ready when it answers a read (a fresh connection each time: etcd accepts
    // connections before it serves them).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (true) {
      absl::StatusOr<std::unique_ptr<cluster::Etcd>> etcd = cluster::Etcd::Connect(endpoint());
      ASSERT_TRUE(etcd.ok()) << etcd.status();
      (*etcd)->call_timeout_ms = 300;
      const absl::Status s = (*etcd)->RangePrefix("/").status();
      if (s.ok()) break;
      ASSERT_LT(std::chrono::steady_clock::now(), until)
          << "etcd did not start (" << s << "; see " << dir_ << ".log)";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  void Stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  std::string url() const { return "etcd://" + endpoint(); }

 private:
  std::string dir_;
  int client_port_, peer_port_;
  pid_t pid_ = -1;
};

}  // namespace kvc::testing
