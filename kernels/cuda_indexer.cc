#include "kernels/cuda_indexer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include "base/mutex.h"

#include "kernels/attention_kernel.cuh"
#include "kernels/cuda_check.h"
#include "kernels/cuda_matmul.h"
#include "kernels/device_buffer.h"
#include "kernels/device_selection.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops.h"
#include "kernels/select_kernel.cuh"

namespace kvc::cuda {
namespace {

// One call's own memory — its page-locked inputs, its results on the device and their
// page-locked copy — and its selection's events; reused once the call is settled (its
// inputs went up, its results came back) and its selection read.
struct Slot {
  Slot() {
    CUDA_CHECK(cudaEventCreate(&ready));
    CUDA_CHECK(cudaEventCreate(&consumed));
  }
  ~Slot() {
    cudaEventDestroy(consumed);
    cudaEventDestroy(ready);
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  GrowingPinnedBuffer<std::byte> in_host, res_host;
  GrowingDeviceBuffer<std::byte> res;
  cudaEvent_t ready = nullptr, consumed = nullptr;
};

// The slots of one indexer: taken per call, given back when the call is settled.
class SlotPool {
 public:
  Slot* Take() {
    MutexLock lock(mu_);
    if (free_.empty()) {
      all_.push_back(std::make_unique<Slot>());
      return all_.back().get();
    }
    Slot* s = free_.back();
    free_.pop_back();
    return s;
  }
  void Give(Slot* s) {
    MutexLock lock(mu_);
    free_.push_back(s);
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<Slot>> all_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot*> free_ ABSL_GUARDED_BY(mu_);
};

// A call's selection on the device (rows × k positions and counts in its slot's results);
// settling waits for the slot's results to come back and writes the caller's vectors.
class CudaHeldSelection final : public DeviceSelection {
 public:
  struct Results {  // where the host's copies go, and where they lie in the results
    std::vector<std::vector<int32_t>>* selected = nullptr;
    std::vector<std::vector<uint8_t>>* pool = nullptr;  // produced: positions → masks
    std::vector<int32_t> visible;
    size_t sel = 0, n = 0, pool_at = 0, npool = 0;
    int64_t pool_width = 0;
  };
  CudaHeldSelection(SlotPool& slots, Slot* slot, Results r)
      : pool_(slots), slot_(slot), r_(std::move(r)) {}
  ~CudaHeldSelection() override { Settle(); }
  void Settle() override {
    if (slot_ == nullptr) return;
    CUDA_CHECK(cudaEventSynchronize(slot_->ready));
    std::byte* h = slot_->res_host.data();
    const int32_t* picked = At<int32_t>(h, r_.sel);
    const int32_t* picked_n = At<int32_t>(h, r_.n);
    for (int64_t q = 0; q < queries; ++q)
      (*r_.selected)[q].assign(picked + q * k, picked + q * k + picked_n[q]);
    if (r_.pool != nullptr) {  // positions → the CPU's mask of visible length
      const int32_t* at = At<int32_t>(h, r_.pool_at);
      const int32_t* count = At<int32_t>(h, r_.npool);
      for (int64_t q = 0; q < queries; ++q) {
        std::vector<uint8_t>& mask = (*r_.pool)[q];
        mask.assign(r_.visible[q], 0);
        for (int32_t i = 0; i < count[q]; ++i) mask[at[q * r_.pool_width + i]] = 1;
      }
    }
    pool_.Give(slot_);
    slot_ = nullptr;
  }

