// A child process stores chunks with durable acks; we SIGKILL it at random moments, reopen
// the store, and check that every acknowledged chunk reads back byte-exact and that no
// read returns wrong bytes. Real processes, real files, real RocksDB.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "tests/storage/crash_options.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::storage {
namespace {

using namespace ::kvc::testing;

const std::string kChild = std::string(KVC_BIN_DIR) + "/../tests/crash_child";

TEST(CrashTest, AcknowledgedChunksSurviveSigkill) {
  const uint64_t seed = FreshSeed();
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string data = dir.File("data"), acks = dir.File("acks");
  std::set<uint64_t> durable;  // every durable ack of every round so far
  int rounds_with_acks = 0;
  uint64_t memory_acks = 0, checked_unacked = 0;
  std::uintmax_t acks_bytes = 0;      // the acks file's size before this round
  const int kRounds = CrashRounds();  // KVC_CRASH_ROUNDS: scripts/kill-loop.sh runs 200
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t start = static_cast<uint64_t>(round) * 1'000'000;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl(kChild.c_str(), kChild.c_str(), data.c_str(), std::to_string(seed).c_str(),
            std::to_string(start).c_str(), acks.c_str(), nullptr);
      _exit(127);
    }
    if (round % 2 == 0) {
      // Half the rounds kill the writer while it stores: wait for its first durable
      // acknowledgement of this round (a slow start — sanitizers, a loaded machine — would
      // otherwise eat the whole random delay; a memory ack comes sooner and says nothing
      // about the durable path), then a random moment after it.
      const std::uintmax_t before = acks_bytes;
      const auto durable_ack_this_round = [&] {
        std::ifstream f(acks);
        if (!f || !f.seekg(static_cast<std::streamoff>(before))) return false;
        std::string line;
        while (std::getline(f, line)) {
          if (line.starts_with("d ")) return true;
        }
        return false;
      };
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!durable_ack_this_round() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));
    } else {  // the others at a random moment from its start (open, recovery, first writes)
      std::this_thread::sleep_for(std::chrono::milliseconds(40 + rng() % 260));
    }
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);

    // Parse this round's acks (the file accumulates across rounds).
    {
      std::error_code ec;
      acks_bytes = std::filesystem::file_size(acks, ec);
      if (ec) acks_bytes = 0;
    }
    std::ifstream in(acks);
    std::string kind;
    uint64_t id = 0, max_id = start, new_acks = 0;
    std::set<uint64_t> memory;
    while (in >> kind >> id) {
      if (id < start) continue;
      max_id = std::max(max_id, id);
      if (kind == "d") {
        new_acks += durable.insert(id).second;
      } else {
        memory.insert(id);
      }
    }
    rounds_with_acks += new_acks > 0;
    memory_acks += memory.size();

    absl::StatusOr<std::unique_ptr<ChunkStore>> store = ChunkStore::Open(CrashStoreOptions(data));
    ASSERT_TRUE(store.ok()) << "round " << round << ": " << store.status();
    ASSERT_EQ((*store)->CheckConsistency(), absl::OkStatus()) << "round " << round;
    std::vector<uint8_t> out(kCrashChunkBytes);
    for (uint64_t d : durable) {  // all rounds so far: nothing acknowledged is ever lost
      const ChunkKey k = KeyOf(seed, d);
      absl::Status st = (*store)->Get(kCrashNamespace, k, out);
      ASSERT_TRUE(st.ok()) << "round " << round << ": acknowledged chunk " << d << " lost: " << st;
      ASSERT_EQ(out, PayloadOf(k, kCrashChunkBytes)) << "round " << round << " chunk " << d;
    }
    // Unacknowledged and memory-acked chunks may be missing, but never wrong.
    for (uint64_t i = start; i <= max_id + 4; ++i) {
      if (durable.contains(i)) continue;
      const ChunkKey k = KeyOf(seed, i);
      absl::Status st = (*store)->Get(kCrashNamespace, k, out);
      if (st.ok()) {
        ++checked_unacked;
        ASSERT_EQ(out, PayloadOf(k, kCrashChunkBytes)) << "round " << round << " chunk " << i;
      } else {
        ASSERT_TRUE(absl::IsNotFound(st)) << st;
      }
    }
    EXPECT_EQ((*store)->Stats().checksum_failures, 0u);
  }
  std::printf(
      "crash: %d rounds, %zu durable acks verified, %llu memory acks, %llu unacked/memory chunks "
      "found intact\n",
      kRounds, durable.size(), static_cast<unsigned long long>(memory_acks),
      static_cast<unsigned long long>(checked_unacked));
  EXPECT_GE(rounds_with_acks, kRounds / 2) << "the child rarely got to store anything";
}

}  // namespace
}  // namespace kvc::storage
