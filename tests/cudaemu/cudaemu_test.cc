// The CUDA emulation itself: barriers, shuffles, block scans and atomics give CUDA's
// results on random inputs (fresh seeds); what a GPU rejects or faults on is refused or
// aborts with a message naming it; a missing barrier changes a kernel's result.
#include <cublas_v2.h>
#include <cub/block/block_scan.cuh>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "cudaemu/device.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace {

using ::cudaemu::Launch;

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// Tree reduction in shared memory, one barrier per level: the classic block sum.
__global__ void BlockSum(const int* x, int* out) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

TEST(CudaEmuTest, BarriersOrderSharedMemoryAcrossThreads) {
  std::mt19937_64 rng(kvc::testing::FreshSeed());
  constexpr int kBlocks = 5, kThreads = 256;
  std::vector<int> x(kBlocks * kThreads);
  for (int& v : x) v = static_cast<int>(rng() % 2001) - 1000;
  int* dx = ToDevice(x);
  int* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dout, kBlocks * sizeof(int)), cudaSuccess);
  Launch(BlockSum, "BlockSum", kBlocks, kThreads)(dx, dout);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = ToHost(dout, kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    int want = 0;
    for (int t = 0; t < kThreads; ++t) want += x[b * kThreads + t];
    EXPECT_EQ(got[b], want) << "block " << b;
  }
  cudaFree(dx);
  cudaFree(dout);
}

// Each thread publishes a value and reads its neighbour's (`step` away) with or without
// the barrier between.
__global__ void ReadNeighbour(const int* x, int step, bool barrier, int* out) {
  __shared__ int s[64];
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  s[t] = x[blockIdx.x * n + t];
  if (barrier) __syncthreads();
  out[blockIdx.x * n + t] = s[(t + step + n) % n];
}

constexpr bool kUnderThreadSanitizer =
#if defined(__SANITIZE_THREAD__)
    true;
#else
    false;
#endif

TEST(CudaEmuTest, AMissingBarrierChangesTheResultWhicheverThreadWritesFirst) {
  if (kUnderThreadSanitizer && std::getenv("CUDAEMU_EXPECT_RACE") == nullptr) {
    GTEST_SKIP() << "a deliberate race: ThreadSanitizerReportsAMissingBarrier runs it and "
                    "expects the report";
  }
  std::mt19937_64 rng(kvc::testing::FreshSeed());
  constexpr int kThreads = 64;
  std::vector<int> x(2 * kThreads);
  for (int& v : x) v = static_cast<int>(rng() % 1000) + 1;
  int* dx = ToDevice(x);
  int* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dout, 2 * kThreads * sizeof(int)), cudaSuccess);
  const auto want = [&](int i, int step) {
    const int b = i / kThreads, t = i % kThreads;
    return x[b * kThreads + (t + step + kThreads) % kThreads];
  };
  for (int step : {1, -1}) {
    Launch(ReadNeighbour, "ReadNeighbour", 2, kThreads)(dx, step, true, dout);
    std::vector<int> got = ToHost(dout, 2 * kThreads);
    for (int i = 0; i < 2 * kThreads; ++i) ASSERT_EQ(got[i], want(i, step)) << "step " << step;
    // Without the barrier, in the block whose threads run in the order that reads before
    // the neighbour writes, all but one read garbage; in the other, one does.
    Launch(ReadNeighbour, "ReadNeighbour", 2, kThreads)(dx, step, false, dout);
    got = ToHost(dout, 2 * kThreads);
    int wrong[2] = {0, 0};
    for (int i = 0; i < 2 * kThreads; ++i) wrong[i / kThreads] += got[i] != want(i, step);
    EXPECT_EQ(std::max(wrong[0], wrong[1]), kThreads - 1) << "step " << step;
    EXPECT_EQ(std::min(wrong[0], wrong[1]), 1) << "step " << step;
  }
  cudaFree(dx);
  cudaFree(dout);
}

// Under -DKVC_SANITIZE_THREAD=ON every CUDA thread is a TSan fiber ordered only by
// barriers: the test above, run in a child process, must be reported as a data race at the
// kernel's line — the race check on the kernels (scripts/race-check.sh) can fail.
TEST(CudaEmuTest, ThreadSanitizerReportsAMissingBarrier) {
  if (!kUnderThreadSanitizer) GTEST_SKIP() << "needs a -DKVC_SANITIZE_THREAD=ON build";
  setenv("CUDAEMU_EXPECT_RACE", "1", 1);
  const kvc::testing::ProcessResult r = kvc::testing::RunProgram(
      "/proc/self/exe",
      {"--gtest_filter=CudaEmuTest.AMissingBarrierChangesTheResultWhicheverThreadWritesFirst"});
  unsetenv("CUDAEMU_EXPECT_RACE");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("ThreadSanitizer: data race"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in ReadNeighbour"), std::string::npos) << r.err;
}

// Butterfly sum over a warp, then every lane reads lane 0's and the next lane's value.
__global__ void WarpShuffles(const float* x, float* sum, float* down, float* first) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float v = x[i];
  down[i] = __shfl_down_sync(0xffffffffu, v, 1);
  first[i] = __shfl_sync(0xffffffffu, v, 0);
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  sum[i] = v;
}