 private:
  SlotPool& pool_;
  Slot* slot_;
  Results r_;
};

class CudaIndexer final : public model::IndexerBackend {
 public:
  explicit CudaIndexer(std::shared_ptr<PageMirror> mirror) : mirror_(std::move(mirror)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&before_in_));
  }
  ~CudaIndexer() override {
    cudaEventDestroy(before_in_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  void Select(const model::IndexerBatch& b) const override {
    if (std::unique_ptr<model::HeldSelection> held = SelectHeld(b)) held->Settle();
  }

  // The inputs go up in one copy through page-locked staging, the kernels run on the
  // backend's stream, and everything the host needs comes back in one copy, waited for
  // when the selection is settled.
  std::unique_ptr<model::HeldSelection> SelectHeld(const model::IndexerBatch& b) const override {
    const int64_t rows = b.queries;
    if (rows == 0) return nullptr;  // Select: nothing to do
    const int64_t a = b.first_position, max_cl = (a + rows) / b.ratio;
    CudaHeldSelection::Results out;
    out.selected = b.selected;
    std::vector<int32_t>& visible = out.visible;
    visible.resize(rows);
    for (int64_t r = 0; r < rows; ++r) visible[r] = static_cast<int32_t>((a + r + 1) / b.ratio);
    // kApply: each query's pool positions, as a list of `width` per query (−1 pads) — where
    // the candidate source's call left them (the same list: ascending, −1 after), or from
    // the host's masks.
    const bool apply = b.pool_use == model::PoolUse::kApply;
    const DeviceSelection* source = nullptr;
    if (apply && b.pool_held != nullptr) {
      source = dynamic_cast<const DeviceSelection*>(b.pool_held);
      if (source != nullptr && (source->pool == nullptr || source->queries != rows ||
                                source->first_position != a || source->ratio != b.ratio)) {
        source = nullptr;
      }
      if (source == nullptr) b.pool_held->Settle();  // the host's masks, then
    }
    std::vector<int32_t> list, counts;
    int64_t width = source != nullptr ? source->pool_width : 1;
    if (apply && source == nullptr) {
      std::vector<std::vector<int32_t>> candidates;
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
    const size_t scores = dev.Take<float>(apply ? rows * width : rows * ld),
                 best = dev.Take<float>(produce ? rows * nblocks : 0),
                 top = dev.Take<int32_t>(produce ? rows * b.topk_blocks : 0),
                 ntop = dev.Take<int32_t>(produce ? rows : 0);
    out.sel = res.Take<int32_t>(rows * k);
    out.n = res.Take<int32_t>(rows);
    out.pool_at = res.Take<int32_t>(produce ? rows * pool_width : 0);
    out.npool = res.Take<int32_t>(produce ? rows : 0);
    out.pool_width = pool_width;
    if (produce) out.pool = b.pool;

    Slot* slot = slots_.Take();  // this call's own staging and results
    MutexLock lock(mu_);         // one call at a time on the stream and the shared scratch
    std::byte* h_in = slot->in_host.Reserve(in.bytes());
    std::byte* d_in = in_.Reserve(in.bytes());
    std::byte* d = dev_.Reserve(dev.bytes());
    // The slot's last selection may still be read on another stream.
    CUDA_CHECK(cudaStreamWaitEvent(stream_, slot->consumed, 0));
    std::byte* d_res = slot->res.Reserve(res.bytes());
    slot->res_host.Reserve(res.bytes());
    auto put = [&](size_t at, const void* from, size_t bytes) {
      if (bytes > 0) std::memcpy(h_in + at, from, bytes);
    };
    // The queries and head weights may be the matmul backend's results still landing: copied
    // device-to-device into place on its stream, once this stream is done with d_in.
    const DeviceProducts* landing = LandingOn(b.landing);
    if (landing != nullptr) CUDA_CHECK(cudaEventRecord(before_in_, stream_));
    auto landed = [&](size_t at, const float* host, int64_t floats) {
      return landing != nullptr && floats > 0 &&
             landing->CopyLanding(host, static_cast<size_t>(floats), At<float>(d_in, at), stream_,
                                  before_in_);
    };
    const int64_t qi_floats = rows * b.heads * b.dim, w_floats = rows * b.heads;
    const bool qi_landed = landed(in_qi, b.qi, qi_floats);
    const bool w_landed = landed(in_w, b.w, w_floats);
    if (!qi_landed) put(in_qi, b.qi, static_cast<size_t>(qi_floats) * sizeof(float));
    if (!w_landed) put(in_w, b.w, static_cast<size_t>(w_floats) * sizeof(float));
    put(in_visible, visible.data(), visible.size() * sizeof(int32_t));
    put(in_list, list.data(), list.size() * sizeof(int32_t));
    put(in_counts, counts.data(), counts.size() * sizeof(int32_t));
    auto upload = [&](size_t from, size_t to) {
      if (to > from) {
        CUDA_CHECK(
            cudaMemcpyAsync(d_in + from, h_in + from, to - from, cudaMemcpyHostToDevice, stream_));
      }
    };
    if (!qi_landed && !w_landed) {
      upload(0, in.bytes());  // in one copy
    } else {
      if (!qi_landed) upload(in_qi, in_w);
      if (!w_landed) upload(in_w, in_visible);
      upload(in_visible, in.bytes());
    }
    // The pages holding index keys [0, max_cl), current on the device once the stream has
    // run the mirror's uploads of those written since the last call. The view may go with
    // this call: buffers move or go only through cudaFree, which waits for the device.
    PagedIndexKv paged = IndexSections(nullptr, *b.layout, b.layer);
    const int64_t page_count = max_cl == 0 ? 0 : (max_cl - 1) / paged.per_page + 1;
    PageMirror::View view;
    if (page_count > 0) {
      view = mirror_->Pages(b.sequence, b.pages, b.page_versions, page_count,
                            static_cast<size_t>(paged.page_bytes), stream_);
      paged.pages = view.device;
    }
    const float* qi = At<float>(d_in, in_qi);
    const float* w = At<float>(d_in, in_w);
    const int32_t* d_visible = At<int32_t>(d_in, in_visible);
    float* d_scores = At<float>(d, scores);
    int32_t* sel = At<int32_t>(d_res, out.sel);
    int32_t* sel_n = At<int32_t>(d_res, out.n);
    if (apply) {  // kApply: score the pool's positions, select among them
      const int32_t* d_list = source != nullptr ? source->pool : At<int32_t>(d_in, in_list);
      const int32_t* d_counts =
          source != nullptr ? source->pool_count : At<int32_t>(d_in, in_counts);
      CUDA_CHECK(LaunchPagedIndexerScoresAt(qi, w, paged, d_list, rows, width, b.heads, b.dim,
                                            d_scores, stream_));
      CUDA_CHECK(LaunchTopK(d_scores, width, d_counts, rows, k, sel, sel_n, stream_));
      CUDA_CHECK(LaunchListPositions(d_list, width, sel_n, rows, k, sel, stream_));
    } else {
      CUDA_CHECK(LaunchPagedIndexerScores(qi, w, paged, d_visible, rows, b.heads, b.dim, ld,
                                          d_scores, stream_));
      if (produce) {  // the pool from the same scores; it does not hold up the selection
        CUDA_CHECK(
            LaunchBlockMaxima(d_scores, ld, d_visible, rows, b.block, At<float>(d, best), stream_));
        CUDA_CHECK(LaunchTopK(At<float>(d, best), nblocks, nullptr, rows, b.topk_blocks,
                              At<int32_t>(d, top), At<int32_t>(d, ntop), stream_));
        CUDA_CHECK(LaunchPoolPositions(At<int32_t>(d, top), b.topk_blocks, b.block, d_visible, rows,
                                       At<int32_t>(d_res, out.pool_at),
                                       At<int32_t>(d_res, out.npool), stream_));
      }
      CUDA_CHECK(LaunchTopK(d_scores, ld, d_visible, rows, k, sel, sel_n, stream_));
    }
    CUDA_CHECK(cudaMemcpyAsync(slot->res_host.data(), d_res, res.bytes(), cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaEventRecord(slot->ready, stream_));
    auto held = std::make_unique<CudaHeldSelection>(slots_, slot, std::move(out));
    held->positions = sel;
    held->counts = sel_n;
    held->queries = rows;
    held->k = k;
    held->ready = slot->ready;
    held->consumed = slot->consumed;
    if (produce) {
      held->pool = At<int32_t>(d_res, out.pool_at);
      held->pool_count = At<int32_t>(d_res, out.npool);
      held->pool_width = pool_width;
    }
    held->first_position = a;
    held->ratio = b.ratio;
    return held;
  }

 private:
  mutable Mutex mu_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_in_ = nullptr;  // this stream done with in_ (a landing copy waits for it)
  const std::shared_ptr<PageMirror> mirror_;
  mutable SlotPool slots_;
  mutable GrowingDeviceBuffer<std::byte> in_ ABSL_GUARDED_BY(mu_), dev_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::IndexerBackend>> MakeCudaIndexer(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaIndexer>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
