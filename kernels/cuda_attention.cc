#include "kernels/cuda_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu/ops.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_matmul.h"
#include "kernels/device_buffer.h"
#include "kernels/device_selection.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops.h"
#include "kernels/kv_ops_kernel.cuh"
#include "kernels/row_ops_kernel.cuh"
#include "kernels/select_kernel.cuh"

namespace kvc::cuda {
namespace {

class CudaAttention final : public model::AttentionBackend {
 public:
  explicit CudaAttention(std::shared_ptr<PageMirror> mirror) : mirror_(std::move(mirror)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&projected_));
    CUDA_CHECK(cudaEventCreate(&read_));
  }
  ~CudaAttention() override {
    cudaEventDestroy(read_);
    cudaEventDestroy(projected_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  absl::Status CheckShape(int64_t heads, int64_t dim) const override {
    if (heads <= 0 || dim <= 0 || dim > kMaxAttentionDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA attention backend takes head_dim 1..", kMaxAttentionDim,
                       " and at least one head; the config has head_dim ", dim, " and ", heads,
                       " heads (use --backend cpu)"));
    }
    return absl::OkStatus();
  }

  bool ReadsHeld(const model::HeldSelection& selection) const override {
    return dynamic_cast<const DeviceSelection*>(&selection) != nullptr;
  }

  void Attend(const model::AttentionBatch& b) const override {
    if (b.queries == 0) return;
    GuardShape(b);
    std::lock_guard lock(mu_);
    PageMirror::View view;  // held until the kernel is done with the pages
    const float* d_o = QueueAttention(b, view);
    Return(d_o, static_cast<size_t>(b.queries * b.heads * b.dim), b.out);
  }

  // Attention, inverse RoPE, the groups' products and wo_b queued on one stream: one wait
  // and one copy back (the rows × dim of the layer's output) instead of one per step.
  bool AttendAndProject(const model::AttentionBatch& b, const model::OutputPath& p,
                        float* out) const override {
    const DeviceProducts* products = ProductsFor(b, p);
    if (products == nullptr) return false;
    if (b.queries == 0) return true;
    std::lock_guard lock(mu_);
    PageMirror::View view;
    const float* d_y = QueueAttendAndProject(b, p, *products, view);
    Return(d_y, static_cast<size_t>(b.queries * p.wo_b->out_features()), out);
    return true;
  }

  // The same queue, then the MoE sublayer on the matmul backend's stream after an event:
  // the layer's output never leaves the device, and its one wait covers both.
  bool AttendThenMoe(const model::AttentionBatch& b, const model::OutputPath& p,
                     const model::MoeSublayer& then) const override {
    const DeviceProducts* products = ProductsFor(b, p);
    if (products == nullptr || b.queries == 0 || !products->RunsMoeSublayer(b.queries, then)) {
      return false;
    }
    std::lock_guard lock(mu_);
    PageMirror::View view;  // held until the sublayer's wait, which covers this stream's work
    const float* d_y = QueueAttendAndProject(b, p, *products, view);
    CUDA_CHECK(cudaEventRecord(projected_, stream_));
    products->MoeSublayerAfter(d_y, projected_, read_, b.queries, then);
    handed_over_ = true;  // the next call's work waits until the output was read
    return true;
  }

