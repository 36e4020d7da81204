// The Ceph cluster the RADOS tier's tests will run on (docs/storage.md, "A Ceph cluster for
// tests"): scripts/ceph-up.sh brings up one monitor and one memstore OSD in a folder, and
// librados (the C++ API, linked as -lrados) stores and reads objects there — with xattrs,
// where a chunk's checksum and origin will go — until scripts/ceph-down.sh ends it.
#include <rados/librados.hpp>

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

class RadosClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto up = testing::RunProgram(std::string(KVC_SOURCE_DIR) + "/scripts/ceph-up.sh",
                                        {dir_.File("ceph"), "kvc-test"});
    ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
    conf_ = dir_.File("ceph") + "/ceph.conf";
  }
  void TearDown() override {
    const auto down = testing::RunProgram(std::string(KVC_SOURCE_DIR) + "/scripts/ceph-down.sh",
                                          {dir_.File("ceph")});
    EXPECT_EQ(down.exit_code, 0) << down.err;
  }
  testing::TempDir dir_;
  std::string conf_;
};

TEST_F(RadosClusterTest, AnObjectAndItsXattrsGoInAndComeBackExact) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  librados::Rados rados;
  ASSERT_EQ(rados.init2("client.admin", "ceph", 0), 0);
  ASSERT_EQ(rados.conf_read_file(conf_.c_str()), 0);
  ASSERT_EQ(rados.conf_set("client_mount_timeout", "10"), 0);
  ASSERT_EQ(rados.connect(), 0);
  librados::IoCtx io;
  ASSERT_EQ(rados.ioctx_create("kvc-test", io), 0);
  std::string bytes(57 * 1024, '\0');  // a 256-token chunk of a small model's size
  for (char& c : bytes) c = static_cast<char>(rng());
  librados::bufferlist in;
  in.append(bytes);
  ASSERT_EQ(io.write_full("chunk-0", in), 0);
  librados::bufferlist sum;
  sum.append(std::to_string(rng()));
  ASSERT_EQ(io.setxattr("chunk-0", "checksum", sum), 0);

  librados::bufferlist out;
  ASSERT_EQ(io.read("chunk-0", out, bytes.size(), 0), static_cast<int>(bytes.size()));
  EXPECT_EQ(out.to_str(), bytes);
  librados::bufferlist got_sum;
  ASSERT_GE(io.getxattr("chunk-0", "checksum", got_sum), 0);
  EXPECT_EQ(got_sum.to_str(), sum.to_str());
  // Gone once removed: a read says so (ENOENT), it never returns other bytes.
  ASSERT_EQ(io.remove("chunk-0"), 0);
  librados::bufferlist after;
  EXPECT_EQ(io.read("chunk-0", after, bytes.size(), 0), -ENOENT);
  io.close();
  rados.shutdown();
}

}  // namespace
}  // namespace kvc::storage
