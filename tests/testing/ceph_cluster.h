// A real single-host Ceph cluster for a test (docs/storage.md, "A Ceph cluster for tests"):
// scripts/ceph-up.sh brings up one monitor and one memstore OSD in a temporary folder with
// a pool, scripts/ceph-down.sh ends it (by PID) when the test ends.
#pragma once

#include <signal.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace kvc::testing {

class CephClusterTest : public ::testing::Test {
 public:
  static constexpr char kPool[] = "kvc-test";  // the pool ceph-up.sh makes

 protected:
  void SetUp() override {
    const auto up = RunProgram(std::string(KVC_SOURCE_DIR) + "/scripts/ceph-up.sh",
                               {ceph_dir_.File("ceph"), kPool});
    ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
    conf_ = ceph_dir_.File("ceph") + "/ceph.conf";
  }
  // The pid of the cluster's daemon "mon" or "osd" (ceph-up.sh writes them), or 0.
  pid_t DaemonPid(const std::string& name) const {
    std::ifstream in(ceph_dir_.File("ceph") + "/" + name + ".pid");
    pid_t pid = 0;
    in >> pid;
    return pid;
  }
  // SIGSTOP / SIGCONT to the monitor and the OSD: the whole cluster stops answering, and
  // keeps what it holds (a memstore OSD killed would lose it).
  void SignalDaemons(int sig) {
    for (const char* name : {"mon", "osd"}) {
      if (pid_t pid = DaemonPid(name); pid > 0) {
        ASSERT_EQ(kill(pid, sig), 0) << name;
      }
    }
    stopped_ = sig == SIGSTOP;
  }
  void TearDown() override {
    if (stopped_) SignalDaemons(SIGCONT);  // a test that failed while they were stopped
    const auto down =
        RunProgram(std::string(KVC_SOURCE_DIR) + "/scripts/ceph-down.sh", {ceph_dir_.File("ceph")});
    EXPECT_EQ(down.exit_code, 0) << down.err;
  }
  TempDir ceph_dir_;
  std::string conf_;  // the cluster's ceph.conf
  bool stopped_ = false;
};

}  // namespace kvc::testing