TEST(CudaEmuTest, WarpShufflesExchangeLanesAsCudaDefines) {
  std::mt19937_64 rng(kvc::testing::FreshSeed());
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  constexpr int kThreads = 128;
  std::vector<float> x(kThreads);
  for (float& v : x) v = u(rng);
  float* dx = ToDevice(x);
  float *dsum = nullptr, *ddown = nullptr, *dfirst = nullptr;
  ASSERT_EQ(cudaMalloc(&dsum, kThreads * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ddown, kThreads * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dfirst, kThreads * sizeof(float)), cudaSuccess);
  Launch(WarpShuffles, "WarpShuffles", 1, kThreads)(dx, dsum, ddown, dfirst);
  const auto sum = ToHost(dsum, kThreads), down = ToHost(ddown, kThreads),
             first = ToHost(dfirst, kThreads);
  for (int w = 0; w < kThreads / 32; ++w) {
    // The butterfly's order of additions, lane by lane, as the hardware does it.
    std::vector<float> v(x.begin() + 32 * w, x.begin() + 32 * w + 32);
    for (int off = 16; off > 0; off /= 2) {
      std::vector<float> next(32);
      for (int l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ off];
      v = next;
    }
    for (int l = 0; l < 32; ++l) {
      const int i = 32 * w + l;
      EXPECT_EQ(sum[i], v[l]) << "lane " << i;
      EXPECT_EQ(down[i], x[l == 31 ? i : i + 1]) << "lane " << i;
      EXPECT_EQ(first[i], x[32 * w]) << "lane " << i;
    }
  }
  for (float* p : {dx, dsum, ddown, dfirst}) cudaFree(p);
}

__global__ void ScanAndCount(const int* x, int* prefix, int* total, unsigned* count) {
  using Scan = cub::BlockScan<int, 512>;
  __shared__ typename Scan::TempStorage storage;
  int aggregate = 0;
  Scan(storage).ExclusiveSum(x[threadIdx.x], prefix[threadIdx.x], aggregate);
  if (threadIdx.x == 0) *total = aggregate;
  if (x[threadIdx.x] % 2 != 0) atomicAdd(count, 1u);
}

TEST(CudaEmuTest, BlockScanAndAtomicsGiveExactCounts) {
  std::mt19937_64 rng(kvc::testing::FreshSeed());
  std::vector<int> x(512);
  for (int& v : x) v = static_cast<int>(rng() % 100);
  int* dx = ToDevice(x);
  int *dprefix = nullptr, *dtotal = nullptr;
  unsigned* dcount = ToDevice(std::vector<unsigned>{0});
  ASSERT_EQ(cudaMalloc(&dprefix, 512 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dtotal, sizeof(int)), cudaSuccess);
  Launch(ScanAndCount, "ScanAndCount", 1, 512)(dx, dprefix, dtotal, dcount);
  const auto prefix = ToHost(dprefix, 512);
  int run = 0;
  unsigned odd = 0;
  for (int i = 0; i < 512; ++i) {
    EXPECT_EQ(prefix[i], run) << i;
    run += x[i];
    odd += x[i] % 2 != 0;
  }
  EXPECT_EQ(ToHost(dtotal, 1)[0], run);
  EXPECT_EQ(ToHost(dcount, 1)[0], odd);
  cudaFree(dx);
  cudaFree(dprefix);
  cudaFree(dtotal);
  cudaFree(dcount);
}

__global__ void DivergentBarrier(int* out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    __syncwarp();
  out[threadIdx.x] = 1;
}

__global__ void ShuffleWithAnExitedLane(float* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void Touch(float* p) { p[threadIdx.x] = 1.0f; }

TEST(CudaEmuDeathTest, WhatFaultsOrHangsOnAGpuAbortsNamingIt) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(int)), cudaSuccess);
  EXPECT_DEATH(
      {
        Launch(DivergentBarrier, "DivergentBarrier", 1, 32)(d);
        cudaDeviceSynchronize();
      },
      "DivergentBarrier.*deadlock");
  EXPECT_DEATH(
      {
        Launch(ShuffleWithAnExitedLane, "ShuffleWithAnExitedLane", 1,
               32)(reinterpret_cast<float*>(d));
        cudaDeviceSynchronize();
      },
      "reads lane 3 in a shuffle that lane did not join");
  std::vector<float> host(32);
  EXPECT_DEATH(Launch(Touch, "Touch", 1, 32)(host.data()),
               "kernel Touch, argument 0: .* neither device memory nor page-locked");
  cudaFree(d);
}

