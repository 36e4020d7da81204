// The process the crash test kills: stores chunks as fast as it can from two threads and
// appends one line per acknowledgement to an ack file ("d N" for a durable ack, "m N" for
// a memory ack). Usage: crash_child DIR SEED START ACK_FILE. Runs until killed, writing at
// most kCrashMaxPerRound chunks.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/storage/crash_options.h"
#include "tests/storage/store_testing.h"

using namespace kvc;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: crash_child DIR SEED START ACK_FILE\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const uint64_t start = std::strtoull(argv[3], nullptr, 10);
  const int acks = open(argv[4], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (acks < 0) return 3;
  absl::StatusOr<std::unique_ptr<storage::ChunkStore>> store =
      storage::ChunkStore::Open(testing::CrashStoreOptions(dir));
  if (!store.ok()) {
    std::fprintf(stderr, "crash_child: %s\n", std::string(store.status().message()).c_str());
    return 4;
  }
  if (!(*store)->RegisterNamespace(testing::kCrashNamespace, testing::kCrashChunkBytes).ok())
    return 5;
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = start + t;; i += 2) {
        if (i >= start + testing::kCrashMaxPerRound) {
          pause();  // wrote all this round may write: wait for the kill
          continue;
        }
        const storage::ChunkKey key = testing::KeyOf(seed, i);
        const std::vector<uint8_t> payload = testing::PayloadOf(key, testing::kCrashChunkBytes);
        const bool memory = i % 4 == 1;
        storage::PutOptions opts{
            memory ? storage::Durability::kMemory : storage::Durability::kDurable, 0};
        if (!(*store)->Put({testing::kCrashNamespace, key, {}, payload}, opts).ok()) continue;
        const std::string line = (memory ? "m " : "d ") + std::to_string(i) + "\n";
        if (write(acks, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
          std::abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  return 0;
}
