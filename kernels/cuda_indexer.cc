#include "kernels/cuda_indexer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "kernels/attention_kernel.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops.h"
#include "kernels/select_kernel.cuh"

namespace kvc::cuda {
namespace {

class CudaIndexer final : public model::IndexerBackend {
 public:
  explicit CudaIndexer(std::shared_ptr<PageMirror> mirror) : mirror_(std::move(mirror)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaIndexer() override { cudaStreamDestroy(stream_); }
  const char* name() const override { return "cuda"; }

  // The inputs go up in one copy through page-locked staging, the kernels run on the
  // backend's stream, and everything the host needs comes back in one copy: one wait.
  void Select(const model::IndexerBatch& b) const override {
    const int64_t rows = b.queries;
    if (rows == 0) return;
    const int64_t a = b.first_position, max_cl = (a + rows) / b.ratio;
    std::vector<int32_t> visible(rows);
    for (int64_t r = 0; r < rows; ++r) visible[r] = static_cast<int32_t>((a + r + 1) / b.ratio);
    // kApply: each query's pool positions, as a list of `width` per query (−1 pads).
    std::vector<std::vector<int32_t>> candidates;
    std::vector<int32_t> list, counts;
    int64_t width = 1;
    if (b.pool_use == model::PoolUse::kApply) {
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t>& c = candidates.emplace_back();
        const std::vector<uint8_t>& mask = (*b.pool)[r];
        const int64_t n = std::min<int64_t>(visible[r], static_cast<int64_t>(mask.size()));
        for (int64_t t = 0; t < n; ++t)
          if (mask[t]) c.push_back(static_cast<int32_t>(t));
        width = std::max(width, static_cast<int64_t>(c.size()));
      }
      list.assign(static_cast<size_t>(rows * width), -1);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(candidates[r].begin(), candidates[r].end(), list.begin() + r * width);
        counts.push_back(static_cast<int32_t>(candidates[r].size()));
      }
    }
    const int64_t ld = std::max<int64_t>(max_cl, 1), k = b.topk;
    const bool produce = b.pool_use == model::PoolUse::kProduce;
    const int64_t nblocks = (ld + b.block - 1) / b.block, pool_width = b.topk_blocks * b.block;
    // The regions: what goes up, what stays on the device, what comes back.
    Carve in, dev, res;
    const size_t in_qi = in.Take<float>(rows * b.heads * b.dim),
                 in_w = in.Take<float>(rows * b.heads), in_visible = in.Take<int32_t>(rows),
                 in_list = in.Take<int32_t>(list.size()),
                 in_counts = in.Take<int32_t>(counts.size());
    const size_t scores = dev.Take<float>(list.empty() ? rows * ld : list.size()),
                 best = dev.Take<float>(produce ? rows * nblocks : 0),
                 top = dev.Take<int32_t>(produce ? rows * b.topk_blocks : 0),
                 ntop = dev.Take<int32_t>(produce ? rows : 0);
    const size_t res_sel = res.Take<int32_t>(rows * k), res_n = res.Take<int32_t>(rows),
                 res_pool = res.Take<int32_t>(produce ? rows * pool_width : 0),
                 res_npool = res.Take<int32_t>(produce ? rows : 0);

