// The MoE block on the device (DeviceMatmul::Experts and RoutedMoe): the experts' products
// on resident weights with SwiGLU and their sum between them, and for small batches the
// router too — the host's arithmetic and order everywhere, so the CPU's bits.
#include <algorithm>
#include <cstring>

#include "engine/spec/check.h"
#include "kernels/cuda_check.h"
#include "kernels/device_matmul.h"
#include "kernels/moe_kernel.cuh"

namespace kvc::cuda {

void DeviceMatmul::Experts(const float* x, int64_t rows, std::span<const model::ExpertJob> jobs,
                           float limit, float* out) const {
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
    model::CheckExpertJob(j, D, I);
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
    CUDA_CHECK(LaunchAddRows(d_out, rows, D, d_y, d_index + g.add_at, d_index + g.add_at + rows + 1,
                             stream_));
  }
  CUDA_CHECK(cudaMemcpyAsync(h_out, d_out, static_cast<size_t>(rows * D) * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out, h_out, static_cast<size_t>(rows * D) * sizeof(float));
}

namespace {

// Typed regions carved one after another out of one scratch allocation (8-byte aligned).
class Carve {
 public:
  template <typename T>
  size_t Take(size_t n) {
    const size_t at = bytes_;
    bytes_ += (n * sizeof(T) + 7) / 8 * 8;
    return at;
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

template <typename T>
T* At(std::byte* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

}  // namespace

bool DeviceMatmul::RoutedMoe(const float* x, int64_t rows, const model::MoeBlock& moe,
                             std::span<const model::GemmCall> also, float* out) const {
  const int64_t E = static_cast<int64_t>(moe.w1.size()) - 1, k = moe.top_k;
  if (!RoutesOnDevice() || rows <= 0 || rows > kRoutedMoeRows || k < 0 || k > kMaxRoutedPerToken ||
      E < 0 || moe.w3.size() != moe.w1.size() || moe.w2.size() != moe.w1.size() ||
      static_cast<int64_t>(moe.gate_bias.size()) != E || moe.gate->out_features() != E ||
      !Holds(*moe.gate)) {
    return false;
  }
  for (int64_t e = 0; e <= E; ++e) {
    if (!Holds(*moe.w1[e]) || !Holds(*moe.w3[e]) || !Holds(*moe.w2[e])) return false;
  }
  for (const model::GemmCall& c : also) {
    if (c.input_of >= 0 || (c.m > 0 && c.w->out_features() > 0 && !Holds(*c.w))) return false;
  }
  const int64_t D = moe.gate->in_features(), I = moe.w1[0]->out_features();
  for (int64_t e = 0; e <= E; ++e) {
    KVC_CHECK(moe.w1[e]->in_features() == D && moe.w1[e]->out_features() == I &&
              moe.w3[e]->in_features() == D && moe.w3[e]->out_features() == I &&
              moe.w2[e]->in_features() == I && moe.w2[e]->out_features() == D)
        << "expert " << e << " of a MoE block has other shapes than the gate's and expert 0's";
  }
  const int64_t S = rows * (k + 1);  // slots at most: k routed per row, and the shared one

  // Host → device in one copy: x, the gate's bias, the inputs of `also`, then the
  // per-expert weight tables (three of E + 1 device pointers).
  Carve in;
  const size_t in_x = in.Take<float>(rows * D), in_bias = in.Take<float>(E);
  std::vector<size_t> in_also(also.size());
  for (size_t i = 0; i < also.size(); ++i)
    in_also[i] = in.Take<float>(also[i].m * also[i].w->in_features());
  const size_t in_tab = in.Take<const float*>(3 * (E + 1));
  // Device → host in one copy: out, then the results of `also`.
  Carve res;
  const size_t res_out = res.Take<float>(rows * D);
  std::vector<size_t> res_also(also.size());
  for (size_t i = 0; i < also.size(); ++i)
    res_also[i] = res.Take<float>(also[i].m * also[i].w->out_features());
  // Device only.
  Carve dev;
  const size_t logits = dev.Take<float>(rows * E), route_w = dev.Take<float>(rows * k),
               picks = dev.Take<int32_t>(rows * k), npicks = dev.Take<int32_t>(rows),
               slot_row = dev.Take<int64_t>(S), slot_expert = dev.Take<int32_t>(S),
               slot_weight = dev.Take<float>(S), pick_slot = dev.Take<int64_t>(rows * k),
               counts = dev.Take<int64_t>(2), g = dev.Take<float>(S * I),
               up = dev.Take<float>(S * I), y = dev.Take<float>(S * D);

  std::lock_guard lock(mu_);
  std::byte* h_in = moe_in_host_.Reserve(in.bytes());
  std::byte* d_in = moe_in_.Reserve(in.bytes());
  std::byte* h_res = moe_res_host_.Reserve(res.bytes());
  std::byte* d_res = moe_res_.Reserve(res.bytes());
  std::byte* d = moe_dev_.Reserve(dev.bytes());
  std::memcpy(At<float>(h_in, in_x), x, static_cast<size_t>(rows * D) * sizeof(float));
  std::memcpy(At<float>(h_in, in_bias), moe.gate_bias.data(), moe.gate_bias.size_bytes());
  for (size_t i = 0; i < also.size(); ++i) {
    const size_t n = static_cast<size_t>(also[i].m * also[i].w->in_features());
    if (n > 0) std::memcpy(At<float>(h_in, in_also[i]), also[i].x, n * sizeof(float));
  }
  const float** tab = At<const float*>(h_in, in_tab);
  for (int64_t e = 0; e <= E; ++e) {
    tab[e] = weights_.at(moe.w1[e]->packed().data());
    tab[E + 1 + e] = weights_.at(moe.w3[e]->packed().data());
    tab[2 * (E + 1) + e] = weights_.at(moe.w2[e]->packed().data());
  }
  CUDA_CHECK(cudaMemcpyAsync(d_in, h_in, in.bytes(), cudaMemcpyHostToDevice, stream_));

  for (size_t i = 0; i < also.size(); ++i) {
    const model::GemmCall& c = also[i];
    if (c.m == 0 || c.w->out_features() == 0) continue;
    Launch(At<float>(d_in, in_also[i]), c.m, c.w->in_features(), weights_.at(c.w->packed().data()),
           c.w->out_features(), At<float>(d_res, res_also[i]), stream_);
  }
  const float* d_x = At<float>(d_in, in_x);
  const float* const* d_tab = At<const float*>(d_in, in_tab);
  const int64_t* d_counts = At<int64_t>(d, counts);
  Launch(d_x, rows, D, weights_.at(moe.gate->packed().data()), E, At<float>(d, logits), stream_);
  CUDA_CHECK(LaunchRoute(At<float>(d, logits), At<float>(d_in, in_bias), rows, E, k, moe.normalize,
                         moe.routed_scale, At<int32_t>(d, picks), At<float>(d, route_w),
                         At<int32_t>(d, npicks), stream_));
  CUDA_CHECK(LaunchDispatch(At<int32_t>(d, picks), At<float>(d, route_w), At<int32_t>(d, npicks),
                            rows, k, E, At<int64_t>(d, slot_row), At<int32_t>(d, slot_expert),
                            At<float>(d, slot_weight), At<int64_t>(d, pick_slot),
                            At<int64_t>(d, counts), stream_));
  CUDA_CHECK(LaunchSlotGemm(d_x, At<int64_t>(d, slot_row), At<int32_t>(d, slot_expert), d_tab,
                            d_counts, S, D, I, At<float>(d, g), stream_));
  CUDA_CHECK(LaunchSlotGemm(d_x, At<int64_t>(d, slot_row), At<int32_t>(d, slot_expert),
                            d_tab + (E + 1), d_counts, S, D, I, At<float>(d, up), stream_));
  CUDA_CHECK(LaunchSwiGlu(At<float>(d, g), At<float>(d, up), At<float>(d, slot_weight), S, I,
                          moe.limit, stream_, d_counts));
  CUDA_CHECK(LaunchSlotGemm(At<float>(d, g), nullptr, At<int32_t>(d, slot_expert),
                            d_tab + 2 * (E + 1), d_counts, S, I, D, At<float>(d, y), stream_));
  CUDA_CHECK(LaunchSumPicks(At<float>(d, y), At<int64_t>(d, pick_slot), At<int32_t>(d, npicks),
                            d_counts, rows, k, D, At<float>(d_res, res_out), stream_));

  CUDA_CHECK(cudaMemcpyAsync(h_res, d_res, res.bytes(), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out, At<float>(h_res, res_out), static_cast<size_t>(rows * D) * sizeof(float));
  for (size_t i = 0; i < also.size(); ++i) {
    const size_t n = static_cast<size_t>(also[i].m * also[i].w->out_features());
    if (n > 0) std::memcpy(also[i].y, At<float>(h_res, res_also[i]), n * sizeof(float));
  }
  return true;
}

}  // namespace kvc::cuda
