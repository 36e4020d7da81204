#include "kernels/cuda_indexer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
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
  explicit CudaIndexer(std::shared_ptr<PageMirror> mirror) : mirror_(std::move(mirror)) {}
  const char* name() const override { return "cuda"; }

  void Select(const model::IndexerBatch& b) const override {
    const int64_t rows = b.queries;
    if (rows == 0) return;
    std::lock_guard lock(mu_);  // one call at a time on the device
    const int64_t a = b.first_position, max_cl = (a + rows) / b.ratio;
    std::vector<int32_t> visible(rows);
    for (int64_t r = 0; r < rows; ++r) visible[r] = static_cast<int32_t>((a + r + 1) / b.ratio);
    // The pages holding index keys [0, max_cl), current on the device (the mirror uploads
    // those written since the last call; the default stream orders them before the kernels).
    PagedIndexKv paged = IndexSections(nullptr, *b.layout, b.layer);
    const int64_t page_count = max_cl == 0 ? 0 : (max_cl - 1) / paged.per_page + 1;
    PageMirror::View view;  // held until the kernels are done with the pages
    if (page_count > 0) {
      view = mirror_->Pages(b.sequence, b.pages, b.page_versions, page_count,
                            static_cast<size_t>(paged.page_bytes), nullptr);
      paged.pages = view.device;
    }
    DeviceBuffer<float> qi(std::span<const float>(b.qi, rows * b.heads * b.dim)),
        w(std::span<const float>(b.w, rows * b.heads));
    DeviceBuffer<int32_t> d_visible(visible);
    std::vector<std::vector<int32_t>> candidates;  // kApply: each query's pool positions
    if (b.pool_use == model::PoolUse::kApply) {
      size_t width = 1;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t>& c = candidates.emplace_back();
        const std::vector<uint8_t>& mask = (*b.pool)[r];
        const int64_t n = std::min<int64_t>(visible[r], static_cast<int64_t>(mask.size()));
        for (int64_t t = 0; t < n; ++t)
          if (mask[t]) c.push_back(static_cast<int32_t>(t));
        width = std::max(width, c.size());
      }
      std::vector<int32_t> list(rows * width, -1), counts(rows);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(candidates[r].begin(), candidates[r].end(), list.begin() + r * width);
        counts[r] = static_cast<int32_t>(candidates[r].size());
      }
      DeviceBuffer<int32_t> d_list(list), d_counts(counts);
      DeviceBuffer<float> scores(list.size());
      CUDA_CHECK(LaunchPagedIndexerScoresAt(qi.get(), w.get(), paged, d_list.get(), rows,
                                            static_cast<int64_t>(width), b.heads, b.dim,
                                            scores.get(), nullptr));
      Selection sel(rows, b.topk);
      sel.Launch(scores.get(), static_cast<int64_t>(width), d_counts.get());
      const std::vector<std::vector<int32_t>> picked = Read(sel);
      for (int64_t r = 0; r < rows; ++r) {  // list indices → positions (both ascending)
        std::vector<int32_t>& out = (*b.selected)[r];
        out.clear();
        for (int32_t i : picked[r]) out.push_back(candidates[r][i]);
      }
      return;
    }
    const int64_t ld = std::max<int64_t>(max_cl, 1);
    DeviceBuffer<float> scores(static_cast<size_t>(rows * ld));
    CUDA_CHECK(LaunchPagedIndexerScores(qi.get(), w.get(), paged, d_visible.get(), rows, b.heads,
                                        b.dim, ld, scores.get(), nullptr));
    if (b.pool_use == model::PoolUse::kProduce) {
      const int64_t nblocks = (ld + b.block - 1) / b.block;
      const int64_t width = b.topk_blocks * b.block;
      DeviceBuffer<float> best(static_cast<size_t>(rows * nblocks));
      DeviceBuffer<int32_t> top(static_cast<size_t>(rows * b.topk_blocks)),
          ntop(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows * width)),
          npos(static_cast<size_t>(rows));
      CUDA_CHECK(
          LaunchBlockMaxima(scores.get(), ld, d_visible.get(), rows, b.block, best.get(), nullptr));
      CUDA_CHECK(LaunchTopK(best.get(), nblocks, nullptr, rows, b.topk_blocks, top.get(),
                            ntop.get(), nullptr));
      CUDA_CHECK(LaunchPoolPositions(top.get(), b.topk_blocks, b.block, d_visible.get(), rows,
                                     pos.get(), npos.get(), nullptr));
      // The selection does not need the pool: both come back with one wait.
      Selection sel(rows, b.topk);
      sel.Launch(scores.get(), ld, d_visible.get());
      std::vector<int32_t> flat, count, sel_flat, sel_count;
      ReadBack({{&pos, &flat}, {&npos, &count}, {&sel.out, &sel_flat}, {&sel.n, &sel_count}});
      for (int64_t r = 0; r < rows; ++r) {  // positions → the CPU's mask of visible length
        std::vector<uint8_t>& mask = (*b.pool)[r];
        mask.assign(visible[r], 0);
        for (int32_t i = 0; i < count[r]; ++i) mask[flat[r * width + i]] = 1;
      }
      *b.selected = sel.Picked(sel_flat, sel_count);
      return;
    }
    Selection sel(rows, b.topk);
    sel.Launch(scores.get(), ld, d_visible.get());
    *b.selected = Read(sel);
  }

 private:
  // Per row, the top-k positions of scores (rows × ld, counts[r] visible) in order: out
  // holds them (k per row), n how many each row has.
  struct Selection {
    Selection(int64_t rows, int64_t topk)
        : k(topk), out(static_cast<size_t>(rows * topk)), n(static_cast<size_t>(rows)) {}
    void Launch(const float* scores, int64_t ld, const int32_t* counts) {
      CUDA_CHECK(LaunchTopK(scores, ld, counts, static_cast<int64_t>(n.size()), k, out.get(),
                            n.get(), nullptr));
    }
    std::vector<std::vector<int32_t>> Picked(const std::vector<int32_t>& flat,
                                             const std::vector<int32_t>& count) const {
      std::vector<std::vector<int32_t>> picked(count.size());
      for (size_t r = 0; r < count.size(); ++r)
        picked[r].assign(flat.begin() + r * k, flat.begin() + r * k + count[r]);
      return picked;
    }
    int64_t k;
    DeviceBuffer<int32_t> out, n;
  };
  // Device arrays back into host vectors: copies queued after the kernels on the default
  // stream into page-locked staging, then one wait for all of them.
  void ReadBack(
      std::initializer_list<std::pair<const DeviceBuffer<int32_t>*, std::vector<int32_t>*>> parts)
      const {
    size_t total = 0;
    for (const auto& [d, h] : parts) total += d->size();
    int32_t* staged = staged_.Reserve(total);
    size_t at = 0;
    for (const auto& [d, h] : parts) {
      if (d->size() > 0)
        CUDA_CHECK(cudaMemcpyAsync(staged + at, d->get(), d->size() * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, nullptr));
      at += d->size();
    }
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
    at = 0;
    for (const auto& [d, h] : parts) {
      h->assign(staged + at, staged + at + d->size());
      at += d->size();
    }
  }
  std::vector<std::vector<int32_t>> Read(const Selection& sel) const {
    std::vector<int32_t> flat, count;
    ReadBack({{&sel.out, &flat}, {&sel.n, &count}});
    return sel.Picked(flat, count);
  }
  mutable std::mutex mu_;
  const std::shared_ptr<PageMirror> mirror_;
  mutable GrowingPinnedBuffer<int32_t> staged_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::IndexerBackend>> MakeCudaIndexer(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaIndexer>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
