#include "kernels/cuda_matmul.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/spec/check.h"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/gemm_kernel.cuh"
#include "kernels/kv_dequant.h"
#include "kernels/moe_kernel.cuh"
#include "kernels/row_ops_kernel.cuh"

namespace kvc::cuda {
namespace {

// W (n × k, row-major [out][in]) back out of the CPU's panel layout, for cuBLAS.
std::vector<float> Unpack(const cpu::PackedMatrix& w) {
  const int64_t n = w.out_features(), k = w.in_features(), P = cpu::PackedMatrix::kPanel;
  std::vector<float> out(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float* panel = w.panel(r / P);
    for (int64_t c = 0; c < k; ++c) out[r * k + c] = panel[c * P + r % P];
  }
  return out;
}

void CublasCheck(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS %s failed: status %d\n", what, static_cast<int>(s));
    std::abort();
  }
}

// What both device backends share: weights resident on the device (in the layout the
// product wants), and groups of products run on one stream with inputs and results passing
// through page-locked staging — the copies are truly asynchronous, and a group costs one
// wait however many products it has. A subclass says how a weight is laid out and how one
// product is launched.
class DeviceMatmul : public model::MatmulBackend, public DeviceProducts {
 public:
  DeviceMatmul() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~DeviceMatmul() override {
    for (auto& [key, p] : weights_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }

  void Register(const cpu::PackedMatrix& w) override {
    std::lock_guard lock(mu_);
    if (w.out_features() == 0 || weights_.contains(w.packed().data())) return;
    std::vector<float> storage;
    const std::span<const float> layout = Layout(w, storage);
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), layout.size_bytes()));
    CUDA_CHECK(cudaMemcpy(d, layout.data(), layout.size_bytes(), cudaMemcpyHostToDevice));
    weights_.emplace(w.packed().data(), d);
  }
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    const model::GemmCall call{x, m, &w, y};
    GemmGroup(std::span(&call, 1));
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }
  bool Holds(const cpu::PackedMatrix& w) const override {
    std::lock_guard lock(mu_);
    return weights_.contains(w.packed().data());
  }
  void QueueProduct(const float* d_x, int64_t m, const cpu::PackedMatrix& w, float* d_y,
                    cudaStream_t stream) const override {
    std::lock_guard lock(mu_);
    auto it = weights_.find(w.packed().data());
    KVC_CHECK(it != weights_.end()) << "a device product with a weight the backend does not hold";
    if (m > 0) Launch(d_x, m, w.in_features(), it->second, w.out_features(), d_y, stream);
  }

  // Copies every input up, launches every product, copies all results back at once, then
  // waits once. A chained input is normalized on the device from the earlier result.
  void GemmGroup(std::span<const model::GemmCall> calls) const override {
    std::lock_guard lock(mu_);
    // Weights not registered (e.g. the indexer's keys) are copied up for this call.
    std::vector<std::vector<float>> storage(calls.size());
    std::vector<std::span<const float>> transient(calls.size());
    size_t xs = 0, ys = 0, ws = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const model::GemmCall& c = calls[i];
      const int64_t k = c.w->in_features();
      xs += static_cast<size_t>(c.m * k);
      model::CheckChain(calls, i);
      if (c.input_of >= 0) xs += static_cast<size_t>(k);  // the norm's weight
      ys += static_cast<size_t>(c.m * c.w->out_features());
      if (c.w->out_features() > 0 && !weights_.contains(c.w->packed().data())) {
        transient[i] = Layout(*c.w, storage[i]);
        ws += transient[i].size();
      }
    }
    float* d_x = x_.Reserve(xs);
    float* d_y = y_.Reserve(ys);
    float* d_t = w_.Reserve(ws);
    float* h_x = hx_.Reserve(xs);
    float* h_y = hy_.Reserve(ys);
    std::vector<size_t> y_at(calls.size()), x_at(calls.size());
    size_t xo = 0, yo = 0, wo = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const model::GemmCall& c = calls[i];
      const int64_t k = c.w->in_features(), n = c.w->out_features();
      y_at[i] = yo;
      if (c.m == 0 || n == 0) continue;
      const float* d_w = nullptr;
      if (transient[i].empty()) {
        d_w = weights_.at(c.w->packed().data());
      } else {
        CUDA_CHECK(cudaMemcpyAsync(d_t + wo, transient[i].data(), transient[i].size_bytes(),
                                   cudaMemcpyHostToDevice, stream_));
        d_w = d_t + wo;
        wo += transient[i].size();
      }
      const size_t x_floats = static_cast<size_t>(c.m * k);
      if (const size_t j = model::SameChainedInput(calls, i); j < i) {  // normalized already
        Launch(d_x + x_at[j], c.m, k, d_w, n, d_y + yo, stream_);
        yo += static_cast<size_t>(c.m * n);
        continue;
      }
      x_at[i] = xo;
      if (c.input_of >= 0) {
        float* d_norm = d_x + xo + x_floats;
        std::memcpy(h_x + xo + x_floats, c.norm_weight, static_cast<size_t>(k) * sizeof(float));
        CUDA_CHECK(cudaMemcpyAsync(d_norm, h_x + xo + x_floats,
                                   static_cast<size_t>(k) * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_));
        CUDA_CHECK(
            LaunchRmsNorm(d_y + y_at[c.input_of], d_norm, c.m, k, c.norm_eps, d_x + xo, stream_));
      } else {
        std::memcpy(h_x + xo, c.x, x_floats * sizeof(float));
        CUDA_CHECK(cudaMemcpyAsync(d_x + xo, h_x + xo, x_floats * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
      }
      Launch(d_x + xo, c.m, k, d_w, n, d_y + yo, stream_);
      xo += x_floats + (c.input_of >= 0 ? static_cast<size_t>(k) : 0);
      yo += static_cast<size_t>(c.m * n);
    }
    // The results lie back to back in d_y: one copy, one wait, then out to the callers.
    if (yo > 0) {
      CUDA_CHECK(cudaMemcpyAsync(h_y, d_y, yo * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < calls.size(); ++i) {
      const model::GemmCall& c = calls[i];
      const size_t n = static_cast<size_t>(c.m * c.w->out_features());
      if (n > 0) std::memcpy(c.y, h_y + y_at[i], n * sizeof(float));
    }
  }

  // The experts of a MoE block where their weights are: the input uploaded once with the
  // routing (rows, weights, and per group of jobs each row's outputs in job order), then
  // per group the rows gathered, the gate and up products, SwiGlu, the down products and
  // the sum into the rows — the host's grouping and order (HostExperts), so its bits —
  // and one copy back, one wait.
  void Experts(const float* x, int64_t rows, std::span<const model::ExpertJob> jobs, float limit,
               float* out) const override {
    if (jobs.empty()) return;
    for (const model::ExpertJob& j : jobs) {
      if (!Holds(*j.w1) || !Holds(*j.w3) || !Holds(*j.w2)) {  // weights not resident
        model::HostExperts(*this, x, rows, jobs, limit, out);
        return;
      }
    }
    const int64_t D = jobs.front().w1->in_features(), I = jobs.front().w1->out_features();
    auto count = [&](const model::ExpertJob& j) {
      return j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
    };
    // Groups of jobs as the host makes them; per group its slots (a job's rows back to back).
    struct Group {
      size_t first = 0, last = 0;
      int64_t slots = 0;
      size_t slot_at = 0, add_at = 0;  // offsets of its slots and its row sums in the index
    };
    std::vector<Group> groups;
    int64_t all_slots = 0, most_slots = 0;
    for (size_t first = 0; first < jobs.size();) {
      Group g{first, first};
      do {
        g.slots += count(jobs[g.last]);
        ++g.last;
      } while (g.last < jobs.size() && g.slots < model::kExpertGroupRows);
      all_slots += g.slots;
      most_slots = std::max(most_slots, g.slots);
      groups.push_back(g);
      first = g.last;
    }
    // The index: every slot's row, then per group the row sums (rows + 1 starts, then the
    // slots each row adds, in job order). Floats: the input, then every slot's weight.
    std::vector<int64_t> index;
    index.reserve(static_cast<size_t>(all_slots * 2) + groups.size() * (rows + 1));
    std::vector<float> weights;
    weights.reserve(static_cast<size_t>(all_slots));
    for (const model::ExpertJob& j : jobs) {
      KVC_CHECK(j.rows.size() == j.weights.size() && j.w1->in_features() == D &&
                j.w1->out_features() == I && j.w3->out_features() == I &&
                j.w2->in_features() == I && j.w2->out_features() == D)
          << "an expert job whose shapes or weights do not fit the block";
      for (int64_t m = 0; m < count(j); ++m) {
        index.push_back(j.rows.empty() ? m : j.rows[m]);
        weights.push_back(j.rows.empty() ? 1.0f : j.weights[m]);
      }
    }
    for (Group& g : groups) {
      g.add_at = index.size();
      std::vector<int64_t> per_row(static_cast<size_t>(rows) + 1, 0);
      for (size_t q = g.first; q < g.last; ++q)
        for (int64_t m = 0; m < count(jobs[q]); ++m)
          ++per_row[(jobs[q].rows.empty() ? m : jobs[q].rows[m]) + 1];
      for (int64_t r = 0; r < rows; ++r) per_row[r + 1] += per_row[r];
      index.insert(index.end(), per_row.begin(), per_row.end());
      std::vector<int64_t> slot_of(static_cast<size_t>(g.slots));
      int64_t slot = 0;
      for (size_t q = g.first; q < g.last; ++q) {  // jobs in order: each row's slots in order
        for (int64_t m = 0; m < count(jobs[q]); ++m, ++slot)
          slot_of[per_row[jobs[q].rows.empty() ? m : jobs[q].rows[m]]++] = slot;
      }
      index.insert(index.end(), slot_of.begin(), slot_of.end());
    }
    size_t slot_at = 0;
    for (Group& g : groups) {
      g.slot_at = slot_at;
      slot_at += static_cast<size_t>(g.slots);
    }

    std::lock_guard lock(mu_);
    const size_t in_floats = static_cast<size_t>(rows * D) + weights.size();
    float* h_x = hx_.Reserve(in_floats);
    int64_t* h_index = hindex_.Reserve(index.size());
    std::memcpy(h_x, x, static_cast<size_t>(rows * D) * sizeof(float));
    std::memcpy(h_x + rows * D, weights.data(), weights.size() * sizeof(float));
    std::memcpy(h_index, index.data(), index.size() * sizeof(int64_t));
    float* d_in = x_.Reserve(in_floats);
    int64_t* d_index = index_.Reserve(index.size());
    const size_t per_slot = static_cast<size_t>(2 * D + 2 * I);  // xs, g, up, y
    float* d_act = w_.Reserve(static_cast<size_t>(most_slots) * per_slot);
    float* d_out = y_.Reserve(static_cast<size_t>(rows * D));
    float* h_out = hy_.Reserve(static_cast<size_t>(rows * D));
    CUDA_CHECK(
        cudaMemcpyAsync(d_in, h_x, in_floats * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(d_index, h_index, index.size() * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemsetAsync(d_out, 0, static_cast<size_t>(rows * D) * sizeof(float), stream_));
    const float* d_weights = d_in + rows * D;
    for (const Group& g : groups) {
      float* d_xs = d_act;
      float* d_g = d_xs + g.slots * D;
      float* d_up = d_g + g.slots * I;
      float* d_y = d_up + g.slots * I;
      CUDA_CHECK(LaunchGatherRows(d_in, d_index + g.slot_at, g.slots, D, d_xs, stream_));
      int64_t at = 0;
      for (size_t q = g.first; q < g.last; ++q) {
        const int64_t n = count(jobs[q]);
        Launch(d_xs + at * D, n, D, weights_.at(jobs[q].w1->packed().data()), I, d_g + at * I,
               stream_);
        Launch(d_xs + at * D, n, D, weights_.at(jobs[q].w3->packed().data()), I, d_up + at * I,
               stream_);
        at += n;
      }
      CUDA_CHECK(LaunchSwiGlu(d_g, d_up, d_weights + g.slot_at, g.slots, I, limit, stream_));
      at = 0;
      for (size_t q = g.first; q < g.last; ++q) {
        const int64_t n = count(jobs[q]);
        Launch(d_g + at * I, n, I, weights_.at(jobs[q].w2->packed().data()), D, d_y + at * D,
               stream_);
        at += n;
      }
      CUDA_CHECK(LaunchAddRows(d_out, rows, D, d_y, d_index + g.add_at,
                               d_index + g.add_at + rows + 1, stream_));
    }
    CUDA_CHECK(cudaMemcpyAsync(h_out, d_out, static_cast<size_t>(rows * D) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(out, h_out, static_cast<size_t>(rows * D) * sizeof(float));
  }

 protected:
  // w in the device layout the product reads: a view of w itself or of `storage`.
  virtual std::span<const float> Layout(const cpu::PackedMatrix& w,
                                        std::vector<float>& storage) const = 0;
  // Queues d_y (m × n) = d_x (m × k) · Wᵀ on `stream`. Called with mu_ held.
  virtual void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n,
                      float* d_y, cudaStream_t stream) const = 0;
  cudaStream_t stream_ = nullptr;

 private:
  mutable std::mutex mu_;  // one group at a time on the stream and the scratch buffers
  std::unordered_map<const float*, float*> weights_;  // host panels → device copy
  mutable GrowingDeviceBuffer<float> x_, y_, w_;
  mutable GrowingPinnedBuffer<float> hx_, hy_;
  mutable GrowingDeviceBuffer<int64_t> index_;  // the experts' routing
  mutable GrowingPinnedBuffer<int64_t> hindex_;
};

// Our batch-invariant GEMM kernel over the CPU's panel layout.
class CudaMatmul final : public DeviceMatmul {
 public:
  const char* name() const override { return "cuda"; }

 protected:
  std::span<const float> Layout(const cpu::PackedMatrix& w, std::vector<float>&) const override {
    return w.packed();
  }
  void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n, float* d_y,
              cudaStream_t stream) const override {
    CUDA_CHECK(LaunchGemm(d_x, m, k, d_w, n, d_y, stream));
  }
};

// cuBLAS SGEMM over row-major weights: faster, not batch invariant.
class CublasMatmul final : public DeviceMatmul {
 public:
  CublasMatmul() {
    CublasCheck(cublasCreate(&handle_), "create");
    CublasCheck(cublasSetStream(handle_, stream_), "set stream");
    CUDA_CHECK(cudaEventCreate(&input_ready_));
    CUDA_CHECK(cudaEventCreate(&result_ready_));
  }
  ~CublasMatmul() override {
    cudaEventDestroy(input_ready_);
    cudaEventDestroy(result_ready_);
    cublasDestroy(handle_);
  }
  const char* name() const override { return "cublas"; }
  bool batch_invariant() const override { return false; }

 protected:
  std::span<const float> Layout(const cpu::PackedMatrix& w,
                                std::vector<float>& storage) const override {
    storage = Unpack(w);
    return storage;
  }
  void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n, float* d_y,
              cudaStream_t stream) const override {
    if (k == 0) {
      CUDA_CHECK(cudaMemsetAsync(d_y, 0, static_cast<size_t>(m * n) * sizeof(float), stream));
      return;
    }
    // The handle stays on stream_ (its workspace must not serve two streams at once): a
    // product for another stream runs on stream_ between two event waits, in that stream's
    // order all the same.
    if (stream != stream_) {
      CUDA_CHECK(cudaEventRecord(input_ready_, stream));
      CUDA_CHECK(cudaStreamWaitEvent(stream_, input_ready_, 0));
    }
    // Row-major y (m × n) = x · Wᵀ is column-major yᵀ = W · xᵀ.
    const float one = 1.0f, zero = 0.0f;
    CublasCheck(
        cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                    static_cast<int>(k), &one, d_w, static_cast<int>(k), d_x, static_cast<int>(k),
                    &zero, d_y, static_cast<int>(n)),
        "sgemm");
    if (stream != stream_) {
      CUDA_CHECK(cudaEventRecord(result_ready_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(stream, result_ready_, 0));
    }
  }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t input_ready_ = nullptr, result_ready_ = nullptr;  // used with mu_ held
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCublasMatmul() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CublasMatmul>();
}

absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCudaMatmul() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return std::make_unique<CudaMatmul>();
}

absl::StatusOr<std::vector<float>> GemmOnDevice(std::span<const float> x, int64_t m,
                                                const cpu::PackedMatrix& w) {
  if (m < 0 || static_cast<int64_t>(x.size()) != m * w.in_features()) {
    return absl::InvalidArgumentError(absl::StrCat("gemm of ", m, " rows × ", w.in_features(),
                                                   " inputs: got ", x.size(), " values"));
  }
  absl::StatusOr<std::unique_ptr<model::MatmulBackend>> mm = MakeCudaMatmul();
  if (!mm.ok()) return mm.status();
  std::vector<float> y(static_cast<size_t>(m * w.out_features()));
  (*mm)->Gemm(x.data(), m, w, y.data());
  return y;
}

}  // namespace kvc::cuda
