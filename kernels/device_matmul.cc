// DeviceMatmul's products: resident weights, groups through page-locked staging.
#include "kernels/device_matmul.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "engine/cpu/ops.h"
#include "kernels/cuda_check.h"
#include "kernels/kv_ops.h"
#include "kernels/row_ops_kernel.cuh"

namespace kvc::cuda {
namespace {

// Where a result's finish reads what it takes on the device, in floats from the start of
// the finishes' staging: the norm's weight, and the CPU's cos/sin per row (a table shared
// by the finishes of one group with the same frequencies, positions and rows — the query
// path's queries, window row and indexer queries).
struct FinishStaging {
  size_t norm = 0, turns = 0;
  bool own_turns = false;  // its table is staged for it (not an earlier finish's)
};

}  // namespace

// Queues model::FinishRows on d_y (rows × width) where it is, one launch, reading its
// staged inputs from d_norm and d_turns.
void QueueFinish(const model::RowFinish& f, int64_t rows, int64_t width, float* d_y,
                 const float* d_norm, const float* d_turns, cudaStream_t stream) {
  const int64_t dim = width / f.heads;
  const int64_t half = f.rope_freqs != nullptr ? static_cast<int64_t>(f.rope_freqs->size()) : 0;
  const KvFormat format = f.round.value_or(KvFormat::kSwaKv);  // unused without rounding
  CUDA_CHECK(LaunchFinishRows(d_y, rows, f.heads, dim, f.norm != nullptr ? d_norm : nullptr, f.eps,
                              f.rope_freqs != nullptr ? d_turns : nullptr, half,
                              f.round.has_value(), RoundedFormatOf(format),
                              static_cast<int>(SpecOf(format).scale_block), MaxScaleCode(format),
                              f.multiplier, stream));
}

DeviceMatmul::DeviceMatmul() {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&landed_));
  CUDA_CHECK(cudaEventCreate(&produced_));
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    total = 0;
  }
  in_flight_limit_ = std::max<size_t>(total / 8, size_t{256} << 20);
  routed_scratch_limit_ = std::max<size_t>(total / 4, size_t{1} << 30);
}

void DeviceMatmul::LimitInFlight(size_t bytes) {
  MutexLock lock(mu_);
  in_flight_limit_ = bytes;
}

void DeviceMatmul::WaitIfPastLimit(size_t bytes) const {
  if (in_flight_ > 0 && in_flight_ + bytes > in_flight_limit_) Synchronize();
  in_flight_ += bytes;
}

DeviceMatmul::~DeviceMatmul() {
  for (auto& [key, p] : weights_) cudaFree(p);
  cudaEventDestroy(produced_);
  cudaEventDestroy(landed_);
  cudaStreamDestroy(stream_);
}

void DeviceMatmul::Register(const cpu::PackedMatrix& w) {
  MutexLock lock(mu_);
  if (w.out_features() == 0 || weights_.contains(w.packed().data())) return;
  std::vector<float> storage;
  const std::span<const float> layout = Layout(w, storage);
  float* d = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), layout.size_bytes()));
  CUDA_CHECK(cudaMemcpy(d, layout.data(), layout.size_bytes(), cudaMemcpyHostToDevice));
  weights_.emplace(w.packed().data(), d);
}

void DeviceMatmul::QueueProduct(const float* d_x, int64_t m, const cpu::PackedMatrix& w, float* d_y,
                                cudaStream_t stream) const {
  MutexLock lock(mu_);
  auto it = weights_.find(w.packed().data());
  KVC_CHECK(it != weights_.end()) << "a device product with a weight the backend does not hold";
  if (m > 0) Launch(d_x, m, w.in_features(), it->second, w.out_features(), d_y, stream);
}

