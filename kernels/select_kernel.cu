#include <cub/block/block_scan.cuh>

#include "kernels/query_slices.cuh"
#include "kernels/select_kernel.cuh"

namespace kvc::cuda {
namespace {

constexpr int kThreads = 1024;

// Order-preserving unsigned key of a float: a higher float has a higher key; −0 and +0
// share one (they compare equal on the CPU).
__device__ __forceinline__ uint32_t Key(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One block per query. Radix select (4 passes of 8 bits, most significant first) finds the
// key of the k-th best score and how many scores equal to it to take; a pass in position
// order then keeps every better score and the first `need` equal ones, writing positions
// through a block-wide prefix sum, so they come out in increasing order.
__global__ void TopKKernel(const float* scores, int64_t ld, const int32_t* counts, int64_t k,
                           int32_t* out, int32_t* out_count) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned hist[256];
  __shared__ uint32_t prefix, prefix_mask;
  __shared__ int64_t remaining, valid;
  __shared__ int running_gt, running_eq;
  const int64_t q = blockIdx.x;
  const float* s = scores + q * ld;
  const int64_t n = counts != nullptr ? counts[q] : ld;
  int32_t* o = out + q * k;
  const uint32_t kNegInfKey = Key(-INFINITY);
  if (threadIdx.x == 0) {
    prefix = 0;
    prefix_mask = 0;
    remaining = k;
    valid = 0;
    running_gt = 0;
    running_eq = 0;
  }
  __syncthreads();
  // How many scores can be taken at all (everything but −inf).
  int mine = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mine += Key(s[i]) != kNegInfKey;
  atomicAdd(reinterpret_cast<unsigned long long*>(&valid), static_cast<unsigned long long>(mine));
  __syncthreads();
  const bool take_all = valid <= k;
  if (!take_all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t key = Key(s[i]);
        if (key != kNegInfKey && (key & prefix_mask) == prefix)
          atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // the bin where the count from the top reaches `remaining`
        int64_t above = 0;
        int b = 255;
        for (; b > 0 && above + hist[b] < remaining; --b) above += hist[b];
        remaining -= above;
        prefix |= static_cast<uint32_t>(b) << shift;
        prefix_mask |= 0xFFu << shift;
      }
      __syncthreads();
    }
  }
  // prefix: the k-th best key; remaining: how many scores equal to it are taken.
  const uint32_t threshold = prefix;
  const int64_t need = remaining;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const uint32_t key = i < n ? Key(s[i]) : kNegInfKey;
    const bool usable = i < n && key != kNegInfKey;
    const int eq = !take_all && usable && key == threshold;
    int eq_rank = 0, eq_total = 0;
    Scan(scan).ExclusiveSum(eq, eq_rank, eq_total);
    __syncthreads();
    const bool take =
        usable && (take_all || key > threshold || (eq && running_eq + eq_rank < need));
    int at = 0, taken = 0;
    Scan(scan).ExclusiveSum(take ? 1 : 0, at, taken);
    if (take) o[running_gt + at] = static_cast<int32_t>(i);
    __syncthreads();
    if (threadIdx.x == 0) {
      running_gt += taken;
      running_eq += eq_total;
    }
    __syncthreads();
  }
  for (int64_t i = running_gt + threadIdx.x; i < k; i += blockDim.x) o[i] = -1;
  if (threadIdx.x == 0) out_count[q] = running_gt;
}

__global__ void BlockMaximaKernel(const float* scores, int64_t ld, const int32_t* counts,
                                  int64_t block, int64_t nblocks, float* best) {
  const int64_t q = blockIdx.y;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= nblocks) return;
  const int64_t n = counts != nullptr ? counts[q] : ld;
  float m = -INFINITY;
  for (int64_t t = b * block; t < (b + 1) * block && t < n; ++t) m = fmaxf(m, scores[q * ld + t]);
  if (n > 0 && b == (n - 1) / block) m = INFINITY;
  best[q * nblocks + b] = m;
}

__global__ void PoolPositionsKernel(const int32_t* blocks, int64_t topk_blocks, int64_t block,
                                    const int32_t* counts, int32_t* pool, int32_t* pool_count) {
  __shared__ int taken;
  const int64_t q = blockIdx.x;
  const int64_t n = counts[q];
  const int64_t width = topk_blocks * block;
  int32_t* p = pool + q * width;
  if (threadIdx.x == 0) taken = 0;
  __syncthreads();
  // Blocks come ascending with the unused (−1) ones last, and the block holding the last
  // visible position is always taken and is the highest: so the positions fill a prefix
  // of the row in increasing order, only that block can be cut short, and −1 follows.
  int mine = 0;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int32_t b = blocks[q * topk_blocks + e / block];
    const int64_t t = b < 0 ? -1 : static_cast<int64_t>(b) * block + e % block;
    const bool valid = t >= 0 && t < n;
    p[e] = valid ? static_cast<int32_t>(t) : -1;
    mine += valid;
  }
  atomicAdd(&taken, mine);
  __syncthreads();
  if (threadIdx.x == 0) pool_count[q] = taken;
}

