// The RADOS tier (storage/rados_tier.h) on a real Ceph cluster (docs/storage.md, "A Ceph
// cluster for tests"): scripts/ceph-up.sh brings up one monitor and one memstore OSD in a
// folder for each test, scripts/ceph-down.sh ends it. First librados itself (the C++ API,
// linked as -lrados), then the tier's chunks: stored and read exact with what is kept
// beside them, never handed out when they do not verify or are another namespace's.
#include <rados/librados.hpp>

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "storage/rados_tier.h"
#include "storage/slot_format.h"
#include "tests/storage/store_testing.h"
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

TEST_F(RadosClusterTest, ChunksAreStoredAndReadExactWithWhatIsKeptBesideThem) {
  const uint64_t seed = testing::FreshSeed();
  absl::StatusOr<std::unique_ptr<RadosTier>> tier =
      RadosTier::Connect({.pool = "kvc-test", .conf_file = conf_});
  ASSERT_TRUE(tier.ok()) << tier.status();
  RadosTier& t = **tier;
  constexpr NamespaceId kNs = 7;
  constexpr size_t kBytes = 57'344;
  const ChunkKey key = testing::KeyOf(seed, 1), parent = testing::KeyOf(seed, 0);
  const std::vector<uint8_t> bytes = testing::PayloadOf(key, kBytes);
  RadosChunk meta;
  meta.namespace_id = kNs;
  meta.payload_checksum = PayloadChecksum(bytes);
  meta.parent = parent;
  meta.origin = ChunkOrigin{testing::KeyOf(seed, 100), testing::KeyOf(seed, 99)};
  meta.expires_s = 1'900'000'000;
  EXPECT_EQ(t.Contains(key).value_or(true), false);
  std::vector<uint8_t> out(kBytes);
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs, key, out)));
  ASSERT_EQ(t.Put(key, meta, bytes), absl::OkStatus());
  EXPECT_EQ(t.Contains(key).value_or(false), true);
  RadosChunk got;
  ASSERT_EQ(t.Get(kNs, key, out, &got), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(got.namespace_id, kNs);
  EXPECT_EQ(got.payload_checksum, meta.payload_checksum);
  EXPECT_EQ(got.parent, meta.parent);
  EXPECT_EQ(got.origin, meta.origin);
  EXPECT_EQ(got.expires_s, meta.expires_s);
  // Another namespace's reader, or one expecting another size, gets nothing.
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs + 1, key, out)));
  std::vector<uint8_t> smaller(kBytes - 4096);
  EXPECT_TRUE(absl::IsDataLoss(t.Get(kNs, key, smaller)));
  // Bytes changed behind the tier's back do not verify: never handed out as the chunk.
  {
    librados::Rados rados;
    ASSERT_EQ(rados.init2("client.admin", "ceph", 0), 0);
    ASSERT_EQ(rados.conf_read_file(conf_.c_str()), 0);
    ASSERT_EQ(rados.connect(), 0);
    librados::IoCtx io;
    ASSERT_EQ(rados.ioctx_create("kvc-test", io), 0);
    librados::bufferlist flip;
    flip.append(std::string(1, static_cast<char>(bytes[1234] ^ 0x40)));
    ASSERT_EQ(io.write(RadosTier::ObjectName(key), flip, 1, 1234), 0);
    io.close();
    rados.shutdown();
  }
  EXPECT_TRUE(absl::IsDataLoss(t.Get(kNs, key, out)));
  // Stored again, it reads exact; removed, it is gone (and removing twice is fine).
  ASSERT_EQ(t.Put(key, meta, bytes), absl::OkStatus());
  ASSERT_EQ(t.Get(kNs, key, out), absl::OkStatus());
  EXPECT_EQ(out, bytes);
  ASSERT_EQ(t.Remove(key), absl::OkStatus());
  ASSERT_EQ(t.Remove(key), absl::OkStatus());
  EXPECT_TRUE(absl::IsNotFound(t.Get(kNs, key, out)));
}

TEST_F(RadosClusterTest, APoolThatDoesNotExistIsNamed) {
  absl::StatusOr<std::unique_ptr<RadosTier>> tier =
      RadosTier::Connect({.pool = "no-such-pool", .conf_file = conf_});
  ASSERT_FALSE(tier.ok());
  EXPECT_TRUE(absl::IsNotFound(tier.status())) << tier.status();
  EXPECT_NE(tier.status().message().find("no-such-pool"), std::string::npos) << tier.status();
}

}  // namespace
}  // namespace kvc::storage
