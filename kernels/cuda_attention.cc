#include "kernels/cuda_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops.h"
#include "kernels/kv_ops_kernel.cuh"

namespace kvc::cuda {
namespace {

class CudaAttention final : public model::AttentionBackend {
 public:
  explicit CudaAttention(std::shared_ptr<PageMirror> mirror) : mirror_(std::move(mirror)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaAttention() override { cudaStreamDestroy(stream_); }
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

  void Attend(const model::AttentionBatch& b) const override {
    if (b.queries == 0) return;
    if (absl::Status shape = CheckShape(b.heads, b.dim); !shape.ok()) {  // Model::Load asked
      std::fprintf(stderr, "%s\n", std::string(shape.message()).c_str());
      std::abort();
    }
    std::lock_guard lock(mu_);
    const size_t q_bytes = static_cast<size_t>(b.queries * b.heads * b.dim) * sizeof(float);
    // The pages up to the last one a listed compressed row is in.
    int64_t last_row = -1;
    for (int32_t e : b.entries)
      last_row = std::max<int64_t>(last_row, -static_cast<int64_t>(e) - 1);
    PagedMainKv paged;
    int64_t page_count = 0;
    if (last_row >= 0) {
      paged = MainSections(nullptr, *b.layout, b.layer);
      page_count = last_row / paged.per_page + 1;
    }
    const size_t page_bytes = static_cast<size_t>(paged.page_bytes);
    const size_t q_floats = static_cast<size_t>(b.queries * b.heads * b.dim);
    float* d_q = q_.Reserve(q_floats);
    float* d_o = o_.Reserve(q_floats);
    float* d_w = window_.Reserve(b.window.size());
    float* d_sink = sink_.Reserve(static_cast<size_t>(b.heads));
    int32_t* d_off = offsets_.Reserve(b.offsets.size());
    int32_t* d_ent = entries_.Reserve(b.entries.size());
    Copy(d_q, b.q, q_bytes);
    Copy(d_w, b.window.data(), b.window.size_bytes());
    Copy(d_sink, b.sink, b.heads * sizeof(float));
    Copy(d_off, b.offsets.data(), b.offsets.size_bytes());
    Copy(d_ent, b.entries.data(), b.entries.size_bytes());
    PageMirror::View view;  // held until the kernel is done with the pages
    if (page_count > 0) {
      view = mirror_->Pages(b.sequence, b.pages, b.page_versions, page_count, page_bytes, stream_);
      paged.pages = view.device;
    }
    CUDA_CHECK(LaunchSparseAttention(d_q, b.queries, b.heads, b.dim, d_w, paged, d_off, d_ent,
                                     d_sink, b.scale, d_o, stream_));
    // Back through page-locked staging: a copy into pageable memory would be a second wait.
    float* h_o = out_.Reserve(q_floats);
    CUDA_CHECK(cudaMemcpyAsync(h_o, d_o, q_bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(b.out, h_o, q_bytes);
  }

 private:
  void Copy(void* dst, const void* src, size_t bytes) const {
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  mutable std::mutex mu_;  // one call at a time on the stream and the buffers
  cudaStream_t stream_ = nullptr;
  const std::shared_ptr<PageMirror> mirror_;
  mutable GrowingDeviceBuffer<float> q_, o_, window_, sink_;
  mutable GrowingPinnedBuffer<float> out_;
  mutable GrowingDeviceBuffer<int32_t> offsets_, entries_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::AttentionBackend>> MakeCudaAttention(
    std::shared_ptr<PageMirror> mirror) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaAttention>(mirror ? std::move(mirror) : MakePageMirror());
}

}  // namespace kvc::cuda