__global__ void ListPositionsKernel(const int32_t* list, int64_t width, const int32_t* count,
                                    int64_t k, int32_t* sel) {
  const int64_t q = blockIdx.x;
  for (int64_t i = threadIdx.x; i < count[q]; i += blockDim.x)
    sel[q * k + i] = list[q * width + sel[q * k + i]];
}

// One thread: the queries' list lengths summed in order (a few thousand at most per pass).
__global__ void AppendedOffsetsKernel(const int32_t* offsets, const int32_t* count, int64_t queries,
                                      int32_t* out_offsets) {
  int32_t at = 0;
  out_offsets[0] = 0;
  for (int64_t q = 0; q < queries; ++q) {
    at += offsets[q + 1] - offsets[q] + count[q];
    out_offsets[q + 1] = at;
  }
}

__global__ void AppendEntriesKernel(const int32_t* offsets, const int32_t* entries,
                                    const int32_t* sel, const int32_t* count, int64_t k,
                                    const int32_t* out_offsets, int32_t* out_entries) {
  const int64_t q = blockIdx.x;
  const int32_t own = offsets[q + 1] - offsets[q];
  int32_t* out = out_entries + out_offsets[q];
  for (int32_t i = threadIdx.x; i < own; i += blockDim.x) out[i] = entries[offsets[q] + i];
  for (int32_t i = threadIdx.x; i < count[q]; i += blockDim.x) out[own + i] = -sel[q * k + i] - 1;
}

}  // namespace

cudaError_t LaunchListPositions(const int32_t* list, int64_t width, const int32_t* count,
                                int64_t queries, int64_t k, int32_t* sel, cudaStream_t stream) {
  if (queries == 0) return cudaSuccess;
  ListPositionsKernel<<<static_cast<unsigned>(queries), 256, 0, stream>>>(list, width, count, k,
                                                                          sel);
  return cudaGetLastError();
}

cudaError_t LaunchAppendSelection(const int32_t* offsets, const int32_t* entries, int64_t queries,
                                  const int32_t* sel, const int32_t* count, int64_t k,
                                  int32_t* out_offsets, int32_t* out_entries, cudaStream_t stream) {
  if (queries == 0) return cudaSuccess;
  AppendedOffsetsKernel<<<1, 1, 0, stream>>>(offsets, count, queries, out_offsets);
  AppendEntriesKernel<<<static_cast<unsigned>(queries), 256, 0, stream>>>(
      offsets, entries, sel, count, k, out_offsets, out_entries);
  return cudaGetLastError();
}

cudaError_t LaunchTopK(const float* scores, int64_t ld, const int32_t* counts, int64_t queries,
                       int64_t k, int32_t* out, int32_t* out_count, cudaStream_t stream) {
  if (queries == 0) return cudaSuccess;
  if (k <= 0) return cudaErrorInvalidValue;
  TopKKernel<<<static_cast<unsigned>(queries), kThreads, 0, stream>>>(scores, ld, counts, k, out,
                                                                      out_count);
  return cudaGetLastError();
}

cudaError_t LaunchBlockMaxima(const float* scores, int64_t ld, const int32_t* counts,
                              int64_t queries, int64_t block, float* best, cudaStream_t stream) {
  if (queries == 0 || ld == 0) return cudaSuccess;
  if (block <= 0) return cudaErrorInvalidValue;
  const int64_t nblocks = (ld + block - 1) / block;
  ForEachQuerySlice(queries, [&](int64_t q0, int64_t n) {
    const dim3 grid(static_cast<unsigned>((nblocks + 255) / 256), static_cast<unsigned>(n));
    BlockMaximaKernel<<<grid, 256, 0, stream>>>(scores + q0 * ld, ld,
                                                counts != nullptr ? counts + q0 : nullptr, block,
                                                nblocks, best + q0 * nblocks);
  });
  return cudaGetLastError();
}

cudaError_t LaunchPoolPositions(const int32_t* blocks, int64_t topk_blocks, int64_t block,
                                const int32_t* counts, int64_t queries, int32_t* pool,
                                int32_t* pool_count, cudaStream_t stream) {
  if (queries == 0) return cudaSuccess;
  PoolPositionsKernel<<<static_cast<unsigned>(queries), 256, 0, stream>>>(
      blocks, topk_blocks, block, counts, pool, pool_count);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
