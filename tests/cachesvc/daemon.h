// A kvcached process for end-to-end tests: started on a free loopback port (it prints
// the port it got), stopped with SIGTERM (graceful) or SIGKILL (crash).
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/loopback_port.h"
#include "client/channel_args.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvc::testing {

namespace pb = ::kvcache::v1;

inline const std::string kDaemon = std::string(KVC_BIN_DIR) + "/kvcached";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using ::kvc::FreeLoopbackPort;

// A kvcached process on a free loopback port.
class Daemon {
 public:
  // `stderr_path` set: the daemon's stderr (its structured log) goes to that file.
  Daemon(const std::string& data_dir, std::vector<std::string> extra = {},
         std::string stderr_path = "")
      : dir_(data_dir), extra_(std::move(extra)), stderr_path_(std::move(stderr_path)) {
    Start();
  }
  ~Daemon() {
    if (pid_ > 0) Stop(SIGKILL);
  }
  pid_t pid() const { return pid_; }
  void Start() {
    std::vector<std::string> args = {kDaemon,   "--data-dir",  dir_,      "--ram-bytes",
                                     "4000000", "--ssd-bytes", "40000000"};
    // A free port unless the caller fixed one (to reach the same address after a restart).
    if (std::find(extra_.begin(), extra_.end(), "--listen") == extra_.end()) {
      args.insert(args.end(), {"--listen", "127.0.0.1:0"});
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    // Made before fork: the child of a threaded process may only make async-signal-safe
    // calls before exec (no allocation).
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int err = stderr_path_.empty() ? -1
                                         : open(stderr_path_.c_str(),
                                                O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int out[2];
    ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      if (err >= 0) dup2(err, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (err >= 0) close(err);
    ASSERT_GE(pid_, 0);
    close(out[1]);
    FILE* f = fdopen(out[0], "r");
    char line[512] = {0};
    ASSERT_NE(fgets(line, sizeof line, f), nullptr) << "kvcached printed nothing";
    out_ = f;  // keep reading end open so the daemon never gets SIGPIPE
    const char* colon = strrchr(strstr(line, "listening on") ? line : "x:0", ':');
    port_ = std::atoi(colon + 1);
    ASSERT_GT(port_, 0) << line;
    // As the client library's channels: a failed connection attempt costs no call.
    grpc::ChannelArguments channel_args;
    client::ReconnectSoonAndRetry(channel_args);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                         grpc::InsecureChannelCredentials(), channel_args);
    stub_ = pb::KVCache::NewStub(channel_);
  }
  // SIGTERM: graceful (drains, flushes); SIGKILL: crash. Returns the exit status.
  int Stop(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (out_) fclose(out_);
    out_ = nullptr;
    return status;
  }
  // Closes this helper's connection. An idle gRPC client reads its socket only on its backup
  // poll (every 5 s), so a server's graceful shutdown waits that long for the client to
  // answer the GOAWAY's ping: close it when a test times how fast the daemon stops.
  void Disconnect() {
    stub_.reset();
    channel_.reset();
  }
  // The process exited by itself and the caller reaped it: nothing left to stop.
  void Forget() {
    pid_ = -1;
    if (out_) fclose(out_);
    out_ = nullptr;
  }
  void Restart(int sig) {
    Stop(sig);
    Start();
  }
  pb::KVCache::Stub& stub() { return *stub_; }
  // Resident memory of the daemon process, from /proc (0 if it cannot be read).
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    }
    return 0;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  std::string dir_;
  std::vector<std::string> extra_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KVCache::Stub> stub_;
};

}  // namespace kvc::testing