    std::lock_guard lock(mu_);  // one call at a time on the stream and the buffers
    std::byte* h_in = in_host_.Reserve(in.bytes());
    std::byte* d_in = in_.Reserve(in.bytes());
    std::byte* d = dev_.Reserve(dev.bytes());
    std::byte* d_res = res_.Reserve(res.bytes());
    std::byte* h_res = res_host_.Reserve(res.bytes());
    auto put = [&](size_t at, const void* from, size_t bytes) {
      if (bytes > 0) std::memcpy(h_in + at, from, bytes);
    };
    put(in_qi, b.qi, static_cast<size_t>(rows * b.heads * b.dim) * sizeof(float));
    put(in_w, b.w, static_cast<size_t>(rows * b.heads) * sizeof(float));
    put(in_visible, visible.data(), visible.size() * sizeof(int32_t));
    put(in_list, list.data(), list.size() * sizeof(int32_t));
    put(in_counts, counts.data(), counts.size() * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(d_in, h_in, in.bytes(), cudaMemcpyHostToDevice, stream_));
    // The pages holding index keys [0, max_cl), current on the device once the stream has
    // run the mirror's uploads of those written since the last call.
    PagedIndexKv paged = IndexSections(nullptr, *b.layout, b.layer);
    const int64_t page_count = max_cl == 0 ? 0 : (max_cl - 1) / paged.per_page + 1;
    PageMirror::View view;  // held until the kernels are done with the pages
    if (page_count > 0) {
      view = mirror_->Pages(b.sequence, b.pages, b.page_versions, page_count,
                            static_cast<size_t>(paged.page_bytes), stream_);
      paged.pages = view.device;
    }
    const float* qi = At<float>(d_in, in_qi);
    const float* w = At<float>(d_in, in_w);
    const int32_t* d_visible = At<int32_t>(d_in, in_visible);
    float* d_scores = At<float>(d, scores);
    int32_t* sel = At<int32_t>(d_res, res_sel);
    int32_t* sel_n = At<int32_t>(d_res, res_n);
    if (!list.empty()) {  // kApply: score the pool's positions, select among them
      CUDA_CHECK(LaunchPagedIndexerScoresAt(qi, w, paged, At<int32_t>(d_in, in_list), rows, width,
                                            b.heads, b.dim, d_scores, stream_));
      CUDA_CHECK(
          LaunchTopK(d_scores, width, At<int32_t>(d_in, in_counts), rows, k, sel, sel_n, stream_));
    } else {
      CUDA_CHECK(LaunchPagedIndexerScores(qi, w, paged, d_visible, rows, b.heads, b.dim, ld,
                                          d_scores, stream_));
      if (produce) {  // the pool from the same scores; it does not hold up the selection
        CUDA_CHECK(
            LaunchBlockMaxima(d_scores, ld, d_visible, rows, b.block, At<float>(d, best), stream_));
        CUDA_CHECK(LaunchTopK(At<float>(d, best), nblocks, nullptr, rows, b.topk_blocks,
                              At<int32_t>(d, top), At<int32_t>(d, ntop), stream_));
        CUDA_CHECK(LaunchPoolPositions(At<int32_t>(d, top), b.topk_blocks, b.block, d_visible, rows,
                                       At<int32_t>(d_res, res_pool), At<int32_t>(d_res, res_npool),
                                       stream_));
      }
      CUDA_CHECK(LaunchTopK(d_scores, ld, d_visible, rows, k, sel, sel_n, stream_));
    }
    CUDA_CHECK(cudaMemcpyAsync(h_res, d_res, res.bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));

    const int32_t* picked = At<int32_t>(h_res, res_sel);
    const int32_t* picked_n = At<int32_t>(h_res, res_n);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t>& out = (*b.selected)[r];
      out.assign(picked + r * k, picked + r * k + picked_n[r]);
      if (!list.empty()) {  // list indices → positions (both ascending)
        for (int32_t& i : out) i = candidates[r][i];
      }
    }
    if (produce) {  // positions → the CPU's mask of visible length
      const int32_t* pool = At<int32_t>(h_res, res_pool);
      const int32_t* pool_n = At<int32_t>(h_res, res_npool);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t>& mask = (*b.pool)[r];
        mask.assign(visible[r], 0);
        for (int32_t i = 0; i < pool_n[r]; ++i) mask[pool[r * pool_width + i]] = 1;
      }
    }
  }

 private:
  mutable std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  const std::shared_ptr<PageMirror> mirror_;
  mutable GrowingPinnedBuffer<std::byte> in_host_, res_host_;
  mutable GrowingDeviceBuffer<std::byte> in_, dev_, res_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::IndexerBackend>> MakeCudaIndexer(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaIndexer>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
