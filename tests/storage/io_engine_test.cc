// The IoEngine contract the SSD tier builds on: one Execute may carry more ops than the
// engine's queue depth, an op may be lent its buffer in on_prepare, and at most the queue
// depth of ops (one for posix) are ever between on_prepare and on_done — so a caller with
// that many staging buffers keeps the disk's queue full across a batch of any length.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/fault_injection.h"
#include "storage/io_engine.h"
#include "tests/testing/seed.h"

namespace kvc::storage {
namespace {

constexpr unsigned kDepth = 4;
constexpr uint32_t kBlock = 4096;
constexpr uint64_t kBlocks = 64;

enum class Kind { kUring, kPosix, kFaultyUring };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  constexpr const char* kNames[] = {"Uring", "Posix", "FaultyUring"};  // by Kind
  return kNames[static_cast<int>(info.param)];
}

// Buffers lent to ops in on_prepare and taken back in on_done, counting what the contract
// bounds.
class Loans {
 public:
  explicit Loans(unsigned n)
      : memory_(static_cast<uint8_t*>(std::aligned_alloc(kBlock, n * kBlock))) {
    for (unsigned b = 0; b < n; ++b) free_.push_back(memory_.get() + b * kBlock);
  }
  // False when no buffer is free: the engine broke its contract.
  bool Lend(IoOp& op) {
    if (free_.empty()) return false;
    op.buf = free_.back();
    op.buf_index = -1;  // not registered: these buffers are the test's own
    free_.pop_back();
    ++outstanding_;
    most_ = std::max(most_, outstanding_);
    return true;
  }
  void TakeBack(IoOp& op) {
    if (op.buf == nullptr) return;  // failed before it was prepared
    free_.push_back(op.buf);
    --outstanding_;
  }
  unsigned most() const { return most_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> memory_;
  std::vector<uint8_t*> free_;
  unsigned outstanding_ = 0, most_ = 0;
};

class IoEngineTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    dir_ = std::filesystem::temp_directory_path() /
           ("kvc-io-engine-" + std::to_string(getpid()) + "-" + std::to_string(seed_));
    std::filesystem::create_directories(dir_);
    fd_ = open((dir_ / "blocks").c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
    std::mt19937_64 rng(seed_);
    contents_.resize(kBlocks * kBlock);
    for (auto& b : contents_) b = static_cast<uint8_t>(rng());
    ASSERT_EQ(pwrite(fd_, contents_.data(), contents_.size(), 0),
              static_cast<ssize_t>(contents_.size()));
    if (GetParam() == Kind::kPosix) {
      engine_ = MakePosixIoEngine();
      most_allowed_ = 1;
      return;
    }
    absl::StatusOr<std::unique_ptr<IoEngine>> uring = MakeUringIoEngine(kDepth);
    if (!uring.ok()) GTEST_SKIP() << "io_uring unavailable: " << uring.status();
    engine_ = *std::move(uring);
    most_allowed_ = kDepth;
    if (GetParam() == Kind::kFaultyUring) {
      plan_ = std::make_shared<FaultPlan>(seed_);
      FaultRates rates;
      rates.read_eio = 5;    // reported done without ever being prepared
      rates.short_read = 5;  // half the bytes
      rates.write_eio = 5;
      plan_->set_rates(rates);
      engine_ = std::make_unique<FaultInjectingIoEngine>(std::move(engine_), plan_);
    }
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  uint64_t seed_ = 0;
  std::filesystem::path dir_;
  int fd_ = -1;
  std::vector<uint8_t> contents_;
  std::unique_ptr<IoEngine> engine_;
  std::shared_ptr<FaultPlan> plan_;
  unsigned most_allowed_ = 0;
};

TEST_P(IoEngineTest, ReadsOfABatchTenTimesTheDepthShareDepthLentBuffers) {
  std::mt19937_64 rng(seed_ + 1);
  std::vector<IoOp> ops(10 * kDepth + 3);
  std::vector<uint64_t> block(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    block[i] = rng() % kBlocks;
    ops[i] = IoOp{IoOp::Kind::kRead, fd_, block[i] * kBlock, nullptr, kBlock, -1, 0};
  }
  Loans loans(most_allowed_);
  std::vector<int> done(ops.size(), 0);
  bool ran_dry = false;
  size_t whole = 0;
  engine_->Execute(
      ops, [&](size_t k) { ran_dry |= !loans.Lend(ops[k]); },
      [&](size_t k) {
        ++done[k];
        if (ops[k].result == kBlock) {
          ++whole;
          EXPECT_EQ(0, std::memcmp(ops[k].buf, contents_.data() + block[k] * kBlock, kBlock))
              << "op " << k << " read block " << block[k];
        } else if (plan_ == nullptr || (ops[k].result != -EIO && ops[k].result != 0)) {
          // (Injected: EIO, or a short read — half a block, rounded down to sectors: none.)
          ADD_FAILURE() << "op " << k << " result " << ops[k].result;
        }
        loans.TakeBack(ops[k]);  // the buffer goes to the next op
      });
  EXPECT_FALSE(ran_dry) << "an op was prepared with every buffer lent";
  EXPECT_LE(loans.most(), most_allowed_);
  EXPECT_EQ(std::count(done.begin(), done.end(), 1), static_cast<long>(ops.size()))
      << "every op is reported done exactly once";
  if (plan_ == nullptr) {
    EXPECT_EQ(whole, ops.size());
  }
  if (GetParam() == Kind::kUring) {
    EXPECT_EQ(loans.most(), kDepth) << "the queue was kept full";
  }
}

TEST_P(IoEngineTest, WritesStagedInLentBuffersLandWhereTheyWereAimed) {
  std::mt19937_64 rng(seed_ + 2);
  // Every block once, in a shuffled order, each filled just before it goes out.
  std::vector<uint64_t> order(kBlocks);
  for (uint64_t b = 0; b < kBlocks; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t> want(kBlocks * kBlock);
  for (auto& b : want) b = static_cast<uint8_t>(rng());
  std::vector<IoOp> ops(kBlocks);
  for (size_t i = 0; i < ops.size(); ++i)
    ops[i] = IoOp{IoOp::Kind::kWrite, fd_, order[i] * kBlock, nullptr, kBlock, -1, 0};
  Loans loans(most_allowed_);
  bool ran_dry = false;
  engine_->Execute(
      ops,
      [&](size_t k) {
        if (!loans.Lend(ops[k])) {
          ran_dry = true;
          return;
        }
        std::memcpy(ops[k].buf, want.data() + order[k] * kBlock, kBlock);
      },
      [&](size_t k) { loans.TakeBack(ops[k]); });
  EXPECT_FALSE(ran_dry) << "an op was prepared with every buffer lent";
  EXPECT_LE(loans.most(), most_allowed_);
  std::vector<uint8_t> got(kBlocks * kBlock);
  ASSERT_EQ(pread(fd_, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  for (size_t i = 0; i < ops.size(); ++i) {
    const uint64_t b = order[i];
    EXPECT_TRUE(ops[i].result == kBlock || (plan_ != nullptr && ops[i].result == -EIO))
        << "op " << i << " result " << ops[i].result;
    const uint8_t* expect =
        ops[i].result == kBlock ? want.data() + b * kBlock : contents_.data() + b * kBlock;
    EXPECT_EQ(0, std::memcmp(got.data() + b * kBlock, expect, kBlock))
        << "block " << b << " (op " << i << ", result " << ops[i].result << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest,
                         ::testing::Values(Kind::kUring, Kind::kPosix, Kind::kFaultyUring),
                         KindName);

}  // namespace
}  // namespace kvc::storage
