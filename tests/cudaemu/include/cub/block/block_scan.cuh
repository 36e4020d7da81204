// cub::BlockScan's exclusive sums for the kernel emulation build: the block's values go
// through its TempStorage between two barriers, as with cub every thread of the block must
// call, and reusing the storage needs a __syncthreads() first.
#pragma once

#include "cudaemu/device.h"

namespace cub {

template <typename T, int kBlockDimX, int kAlgorithm = 0, int kBlockDimY = 1, int kBlockDimZ = 1>
class BlockScan {
 public:
  static constexpr int kThreads = kBlockDimX * kBlockDimY * kBlockDimZ;
  struct TempStorage {
    T values[kThreads];
    T prefix[kThreads];
    T total;
  };

  explicit BlockScan(TempStorage& storage) : s_(storage) {}

  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }

  void ExclusiveSum(T input, T& output, T& aggregate) {
    const int i =
        static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    if (static_cast<int>(blockDim.x * blockDim.y * blockDim.z) != kThreads) {
      ::cudaemu::Self("cub::BlockScan with a block size other than its template's");
    }
    s_.values[i] = input;
    __syncthreads();
    if (i == 0) {
      T run{};
      for (int j = 0; j < kThreads; ++j) {
        s_.prefix[j] = run;
        run = run + s_.values[j];
      }
      s_.total = run;
    }
    __syncthreads();
    output = s_.prefix[i];
    aggregate = s_.total;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
