// kvctl as an operator uses it, against the real daemon and on its data folder.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "storage/slot_format.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::Daemon;
using ::kvc::testing::ReadFile;
using ::kvc::testing::RunProgram;
using ::kvc::testing::TempDir;

const std::string kKvctl = std::string(KVC_BIN_DIR) + "/kvctl";
const std::string kMini = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";

TEST(KvctlTest, PutGetHashPinAndVerifyACorruptedFolder) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  const std::string data = dir.File("data");
  auto daemon = std::make_unique<Daemon>(data);
  const std::vector<std::string> server = {"--server", daemon->address()};
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> all = server;
    all.insert(all.end(), args.begin(), args.end());
    return RunProgram(kKvctl, all);
  };
  auto reg = run({"register", "--config", kMini, "--model-id", "mini", "--chunk-tokens", "64"});
  ASSERT_EQ(reg.exit_code, 0) << reg.err;
  const size_t bytes_at = reg.out.find("tokens and ") + 11;
  const uint64_t chunk_bytes = std::stoull(reg.out.substr(bytes_at));
  {
    std::ofstream t(dir.File("tokens"));
    for (int i = 0; i < 64 * 3 + 10; ++i) t << rng() % 512 << (i % 20 ? " " : "\n");
    std::ofstream p(dir.File("payload"), std::ios::binary);
    for (uint64_t i = 0; i < 3 * chunk_bytes; ++i) p.put(static_cast<char>(rng()));
  }
  const std::vector<std::string> model = {
      "--config",       kMini, "--model-id",    "mini",
      "--chunk-tokens", "64",  "--tokens-file", dir.File("tokens")};
  auto with = [&](std::string cmd, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {cmd};
    args.insert(args.end(), model.begin(), model.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  auto put = with("put", {"--payload-file", dir.File("payload")});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_NE(put.out.find("stored 3"), std::string::npos) << put.out;
  auto get = with("get", {"--out", dir.File("got")});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_EQ(ReadFile(dir.File("got")), ReadFile(dir.File("payload")));
  auto hash = with("hash");
  ASSERT_EQ(hash.exit_code, 0) << hash.err;
  EXPECT_EQ(std::count(hash.out.begin(), hash.out.end(), '\n'), 3) << hash.out;
  EXPECT_NE(hash.out.find(" ram"), std::string::npos);
  EXPECT_EQ(with("pin", {"--ttl", "60"}).exit_code, 0);
  auto stats = run({"stats"});
  EXPECT_NE(stats.out.find("ssd  3 /"), std::string::npos) << stats.out;

  // Bad input: one line, non-zero.
  std::ofstream(dir.File("bad-tokens")) << "1 2 three";
  auto bad = run(
      {"hash", "--config", kMini, "--model-id", "mini", "--tokens-file", dir.File("bad-tokens")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("token 2 is \"three\""), std::string::npos) << bad.err;
  auto short_payload = with("put", {"--payload-file", dir.File("tokens")});
  EXPECT_NE(short_payload.exit_code, 0);
  EXPECT_NE(short_payload.err.find("chunks of this namespace are"), std::string::npos)
      << short_payload.err;

  daemon.reset();  // verify works on a stopped daemon's folder
  auto ls = RunProgram(kKvctl, {"ls", "--data-dir", data});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), 3);
  auto ok = RunProgram(kKvctl, {"verify", "--data-dir", data});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("3 good, 0 bad"), std::string::npos) << ok.out;
  // Flip a payload byte of the first slot on disk: verify finds it and drops it. (The mini
  // model's chunks are in their own size class, slabs/c<slot bytes>/.)
  std::string slab = data + "/slabs/slab-000000.dat";
  for (const auto& entry : std::filesystem::directory_iterator(data + "/slabs")) {
    if (entry.is_directory()) slab = entry.path().string() + "/slab-000000.dat";
  }
  const int fd = open(slab.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b = 0;
  ASSERT_EQ(pread(fd, &b, 1, storage::kSlotHeaderBytes + 100), 1);
  b ^= 0x01;
  ASSERT_EQ(pwrite(fd, &b, 1, storage::kSlotHeaderBytes + 100), 1);
  close(fd);
  auto found = RunProgram(kKvctl, {"verify", "--data-dir", data});
  EXPECT_NE(found.exit_code, 0);
  EXPECT_NE(found.out.find("2 good, 1 bad"), std::string::npos) << found.out;
  EXPECT_NE(found.err.find("payload checksum mismatch"), std::string::npos) << found.err;
}

}  // namespace
}  // namespace kvc
