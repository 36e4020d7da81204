// A real single-host Ceph cluster for a test (docs/storage.md, "A Ceph cluster for tests"):
// scripts/ceph-up.sh brings up one monitor and one memstore OSD in a temporary folder with
// a pool, scripts/ceph-down.sh ends it (by PID) when the test ends.
#pragma once

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
  void TearDown() override {
    const auto down =
        RunProgram(std::string(KVC_SOURCE_DIR) + "/scripts/ceph-down.sh", {ceph_dir_.File("ceph")});
    EXPECT_EQ(down.exit_code, 0) << down.err;
  }
  TempDir ceph_dir_;
  std::string conf_;  // the cluster's ceph.conf
};

}  // namespace kvc::testing
