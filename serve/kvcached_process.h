// KvcachedProcess: a kvcached child process on a free loopback port, for programs that
// bring their own cache (kvdemo, kvbench e2e). Stop(SIGTERM) drains and flushes;
// Stop(SIGKILL) crashes it; the destructor kills what is still running.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/loopback_port.h"

namespace kvc::serve {

class KvcachedProcess {
 public:
  // `binary`: the kvcached program; its stderr (the structured log) goes to
  // data_dir + ".log".
  // `port` 0: a free one at each start; else that port every time (a restart keeps it).
  KvcachedProcess(std::string binary, std::string data_dir, std::vector<std::string> extra = {},
                  int port = 0);
  ~KvcachedProcess();
  KvcachedProcess(const KvcachedProcess&) = delete;
  KvcachedProcess& operator=(const KvcachedProcess&) = delete;

  absl::Status Start();  // returns once it listens
  void Stop(int sig);
  const std::string& address() const { return address_; }  // HOST:PORT
  pid_t pid() const { return pid_; }                       // -1 when stopped
  std::string shm_socket() const { return dir_ + "/kvcached.sock"; }

 private:
  std::string binary_, dir_, address_;
  std::vector<std::string> extra_;
  int port_ = 0;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

}  // namespace kvc::serve