DeviceMatmul::QueuedGroup DeviceMatmul::QueueGroup(std::span<const model::GemmCall> calls) const {
  // An input a pending result lands in part of is read from the host once it has landed
  // (before any set is taken: the wait frees them all).
  for (const model::GemmCall& c : calls) {
    if (c.input_of < 0 && c.m > 0) {
      SettleUnlessResident(c.x, static_cast<size_t>(c.m * c.w->in_features()));
    }
  }
  // Weights not registered (e.g. the indexer's keys) are copied up for this call.
  std::vector<std::vector<float>> storage(calls.size());
  std::vector<std::span<const float>> transient(calls.size());
  size_t xs = 0, ys = 0, ws = 0, fs = 0;
  std::vector<FinishStaging> f_at(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const model::GemmCall& c = calls[i];
    const int64_t k = c.w->in_features();
    xs += static_cast<size_t>(c.m * k);
    model::CheckChain(calls, i);
    if (c.input_of >= 0) xs += static_cast<size_t>(k);  // the norm's weight
    if (c.pool_ratio > 0) xs += static_cast<size_t>(2 * c.m * c.pool_ratio * k);  // pooled rows
    ys += static_cast<size_t>(c.m * c.w->out_features());
    if (const model::RowFinish* f = c.finish; f != nullptr) {
      model::CheckFinish(*f, c.w->out_features());
      f_at[i].norm = fs;
      if (f->norm != nullptr) fs += static_cast<size_t>(c.w->out_features() / f->heads);
      if (f->rope_freqs != nullptr) {
        auto same_turns = [&](const model::GemmCall& o) {
          return o.finish != nullptr && o.finish->rope_freqs == f->rope_freqs &&
                 o.finish->first_position == f->first_position && o.m == c.m;
        };
        size_t j = 0;  // the first finish with the same turns (i itself if none before)
        while (!same_turns(calls[j])) ++j;
        f_at[i].own_turns = j == i;
        f_at[i].turns = j < i ? f_at[j].turns : fs;
        if (j == i) fs += static_cast<size_t>(c.m) * f->rope_freqs->size() * 2;
      }
    }
    if (c.w->out_features() > 0 && !weights_.contains(c.w->packed().data())) {
      transient[i] = Layout(*c.w, storage[i]);
      ws += transient[i].size();
    }
  }
  // The inputs' staging, then the finishes' (from xs on).
  WaitIfPastLimit((xs + fs + ys + ws) * sizeof(float));
  BufferSet& set = TakeSet();
  float* d_x = set.x.Reserve(xs + fs);
  float* d_y = set.y.Reserve(ys);
  float* d_t = set.w.Reserve(ws);
  float* h_x = set.hx.Reserve(xs + fs);
  float* h_y = set.hy.Reserve(ys);
  std::vector<size_t> y_at(calls.size()), x_at(calls.size());
  // What the finishes take goes up first, in one copy (after the inputs' staging).
  for (size_t i = 0; i < calls.size(); ++i) {
    const model::RowFinish* f = calls[i].finish;
    if (f == nullptr) continue;
    if (f->norm != nullptr) {
      const size_t dim = static_cast<size_t>(calls[i].w->out_features() / f->heads);
      std::memcpy(h_x + xs + f_at[i].norm, f->norm, dim * sizeof(float));
    }
    if (f_at[i].own_turns) {
      std::vector<int64_t> positions(static_cast<size_t>(calls[i].m));
      for (int64_t r = 0; r < calls[i].m; ++r) positions[r] = f->first_position + r;
      const std::vector<float> turns = cpu::RopeTurns(*f->rope_freqs, positions, /*inverse=*/false);
      std::memcpy(h_x + xs + f_at[i].turns, turns.data(), turns.size() * sizeof(float));
    }
  }
  if (fs > 0) {
    CUDA_CHECK(
        cudaMemcpyAsync(d_x + xs, h_x + xs, fs * sizeof(float), cudaMemcpyHostToDevice, stream_));
  }
  size_t xo = 0, yo = 0, wo = 0;
  // Call i's product on the device input d_in, its finish after it, where the result is.
  auto product = [&](size_t i, const float* d_in, const float* d_w)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       const model::GemmCall& c = calls[i];
                       const int64_t n = c.w->out_features();
                       Launch(d_in, c.m, c.w->in_features(), d_w, n, d_y + yo, stream_);
                       if (c.finish != nullptr) {
                         QueueFinish(*c.finish, c.m, n, d_y + yo, d_x + xs + f_at[i].norm,
                                     d_x + xs + f_at[i].turns, stream_);
                       }
                       yo += static_cast<size_t>(c.m * n);
                     };
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
      product(i, d_x + x_at[j], d_w);
      continue;
    }
    if (const float* d_src = c.input_of < 0 ? Resident(c.x, x_floats) : nullptr) {
      product(i, d_src, d_w);  // already on the device
      continue;
    }
    x_at[i] = xo;
    if (c.pool_ratio > 0) {
      // [input m × k][norm k][kv rows × k][score rows × k]: the pending rows go up, this
      // group's follow them device-to-device, then pool and normalize where they are.
      const int64_t rows = c.m * c.pool_ratio, fresh = rows - c.pool_pending;
      const size_t pend = static_cast<size_t>(c.pool_pending * k),
                   all = static_cast<size_t>(rows * k);
      float* h_at = h_x + xo + x_floats;
      float* d_norm = d_x + xo + x_floats;
      float* d_kv = d_norm + k;
      float* d_score = d_kv + all;
      std::memcpy(h_at, c.norm_weight, static_cast<size_t>(k) * sizeof(float));
      if (pend > 0) {
        std::memcpy(h_at + k, c.pool_kv, pend * sizeof(float));
        std::memcpy(h_at + k + all, c.pool_score, pend * sizeof(float));
      }
      CUDA_CHECK(cudaMemcpyAsync(d_norm, h_at, (k + 2 * all) * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
      const size_t fresh_bytes = static_cast<size_t>(fresh * k) * sizeof(float);
      CUDA_CHECK(cudaMemcpyAsync(d_kv + pend, d_y + y_at[c.input_of], fresh_bytes,
                                 cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(cudaMemcpyAsync(d_score + pend, d_y + y_at[c.score_of], fresh_bytes,
                                 cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(LaunchPoolGroups(d_kv, d_score, c.m, c.pool_ratio, k, d_x + xo, stream_));
      CUDA_CHECK(LaunchRmsNorm(d_x + xo, d_norm, c.m, k, c.norm_eps, d_x + xo, stream_));
      product(i, d_x + xo, d_w);
      xo += x_floats + static_cast<size_t>(k) + 2 * all;
      continue;
    }
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
    product(i, d_x + xo, d_w);
    xo += x_floats + (c.input_of >= 0 ? static_cast<size_t>(k) : 0);
  }
  // The results lie back to back in d_y: one copy back.
  if (yo > 0) {
    CUDA_CHECK(cudaMemcpyAsync(h_y, d_y, yo * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  // A chained input asked for comes back from where it was normalized, through its
  // (unused) upload staging.
  std::vector<Pending> inputs;
  for (size_t i = 0; i < calls.size(); ++i) {
    const model::GemmCall& c = calls[i];
    const size_t n = static_cast<size_t>(c.m * c.w->in_features());
    if (c.input_out == nullptr || n == 0 || c.w->out_features() == 0) continue;
    const size_t at = x_at[model::SameChainedInput(calls, i)];
    CUDA_CHECK(
        cudaMemcpyAsync(h_x + at, d_x + at, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    inputs.push_back({c.input_out, h_x + at, d_x + at, n});
  }
  return {d_y, h_y, std::move(y_at), std::move(inputs)};
}

void DeviceMatmul::GemmGroup(std::span<const model::GemmCall> calls) const {
  MutexLock lock(mu_);
  const QueuedGroup g = QueueGroup(calls);
  Synchronize();  // one wait, then out to the callers
  for (size_t i = 0; i < calls.size(); ++i) {
    const model::GemmCall& c = calls[i];
    const size_t n = static_cast<size_t>(c.m * c.w->out_features());
    if (n > 0) std::memcpy(c.y, g.h_y + g.y_at[i], n * sizeof(float));
  }
  for (const Pending& p : g.inputs) std::memcpy(p.to, p.staged, p.floats * sizeof(float));
}

void DeviceMatmul::GemmGroupLater(std::span<const model::GemmCall> calls) const {
  MutexLock lock(mu_);
  const QueuedGroup g = QueueGroup(calls);
  for (size_t i = 0; i < calls.size(); ++i) {  // delivered at the next wait, in this order
    const model::GemmCall& c = calls[i];
    const size_t n = static_cast<size_t>(c.m * c.w->out_features());
    if (n > 0) pending_.push_back({c.y, g.h_y + g.y_at[i], g.d_y + g.y_at[i], n});
  }
  pending_.insert(pending_.end(), g.inputs.begin(), g.inputs.end());
}

void DeviceMatmul::Settle() const {
  MutexLock lock(mu_);
  if (!pending_.empty() || !pending_bytes_.empty()) Synchronize();
}

void DeviceMatmul::CopyWhenLanded(const float* from, int64_t count, float* to) const {
  if (count <= 0) return;
  MutexLock lock(mu_);
  const size_t n = static_cast<size_t>(count);
  SettleUnlessResident(from, n);
  if (const Pending* p = Holding(from, n)) {  // lands with it, a second time
    const ptrdiff_t at = from - p->to;
    const Pending also{to, p->staged + at, p->device + at, n};
    pending_.push_back(also);  // (p may move with the push)
    return;
  }
  std::memcpy(to, from, n * sizeof(float));
}

bool DeviceMatmul::CopyLanding(const float* host, size_t floats, float* d_to, cudaStream_t reader,
                               cudaEvent_t after) const {
  MutexLock lock(mu_);
  SettleUnlessResident(host, floats);
  const float* d = Resident(host, floats);
  if (d == nullptr) return false;
  if (after != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream_, after, 0));
  CUDA_CHECK(cudaMemcpyAsync(d_to, d, floats * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(landed_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(reader, landed_, 0));
  return true;
}

void DeviceMatmul::LandOnHost(std::span<const HostLanding> ranges, cudaStream_t producer,
                              std::function<void()> landed) const {
  size_t total = 0;
  for (const HostLanding& r : ranges) total += r.bytes;
  if (total == 0) {
    if (landed) landed();
    return;
  }
  MutexLock lock(mu_);
  WaitIfPastLimit(total);
  if (landed) on_landed_.push_back(std::move(landed));
  CUDA_CHECK(cudaEventRecord(produced_, producer));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, produced_, 0));
  std::byte* staged = TakeSet().landing.Reserve(total);  // free again after the next wait
  for (const HostLanding& r : ranges) {
    if (r.bytes == 0) continue;
    CUDA_CHECK(cudaMemcpyAsync(staged, r.device, r.bytes, cudaMemcpyDeviceToHost, stream_));
    pending_bytes_.push_back({r.to, staged, r.bytes});
    staged += r.bytes;
  }
  CUDA_CHECK(cudaEventRecord(landed_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(producer, landed_, 0));
}

DeviceMatmul::BufferSet& DeviceMatmul::TakeSet() const {
  if (sets_taken_ == sets_.size()) sets_.push_back(std::make_unique<BufferSet>());
  return *sets_[sets_taken_++];
}

void DeviceMatmul::Synchronize() const {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  Deliver();
  sets_taken_ = 0;
  in_flight_ = 0;
}

bool DeviceMatmul::Holds(const cpu::PackedMatrix& w) const {
  MutexLock lock(mu_);
  return weights_.contains(w.packed().data());
}

}  // namespace kvc::cuda