 private:
  // The matmul backend when it can run `p` on the device with this batch, else null.
  // Aborts when the path does not fit the batch's heads (the model built both).
  static const DeviceProducts* ProductsFor(const model::AttentionBatch& b,
                                           const model::OutputPath& p) {
    const auto* products = dynamic_cast<const DeviceProducts*>(p.matmul);
    if (products == nullptr) return nullptr;  // products on the CPU
    const int64_t G = static_cast<int64_t>(p.wo_a.size()), width = b.heads * b.dim;
    const int64_t half = static_cast<int64_t>(p.rope_freqs->size());
    const int64_t gw = G > 0 ? width / G : 0, ol = G > 0 ? p.wo_a[0].out_features() : 0;
    bool fits = G > 0 && gw * G == width && 2 * half <= b.dim && p.wo_b->in_features() == G * ol;
    bool held = products->Holds(*p.wo_b);
    for (int64_t g = 0; g < G && fits; ++g) {
      fits = p.wo_a[g].in_features() == gw && p.wo_a[g].out_features() == ol;
      held = held && products->Holds(p.wo_a[g]);
    }
    if (!fits) {
      std::fprintf(stderr,
                   "CUDA attention: output path of %lld groups does not fit %lld heads × %lld\n",
                   static_cast<long long>(G), static_cast<long long>(b.heads),
                   static_cast<long long>(b.dim));
      std::abort();
    }
    return held ? products : nullptr;  // null: weights the matmul backend does not hold
  }
  // Attention, the inverse RoPE, the groups' products and wo_b queued on stream_; returns
  // the layer's output on the device (queries × wo_b's outputs). Needs mu_; `view` holds
  // the pages until the caller has waited.
  const float* QueueAttendAndProject(const model::AttentionBatch& b, const model::OutputPath& p,
                                     const DeviceProducts& products, PageMirror::View& view) const {
    GuardShape(b);
    const int64_t rows = b.queries, G = static_cast<int64_t>(p.wo_a.size());
    const int64_t width = b.heads * b.dim, gw = width / G, ol = p.wo_a[0].out_features();
    const int64_t half = static_cast<int64_t>(p.rope_freqs->size());
    // The CPU's angles, so the turn is its bits (CUDA's sin/cos may differ in the last bit).
    std::vector<int64_t> positions(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) positions[r] = p.first_position + r;
    const std::vector<float> turns = cpu::RopeTurns(*p.rope_freqs, positions, /*inverse=*/true);
    float* d_o = QueueAttention(b, view);  // rows × heads × dim
    float* d_turns = turns_.Reserve(turns.size());
    Copy(d_turns, turns.data(), turns.size() * sizeof(float));
    CUDA_CHECK(LaunchTurnTails(d_o, rows, b.heads, b.dim, d_turns, half, stream_));
    // Group g's input is columns [g·gw, (g+1)·gw) of each row: rows × G × gw → G × rows × gw
    // (the same array when there is one row or one group).
    const bool reshuffle = rows > 1 && G > 1;
    float* d_og = d_o;
    if (reshuffle) {
      d_og = og_.Reserve(static_cast<size_t>(rows * width));
      CUDA_CHECK(LaunchSwapOuterAxes(d_o, rows, G, gw, d_og, stream_));
    }
    float* d_ug = ug_.Reserve(static_cast<size_t>(G * rows * ol));
    for (int64_t g = 0; g < G; ++g)
      products.QueueProduct(d_og + g * rows * gw, rows, p.wo_a[g], d_ug + g * rows * ol, stream_);
    float* d_u = d_ug;  // rows × G × ol, the groups' results side by side
    if (reshuffle) {
      d_u = u_.Reserve(static_cast<size_t>(rows * G * ol));
      CUDA_CHECK(LaunchSwapOuterAxes(d_ug, G, rows, ol, d_u, stream_));
    }
    float* d_y = y_.Reserve(static_cast<size_t>(rows * p.wo_b->out_features()));
    products.QueueProduct(d_u, rows, *p.wo_b, d_y, stream_);
    return d_y;
  }
  void GuardShape(const model::AttentionBatch& b) const {
    if (absl::Status shape = CheckShape(b.heads, b.dim); !shape.ok()) {  // Model::Load asked
      std::fprintf(stderr, "%s\n", std::string(shape.message()).c_str());
      std::abort();
    }
  }
  // Queues the uploads and the attention kernel; returns the output on the device
  // (queries × heads × dim). `view` holds the pages until the caller has waited. Needs mu_.
  float* QueueAttention(const model::AttentionBatch& b, PageMirror::View& view) const {
    if (handed_over_) {
      CUDA_CHECK(cudaStreamWaitEvent(stream_, read_, 0));
      handed_over_ = false;
    }
    // A held selection is read where the indexer left it, once it is there.
    const DeviceSelection* held = nullptr;
    if (b.held != nullptr) {
      held = dynamic_cast<const DeviceSelection*>(b.held);
      if (held == nullptr || held->queries != b.queries) {
        std::fprintf(stderr,
                     "CUDA attention: a held selection it cannot read (%s, %lld queries for a "
                     "batch of %lld; the model asks ReadsHeld first)\n",
                     held == nullptr ? "not the CUDA indexer's" : "the CUDA indexer's",
                     static_cast<long long>(held == nullptr ? 0 : held->queries),
                     static_cast<long long>(b.queries));
        std::abort();
      }
      CUDA_CHECK(cudaStreamWaitEvent(stream_, held->ready, 0));
    }
    // The pages up to the last one a listed or held compressed row is in.
    int64_t last_row = held != nullptr ? b.held_rows - 1 : -1;
    for (int32_t e : b.entries)
      last_row = std::max<int64_t>(last_row, -static_cast<int64_t>(e) - 1);
    PagedMainKv paged;
    int64_t page_count = 0;
    if (last_row >= 0) {
      paged = MainSections(nullptr, *b.layout, b.layer);
      page_count = last_row / paged.per_page + 1;
    }
    // The query and the pass's own window rows may be the matmul backend's results still
    // landing: read where they are (this stream waits for them), not from the host.
    const DeviceProducts* landing = LandingOn(b.landing);
    // From the host, or device-to-device where it lands.
    auto up = [&](float* d_to, const float* host, size_t floats) {
      if (floats == 0) return;
      if (landing == nullptr || !landing->CopyLanding(host, floats, d_to, stream_)) {
        Copy(d_to, host, floats * sizeof(float));
      }
    };
    const size_t q_floats = static_cast<size_t>(b.queries * b.heads * b.dim);
    const size_t fresh_floats = static_cast<size_t>(b.fresh_rows * b.dim);
    float* d_q = q_.Reserve(q_floats);
    float* d_o = o_.Reserve(q_floats);
    float* d_w = window_.Reserve(b.window.size() + fresh_floats);
    float* d_sink = sink_.Reserve(static_cast<size_t>(b.heads));
    up(d_q, b.q, q_floats);
    Copy(d_w, b.window.data(), b.window.size_bytes());
    up(d_w + b.window.size(), b.fresh, fresh_floats);
    Copy(d_sink, b.sink, b.heads * sizeof(float));
    // The entry lists: the host's as they are, or with each query's selection appended
    // on the device.
    int32_t* d_off = offsets_.Reserve(b.offsets.size());
    int32_t* d_ent = entries_.Reserve(b.entries.size());
    Copy(d_off, b.offsets.data(), b.offsets.size_bytes());
    Copy(d_ent, b.entries.data(), b.entries.size_bytes());
    if (held != nullptr) {
      int32_t* d_all_off = all_offsets_.Reserve(b.offsets.size());
      int32_t* d_all_ent =
          all_entries_.Reserve(b.entries.size() + static_cast<size_t>(b.queries * held->k));
      CUDA_CHECK(LaunchAppendSelection(d_off, d_ent, b.queries, held->positions, held->counts,
                                       held->k, d_all_off, d_all_ent, stream_));
      CUDA_CHECK(cudaEventRecord(held->consumed, stream_));
      d_off = d_all_off;
      d_ent = d_all_ent;
    }
    if (page_count > 0) {
      view = mirror_->Pages(b.sequence, b.pages, b.page_versions, page_count,
                            static_cast<size_t>(paged.page_bytes), stream_);
      paged.pages = view.device;
    }
    CUDA_CHECK(LaunchSparseAttention(d_q, b.queries, b.heads, b.dim, d_w, paged, d_off, d_ent,
                                     d_sink, b.scale, d_o, stream_));
    return d_o;
  }
  // Copies n floats at d back to `out` and waits: through page-locked staging, since a
  // copy into pageable memory would be a second wait.
  void Return(const float* d, size_t n, float* out) const {
    float* h = out_.Reserve(n);
    CUDA_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(out, h, n * sizeof(float));
  }
  void Copy(void* dst, const void* src, size_t bytes) const {
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  mutable std::mutex mu_;  // one call at a time on the stream and the buffers
  cudaStream_t stream_ = nullptr;
  // AttendThenMoe hands the layer's output (y_) to the matmul backend's stream: `projected_`
  // says it is ready, `read_` that it was read; the next call's work waits for that before
  // it may overwrite y_ (with a step into the next layer nothing has waited yet). With mu_.
  cudaEvent_t projected_ = nullptr, read_ = nullptr;
  mutable bool handed_over_ = false;
  const std::shared_ptr<PageMirror> mirror_;
  mutable GrowingDeviceBuffer<float> q_, o_, window_, sink_, turns_, og_, ug_, u_, y_;
  mutable GrowingPinnedBuffer<float> out_;
  mutable GrowingDeviceBuffer<int32_t> offsets_, entries_, all_offsets_, all_entries_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::AttentionBackend>> MakeCudaAttention(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaAttention>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