TEST(CudaEmuTest, PageLockedHostMemoryIsReachableFromKernels) {
  std::vector<float> host(32, 0.0f);
  ASSERT_EQ(cudaHostRegister(host.data(), host.size() * sizeof(float), cudaHostRegisterDefault),
            cudaSuccess);
  EXPECT_EQ(cudaHostRegister(host.data() + 4, 4, cudaHostRegisterDefault),
            cudaErrorHostMemoryAlreadyRegistered);
  Launch(Touch, "Touch", 1, 32)(host.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : host) EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(cudaHostUnregister(host.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(host.data()), cudaErrorHostMemoryNotRegistered);
}

// Work on a stream runs when something waits for it, as a GPU may run it that late: a
// result read before the wait, or used on another stream without an event, is wrong here.
TEST(CudaEmuTest, StreamWorkIsSeenOnlyAfterAWaitForIt) {
  if (const char* m = std::getenv("CUDAEMU_STREAMS");
      m != nullptr && std::string(m).starts_with("eager"))
    GTEST_SKIP() << "CUDAEMU_STREAMS=" << m << " runs some streams' work when it is queued";
  const bool was = cudaemu::SetDeferredStreams(true);  // the default; CUDAEMU_STREAMS may differ
  std::vector<float> host(32, 0.0f);
  ASSERT_EQ(cudaHostRegister(host.data(), host.size() * sizeof(float), cudaHostRegisterDefault),
            cudaSuccess);
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  Launch(Touch, "Touch", 1, 32, 0, a)(host.data());
  EXPECT_EQ(host[0], 0.0f);  // not waited for yet
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(host[0], 0.0f);  // another stream's synchronization does not reach it
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(host[0], 1.0f);
  // Across streams: b copies what a produces; without an event b reads the old bytes.
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(float)), cudaSuccess);
  std::vector<float> out(32, -1.0f);
  ASSERT_EQ(cudaHostRegister(out.data(), out.size() * sizeof(float), cudaHostRegisterDefault),
            cudaSuccess);
  Launch(Touch, "Touch", 1, 32, 0, a)(d);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 32 * sizeof(float), cudaMemcpyDeviceToHost, b),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_TRUE(std::isnan(out[0])) << out[0];  // fresh device memory: a ran later
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 32 * sizeof(float), a), cudaSuccess);
  Launch(Touch, "Touch", 1, 32, 0, a)(d);
  ASSERT_EQ(cudaEventRecord(done, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, done, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 32 * sizeof(float), cudaMemcpyDeviceToHost, b),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(out[0], 1.0f);  // the event ordered a's work first
  cudaEventDestroy(done);
  cudaFree(d);
  cudaHostUnregister(out.data());
  cudaHostUnregister(host.data());
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaemu::SetDeferredStreams(was);
}

TEST(CudaEmuTest, BadLaunchesAndCopiesFailAsOnAGpu) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  // Fresh device memory is garbage (all ones), never zeros.
  for (float v : ToHost(d, 64)) EXPECT_TRUE(std::isnan(v));
  Launch(Touch, "Touch", 1, 2048)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  Launch(Touch, "Touch", dim3(1, 70000), 32)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Launch(Touch, "Touch", 1, 32, 64 << 10)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);

  std::vector<float> host(64);
  EXPECT_EQ(cudaMemcpy(host.data(), d, 64 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 65 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // one float past the allocation
  EXPECT_EQ(cudaMemset(d + 1, 0, 64 * sizeof(float)), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d + 32, d, 32 * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST(CudaEmuTest, IpcSharesADeviceAllocationWithAnotherProcess) {
  constexpr size_t kBytes = size_t{2} << 20;
  uint8_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, kBytes), cudaSuccess);
  cudaIpcMemHandle_t h{};
  ASSERT_EQ(cudaIpcGetMemHandle(&h, d), cudaSuccess);
  void* own = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&own, h, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
  uint8_t* small = nullptr;
  ASSERT_EQ(cudaMalloc(&small, 1024), cudaSuccess);
  cudaIpcMemHandle_t hs{};
  EXPECT_EQ(cudaIpcGetMemHandle(&hs, small), cudaErrorNotSupported);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // map the parent's allocation, fill it, unmap
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) _exit(1);
    if (cudaMemset(p, 0x5A, kBytes) != cudaSuccess) _exit(2);
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  const std::vector<uint8_t> back = ToHost(d, kBytes);
  EXPECT_EQ(std::count(back.begin(), back.end(), uint8_t{0x5A}), static_cast<long>(kBytes));
  cudaFree(d);
  cudaFree(small);
}

TEST(CudaEmuTest, CublasSgemmIsColumnMajor) {
  std::mt19937_64 rng(kvc::testing::FreshSeed());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  constexpr int m = 3, n = 4, k = 5;
  std::vector<float> a(k * m), b(k * n), c(m * n, 0.0f);  // A stored transposed: k × m
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  float *da = ToDevice(a), *db = ToDevice(b), *dc = ToDevice(c);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, da, k, db, k, &zero, dc, m),
            CUBLAS_STATUS_SUCCESS);
  const auto got = ToHost(dc, m * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0.0;
      for (int l = 0; l < k; ++l) want += double{a[i * k + l]} * b[j * k + l];
      EXPECT_NEAR(got[i + j * m], want, 1e-5) << i << "," << j;
    }
  }
  EXPECT_EQ(
      cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a.data(), k, db, k, &zero, dc, m),
      CUBLAS_STATUS_INVALID_VALUE);  // A in host memory
  cublasDestroy(h);
  for (float* p : {da, db, dc}) cudaFree(p);
}

}  // namespace
