// CUDA FP4 dequantization against the CPU codec, bit for bit. Skips without a GPU; the
// <test>_emu build runs it on the CPU emulation of CUDA (tests/cudaemu).
#include "kernels/kv_dequant.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace kvc {
namespace {

TEST(KvDequantCudaTest, MatchesCpuCodecBitForBit) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(testing::FreshSeed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 8);
  for (KvFormat f : {KvFormat::kMainKv, KvFormat::kIndexK}) {
    for (int64_t rows : {1, 3, 257, 4096}) {
      const int64_t dim = f == KvFormat::kMainKv ? 512 : 128;
      const int64_t n = rows * dim;
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * std::ldexp(1.0f, exponent(rng));
      std::vector<uint8_t> codes(CodesBytes(f, n)), scales(ScalesBytes(f, n));
      Quantize(f, x, codes, scales);
      std::vector<float> cpu(n);
      Dequantize(f, codes, scales, cpu);
      // Guard values around the device output catch writes past either end.
      std::vector<float> gpu(n + 64, 12345.0f);
      ASSERT_TRUE(cuda::DequantizeOnDevice(f, codes, scales, std::span(gpu).subspan(32, n)).ok());
      for (int i = 0; i < 32; ++i) {
        ASSERT_EQ(gpu[i], 12345.0f);
        ASSERT_EQ(gpu[32 + n + i], 12345.0f);
      }
      ASSERT_EQ(std::memcmp(cpu.data(), gpu.data() + 32, n * sizeof(float)), 0)
          << SpecOf(f).name << " rows " << rows;
    }
  }
}

TEST(KvDequantCudaTest, RejectsBadArgumentsWithoutTouchingTheDevice) {
  std::vector<uint8_t> codes(8), scales(1);
  std::vector<float> out(16);
  EXPECT_EQ(cuda::DequantizeOnDevice(KvFormat::kSwaKv, codes, scales, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cuda::DequantizeOnDevice(KvFormat::kMainKv, codes, scales, std::span(out).first(8)).code(),
      absl::StatusCode::kInvalidArgument);
  const absl::Status s = cuda::DequantizeOnDevice(KvFormat::kMainKv, codes, scales, out);
  if (cuda::DeviceCount() == 0) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace kvc
