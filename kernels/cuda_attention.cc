#include "kernels/cuda_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/mutex.h"
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
    CUDA_CHECK(cudaEventCreate(&entries_free_));
  }
  ~CudaAttention() override {
    cudaEventDestroy(entries_free_);
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
    MutexLock lock(mu_);
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
    MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    PageMirror::View view;  // held until the sublayer's wait, which covers this stream's work
    const float* d_y = QueueAttendAndProject(b, p, *products, view);
    CUDA_CHECK(cudaEventRecord(projected_, stream_));
    products->MoeSublayerAfter(d_y, projected_, read_, b.queries, then);
    handed_over_ = true;  // the next call's work waits until the output was read
    return true;
  }

  // EmitEntry's steps on this stream: the key's norm and both turns (LaunchFinishRows, the
  // host's arithmetic), FP4 codes and scales into scratch laid out as the pages' sections,
  // then into the mirror's pages and, rounded back, into the floats; the bytes and floats
  // land on the host with the matmul backend's next wait. Entries are grouped by page.
  bool WriteEntries(const model::EntryBatch& b) const override {
    const auto* products = dynamic_cast<const DeviceProducts*>(b.landing);
    if (products == nullptr) return false;  // the host's copies land only with its wait
    if (b.count == 0) return true;
    MutexLock lock(mu_);
    const int64_t n = b.count, hd = b.dim, Id = b.index_dim;
    const ChunkLayout& layout = *b.layout;
    const int64_t per_page = layout.chunk_tokens / b.ratio;
    const int64_t first_page = b.first / per_page, last_page = (b.first + n - 1) / per_page;
    struct Section {
      const ChunkSection* at;
      int64_t bytes;  // per entry
    };
    const Section sections[4] = {
        {&layout.Section(b.layer, SectionKind::kMainCodes), CodesBytes(KvFormat::kMainKv, hd)},
        {&layout.Section(b.layer, SectionKind::kMainScales), ScalesBytes(KvFormat::kMainKv, hd)},
        {&layout.Section(b.layer, SectionKind::kIndexCodes), CodesBytes(KvFormat::kIndexK, Id)},
        {&layout.Section(b.layer, SectionKind::kIndexScales), ScalesBytes(KvFormat::kIndexK, Id)}};
    const int64_t entry_bytes =
        sections[0].bytes + sections[1].bytes + sections[2].bytes + sections[3].bytes;
    // The inputs: where they land, or from the host; the scratch is free once this
    // stream's earlier work is done.
    CUDA_CHECK(cudaEventRecord(entries_free_, stream_));
    float* d_lat = entry_latents_.Reserve(static_cast<size_t>(n * hd));
    float* d_key = entry_keys_.Reserve(static_cast<size_t>(n * Id));
    auto up = [&](float* d_to, const float* host, size_t floats) {
      if (!products->CopyLanding(host, floats, d_to, stream_, entries_free_)) {
        Copy(d_to, host, floats * sizeof(float));
      }
    };
    up(d_lat, b.latents, static_cast<size_t>(n * hd));
    up(d_key, b.keys, static_cast<size_t>(n * Id));
    std::vector<int64_t> positions(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) positions[e] = (b.first + e) * b.ratio;
    const std::vector<float> turns = cpu::RopeTurns(*b.rope_freqs, positions, /*inverse=*/false);
    float* d_turns = entry_turns_.Reserve(turns.size() + static_cast<size_t>(Id));
    float* d_norm = d_turns + turns.size();
    Copy(d_turns, turns.data(), turns.size() * sizeof(float));
    Copy(d_norm, b.key_norm.data(), static_cast<size_t>(Id) * sizeof(float));
    // EmitEntry's finishes: the key normalized and turned, the latent turned.
    model::RowFinish key, latent;
    key.norm = b.key_norm.data();
    key.eps = b.eps;
    key.rope_freqs = latent.rope_freqs = b.rope_freqs;
    QueueFinish(key, n, Id, d_key, d_norm, d_turns, stream_);
    QueueFinish(latent, n, hd, d_lat, nullptr, d_turns, stream_);
    // Per page its entries' four sections back to back in the scratch; the floats after.
    uint8_t* d_bytes = entry_bytes_.Reserve(static_cast<size_t>(n * entry_bytes));
    float* d_main = entry_out_.Reserve(static_cast<size_t>(n * (hd + Id)));
    float* d_index = d_main + n * hd;
    // The pages current on the device first — those the entries go into as they were
    // before the model claimed them: their host bytes may lack what earlier device writes
    // put there (landing), but then the device's copy is current under the old version.
    KVC_CHECK(static_cast<int64_t>(b.claimed_from.size()) == last_page - first_page + 1)
        << "entries in pages " << first_page << ".." << last_page << " with "
        << b.claimed_from.size() << " earlier versions";
    std::vector<uint64_t> before(b.page_versions.begin(), b.page_versions.begin() + last_page + 1);
    std::copy(b.claimed_from.begin(), b.claimed_from.end(), before.begin() + first_page);
    PageMirror::View view = mirror_->Pages(b.sequence, b.pages, before, last_page + 1,
                                           static_cast<size_t>(layout.chunk_bytes), stream_);
    std::vector<DeviceProducts::HostLanding> landings;
    for (int64_t page = first_page; page <= last_page; ++page) {
      const int64_t e0 = std::max(b.first, page * per_page) - b.first;
      const int64_t e1 = std::min(b.first + n, (page + 1) * per_page) - b.first;
      const int64_t local = b.first + e0 - page * per_page, m = e1 - e0;
      uint8_t* run = d_bytes + e0 * entry_bytes;  // this page's sections, m entries each
      uint8_t* at[4];
      for (int s = 0, off = 0; s < 4; off += static_cast<int>(m * sections[s].bytes), ++s)
        at[s] = run + off;
      QueueQuantize(KvFormat::kMainKv, d_lat + e0 * hd, m * hd, at[0], at[1], stream_);
      QueueQuantize(KvFormat::kIndexK, d_key + e0 * Id, m * Id, at[2], at[3], stream_);
      QueueDequantize(KvFormat::kMainKv, at[0], at[1], m * hd, d_main + e0 * hd, stream_);
      QueueDequantize(KvFormat::kIndexK, at[2], at[3], m * Id, d_index + e0 * Id, stream_);
      for (int s = 0; s < 4; ++s) {
        const int64_t offset = sections[s].at->offset + local * sections[s].bytes;
        const size_t bytes = static_cast<size_t>(m * sections[s].bytes);
        CUDA_CHECK(cudaMemcpyAsync(view.device + page * layout.chunk_bytes + offset, at[s], bytes,
                                   cudaMemcpyDeviceToDevice, stream_));
        landings.push_back({at[s], bytes, b.pages[page].data() + offset});
      }
    }
    std::function<void()> landed =
        mirror_->Written(view, b.sequence, first_page,
                         b.page_versions.subspan(first_page, last_page - first_page + 1), stream_);
    view = {};  // (the mirror's lock before the matmul backend's: AttendThenMoe's order too)
    landings.push_back({d_main, static_cast<size_t>(n * hd) * sizeof(float), b.main_out});
    landings.push_back({d_index, static_cast<size_t>(n * Id) * sizeof(float), b.index_out});
    products->LandOnHost(landings, stream_, std::move(landed));
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
    KVC_CHECK(fits) << "CUDA attention: output path of " << G << " groups does not fit " << b.heads
                    << " heads × " << b.dim;
    return held ? products : nullptr;  // null: weights the matmul backend does not hold
  }
  // Attention, the inverse RoPE, the groups' products and wo_b queued on stream_; returns
  // the layer's output on the device (queries × wo_b's outputs). Needs mu_; `view` holds
  // the pages until the caller has waited.
  const float* QueueAttendAndProject(const model::AttentionBatch& b, const model::OutputPath& p,
                                     const DeviceProducts& products, PageMirror::View& view) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    const absl::Status shape = CheckShape(b.heads, b.dim);
    KVC_CHECK(shape.ok()) << shape.message() << " (Model::Load asks before anything runs)";
  }
  // Queues the uploads and the attention kernel; returns the output on the device
  // (queries × heads × dim). `view` holds the pages until the caller has waited. Needs mu_.
  float* QueueAttention(const model::AttentionBatch& b, PageMirror::View& view) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (handed_over_) {
      CUDA_CHECK(cudaStreamWaitEvent(stream_, read_, 0));
      handed_over_ = false;
    }
    // A held selection is read where the indexer left it, once it is there.
    const DeviceSelection* held = nullptr;
    if (b.held != nullptr) {
      held = dynamic_cast<const DeviceSelection*>(b.held);
      KVC_CHECK(held != nullptr && held->queries == b.queries)
          << "CUDA attention: a held selection it cannot read ("
          << (held == nullptr ? "not the CUDA indexer's" : "the CUDA indexer's") << ", "
          << (held == nullptr ? 0 : held->queries) << " queries for a batch of " << b.queries
          << "; the model asks ReadsHeld first)";
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
  void Return(const float* d, size_t n, float* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    float* h = out_.Reserve(n);
    CUDA_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(out, h, n * sizeof(float));
  }
  void Copy(void* dst, const void* src, size_t bytes) const {
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  mutable Mutex mu_;  // one call at a time on the stream and the buffers
  cudaStream_t stream_ = nullptr;
  // AttendThenMoe hands the layer's output (y_) to the matmul backend's stream: `projected_`
  // says it is ready, `read_` that it was read; the next call's work waits for that before
  // it may overwrite y_ (with a step into the next layer nothing has waited yet). With mu_.
  cudaEvent_t projected_ = nullptr, read_ = nullptr;
  cudaEvent_t entries_free_ = nullptr;  // WriteEntries' scratch free to be written again
  mutable bool handed_over_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<PageMirror> mirror_;
  // The scratch buffers: one call's at a time.
  mutable GrowingDeviceBuffer<float> q_ ABSL_GUARDED_BY(mu_), o_ ABSL_GUARDED_BY(mu_),
      window_ ABSL_GUARDED_BY(mu_), sink_ ABSL_GUARDED_BY(mu_), turns_ ABSL_GUARDED_BY(mu_),
      og_ ABSL_GUARDED_BY(mu_), ug_ ABSL_GUARDED_BY(mu_), u_ ABSL_GUARDED_BY(mu_),
      y_ ABSL_GUARDED_BY(mu_);
  mutable GrowingDeviceBuffer<float> entry_latents_ ABSL_GUARDED_BY(mu_),
      entry_keys_ ABSL_GUARDED_BY(mu_), entry_turns_ ABSL_GUARDED_BY(mu_),
      entry_out_ ABSL_GUARDED_BY(mu_);
  mutable GrowingDeviceBuffer<uint8_t> entry_bytes_ ABSL_GUARDED_BY(mu_);
  mutable GrowingPinnedBuffer<float> out_ ABSL_GUARDED_BY(mu_);
  mutable GrowingDeviceBuffer<int32_t> offsets_ ABSL_GUARDED_BY(mu_), entries_ ABSL_GUARDED_BY(mu_),
      all_offsets_ ABSL_GUARDED_BY(mu_), all_entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::AttentionBackend>> MakeCudaAttention(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaAttention>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
