// The MoE block on the device (DeviceMatmul::Experts and RoutedMoe): the experts' products
// on resident weights with SwiGLU and their sum between them, and for small batches the
// router too — the host's arithmetic and order everywhere, so the CPU's bits.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cuda_check.h"
#include "kernels/device_matmul.h"
#include "kernels/moe_kernel.cuh"
#include "kernels/row_ops_kernel.cuh"

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

  MutexLock lock(mu_);
  SettleFor({{x, rows * D}, {out, rows * D}});
  WaitIfPastLimit((static_cast<size_t>(rows * D) + weights.size()) * sizeof(float));
  BufferSet& set = TakeSet();
  const size_t in_floats = static_cast<size_t>(rows * D) + weights.size();
  float* h_x = set.hx.Reserve(in_floats);
  int64_t* h_index = set.hindex.Reserve(index.size());
  std::memcpy(h_x, x, static_cast<size_t>(rows * D) * sizeof(float));
  std::memcpy(h_x + rows * D, weights.data(), weights.size() * sizeof(float));
  std::memcpy(h_index, index.data(), index.size() * sizeof(int64_t));
  float* d_in = set.x.Reserve(in_floats);
  int64_t* d_index = set.index.Reserve(index.size());
  const size_t per_slot = static_cast<size_t>(2 * D + 2 * I);  // xs, g, up, y
  float* d_act = set.w.Reserve(static_cast<size_t>(most_slots) * per_slot);
  float* d_out = set.y.Reserve(static_cast<size_t>(rows * D));
  float* h_out = set.hy.Reserve(static_cast<size_t>(rows * D));
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
  Synchronize();
  std::memcpy(out, h_out, static_cast<size_t>(rows * D) * sizeof(float));
}

namespace {

// The routed block's shapes: E routed experts, k picks per row, D → I → D.
struct BlockShape {
  int64_t E = 0, k = 0, D = 0, I = 0;
  explicit BlockShape(const model::MoeBlock& moe)
      : E(static_cast<int64_t>(moe.w1.size()) - 1),
        k(moe.top_k),
        D(moe.gate->in_features()),
        I(moe.w1[0]->out_features()) {}
};

}  // namespace

// What the routed block uploads (the gate's bias, the per-expert weight tables: three of
// E + 1 device pointers) and keeps on the device, carved out of a call's buffers.
struct DeviceMatmul::RoutingRegions {
  size_t bias = 0, tab = 0;  // in the upload
  size_t logits = 0, route_w = 0, picks = 0, npicks = 0, slot_row = 0, slot_expert = 0,
         slot_weight = 0, pick_slot = 0, counts = 0, tiles = 0, g = 0, up = 0,
         y = 0;  // device only
  int64_t max_tiles = 0;
  RoutingRegions(const BlockShape& b, int64_t rows, Carve& in, Carve& dev) {
    const int64_t S = rows * (b.k + 1);  // slots at most: k routed per row, and the shared one
    bias = in.Take<float>(b.E);
    tab = in.Take<const float*>(3 * (b.E + 1));
    logits = dev.Take<float>(rows * b.E);
    route_w = dev.Take<float>(rows * b.k);
    picks = dev.Take<int32_t>(rows * b.k);
    npicks = dev.Take<int32_t>(rows);
    slot_row = dev.Take<int64_t>(S);
    slot_expert = dev.Take<int32_t>(S);
    slot_weight = dev.Take<float>(S);
    pick_slot = dev.Take<int64_t>(rows * b.k);
    counts = dev.Take<int64_t>(3);
    max_tiles = SlotTilesAtMost(rows, b.k, b.E);
    tiles = dev.Take<int64_t>(2 * max_tiles);
    g = dev.Take<float>(S * b.I);
    up = dev.Take<float>(S * b.I);
    y = dev.Take<float>(S * b.D);
  }
};

DeviceMatmul::MoeScratch DeviceMatmul::ReserveMoe(size_t in_bytes, size_t res_bytes,
                                                  size_t dev_bytes) const {
  BufferSet& set = TakeSet();
  return {set.moe_in_host.Reserve(in_bytes), set.moe_in.Reserve(in_bytes),
          set.moe_res_host.Reserve(res_bytes), set.moe_res.Reserve(res_bytes),
          set.moe_dev.Reserve(dev_bytes)};
}

void DeviceMatmul::ReturnMoe(std::byte* h_res, const std::byte* d_res, size_t bytes) const {
  CUDA_CHECK(cudaMemcpyAsync(h_res, d_res, bytes, cudaMemcpyDeviceToHost, stream_));
  Synchronize();
}

bool DeviceMatmul::Routes(int64_t rows, const model::MoeBlock& moe) const {
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
  const BlockShape b(moe);
  // The slot products' grid holds one tile per block row (at most 65535) and no empty
  // product (D, I > 0); the slots' products (gate, up: I wide; down: D) fit the device.
  if (b.D <= 0 || b.I <= 0 || SlotTilesAtMost(rows, k, E) > 65535) return false;
  const double slot_bytes = static_cast<double>(rows * (k + 1)) * (2 * b.I + b.D) * sizeof(float);
  if (slot_bytes > static_cast<double>(routed_scratch_limit_)) return false;
  for (int64_t e = 0; e <= E; ++e) {
    KVC_CHECK(moe.w1[e]->in_features() == b.D && moe.w1[e]->out_features() == b.I &&
              moe.w3[e]->in_features() == b.D && moe.w3[e]->out_features() == b.I &&
              moe.w2[e]->in_features() == b.I && moe.w2[e]->out_features() == b.D)
        << "expert " << e << " of a MoE block has other shapes than the gate's and expert 0's";
  }
  return true;
}

void DeviceMatmul::FillRouting(const model::MoeBlock& moe, std::byte* h_in,
                               const RoutingRegions& at) const {
  const int64_t E = static_cast<int64_t>(moe.w1.size()) - 1;
  std::memcpy(At<float>(h_in, at.bias), moe.gate_bias.data(), moe.gate_bias.size_bytes());
  const float** t = At<const float*>(h_in, at.tab);
  for (int64_t e = 0; e <= E; ++e) {
    t[e] = weights_.at(moe.w1[e]->packed().data());
    t[E + 1 + e] = weights_.at(moe.w3[e]->packed().data());
    t[2 * (E + 1) + e] = weights_.at(moe.w2[e]->packed().data());
  }
}

void DeviceMatmul::QueueRouted(const float* d_x, int64_t rows, const model::MoeBlock& moe,
                               std::byte* d_in, std::byte* d, const RoutingRegions& at,
                               float* d_out) const {
  const BlockShape b(moe);
  const int64_t S = rows * (b.k + 1);
  const float* const* tab = At<const float*>(d_in, at.tab);
  float* logits = At<float>(d, at.logits);
  float* route_w = At<float>(d, at.route_w);
  int32_t* picks = At<int32_t>(d, at.picks);
  int32_t* npicks = At<int32_t>(d, at.npicks);
  int64_t* slot_row = At<int64_t>(d, at.slot_row);
  int32_t* slot_expert = At<int32_t>(d, at.slot_expert);
  float* slot_weight = At<float>(d, at.slot_weight);
  int64_t* pick_slot = At<int64_t>(d, at.pick_slot);
  int64_t* counts = At<int64_t>(d, at.counts);
  int64_t* tiles = At<int64_t>(d, at.tiles);
  float* g = At<float>(d, at.g);
  float* up = At<float>(d, at.up);
  float* y = At<float>(d, at.y);
  Launch(d_x, rows, b.D, weights_.at(moe.gate->packed().data()), b.E, logits, stream_);
  CUDA_CHECK(LaunchRoute(logits, At<float>(d_in, at.bias), rows, b.E, b.k, moe.normalize,
                         moe.routed_scale, picks, route_w, npicks, stream_));
  CUDA_CHECK(LaunchDispatch(picks, route_w, npicks, rows, b.k, b.E, slot_row, slot_expert,
                            slot_weight, pick_slot, counts, tiles, stream_));
  const int64_t T = at.max_tiles;
  CUDA_CHECK(
      LaunchSlotGemm(d_x, slot_row, slot_expert, tab, tiles, counts, T, b.D, b.I, g, stream_));
  CUDA_CHECK(LaunchSlotGemm(d_x, slot_row, slot_expert, tab + (b.E + 1), tiles, counts, T, b.D, b.I,
                            up, stream_));
  CUDA_CHECK(LaunchSwiGlu(g, up, slot_weight, S, b.I, moe.limit, stream_, counts));
  CUDA_CHECK(LaunchSlotGemm(g, nullptr, slot_expert, tab + 2 * (b.E + 1), tiles, counts, T, b.I,
                            b.D, y, stream_));
  CUDA_CHECK(LaunchSumPicks(y, pick_slot, npicks, counts, rows, b.k, b.D, d_out, stream_));
}

bool DeviceMatmul::RoutedMoe(const float* x, int64_t rows, const model::MoeBlock& moe,
                             std::span<const model::GemmCall> also, float* out) const {
  if (!Routes(rows, moe)) return false;
  for (const model::GemmCall& c : also) {
    if (c.input_of >= 0 || c.finish != nullptr ||
        (c.m > 0 && c.w->out_features() > 0 && !Holds(*c.w)))
      return false;
  }
  const BlockShape b(moe);
  // Host → device in one copy: x, the inputs of `also`, the routing's tables. Device →
  // host in one copy: out, then the results of `also`.
  Carve in, res, dev;
  const size_t in_x = in.Take<float>(rows * b.D);
  std::vector<size_t> in_also(also.size()), res_also(also.size());
  for (size_t i = 0; i < also.size(); ++i)
    in_also[i] = in.Take<float>(also[i].m * also[i].w->in_features());
  const size_t res_out = res.Take<float>(rows * b.D);
  for (size_t i = 0; i < also.size(); ++i)
    res_also[i] = res.Take<float>(also[i].m * also[i].w->out_features());
  const RoutingRegions routing(b, rows, in, dev);

  MutexLock lock(mu_);
  WaitIfPastLimit(in.bytes() + res.bytes() + dev.bytes());
  std::vector<HostFloats> touched = {{x, rows * b.D}, {out, rows * b.D}};
  for (const model::GemmCall& c : also) {
    touched.push_back({c.x, c.m * c.w->in_features()});
    touched.push_back({c.y, c.m * c.w->out_features()});
  }
  SettleFor(touched);
  // (Named copies, not a structured binding: lambdas below capture them.)
  const MoeScratch scratch = ReserveMoe(in.bytes(), res.bytes(), dev.bytes());
  std::byte *const h_in = scratch.h_in, *const d_in = scratch.d_in, *const h_res = scratch.h_res,
                   *const d_res = scratch.d_res, *const d = scratch.dev;
  std::memcpy(At<float>(h_in, in_x), x, static_cast<size_t>(rows * b.D) * sizeof(float));
  for (size_t i = 0; i < also.size(); ++i) {
    const size_t n = static_cast<size_t>(also[i].m * also[i].w->in_features());
    if (n > 0) std::memcpy(At<float>(h_in, in_also[i]), also[i].x, n * sizeof(float));
  }
  FillRouting(moe, h_in, routing);
  CUDA_CHECK(cudaMemcpyAsync(d_in, h_in, in.bytes(), cudaMemcpyHostToDevice, stream_));
  for (size_t i = 0; i < also.size(); ++i) {
    const model::GemmCall& c = also[i];
    if (c.m == 0 || c.w->out_features() == 0) continue;
    Launch(At<float>(d_in, in_also[i]), c.m, c.w->in_features(), weights_.at(c.w->packed().data()),
           c.w->out_features(), At<float>(d_res, res_also[i]), stream_);
  }
  QueueRouted(At<float>(d_in, in_x), rows, moe, d_in, d, routing, At<float>(d_res, res_out));
  ReturnMoe(h_res, d_res, res.bytes());
  std::memcpy(out, At<float>(h_res, res_out), static_cast<size_t>(rows * b.D) * sizeof(float));
  for (size_t i = 0; i < also.size(); ++i) {
    const size_t n = static_cast<size_t>(also[i].m * also[i].w->out_features());
    if (n > 0) std::memcpy(also[i].y, At<float>(h_res, res_also[i]), n * sizeof(float));
  }
  return true;
}

bool DeviceMatmul::RunsMoeSublayer(int64_t rows, const model::MoeSublayer& s) const {
  if (s.hc <= 0 || s.mixes_fn == nullptr || !Routes(rows, s.moe) || !Holds(*s.mixes_fn)) {
    return false;
  }
  const int64_t D = s.moe.gate->in_features();
  KVC_CHECK(static_cast<int64_t>(s.norm.size()) == D && s.mixes_fn->in_features() == s.hc * D &&
            s.mixes_fn->out_features() == (2 + s.hc) * s.hc)
      << "a MoE sublayer of hc " << s.hc << " whose norm (" << s.norm.size() << ") or mixes ("
      << s.mixes_fn->in_features() << " → " << s.mixes_fn->out_features()
      << ") do not fit the block's width " << D;
  return true;
}

void DeviceMatmul::MoeSublayerAfter(const float* d_f, cudaEvent_t f_ready, cudaEvent_t f_read,
                                    int64_t rows, const model::MoeSublayer& s) const {
  KVC_CHECK(RunsMoeSublayer(rows, s)) << "a MoE sublayer this backend cannot run";
  const BlockShape b(s.moe);
  const model::MoeSublayer::Next* next = s.next;
  const int64_t hc = s.hc, n = hc * b.D, mix = s.mixes_fn->out_features();
  if (next != nullptr) {
    KVC_CHECK(static_cast<int64_t>(next->base.size()) == mix && next->scale.size() == 3 &&
              static_cast<int64_t>(next->norm.size()) == b.D)
        << "a MoE sublayer's step into the next layer with coefficients of " << next->base.size()
        << " + " << next->scale.size() << " values or a norm of " << next->norm.size();
    KVC_CHECK(next->engram_kv == nullptr || (static_cast<int64_t>(next->engram_qw.size()) == n &&
                                             static_cast<int64_t>(next->engram_kw.size()) == n))
        << "a MoE sublayer's step into an Engram layer with qw, kw of " << next->engram_qw.size()
        << ", " << next->engram_kw.size() << " values, not hc × D = " << n;
  }
  const model::MoeSublayer::Coefficients* coef = s.coefficients;
  if (coef != nullptr) {
    KVC_CHECK(coef->mixes != nullptr && static_cast<int64_t>(coef->base.size()) == mix &&
              coef->scale.size() == 3)
        << "a MoE sublayer's coefficients from mixes with " << coef->base.size() << " + "
        << coef->scale.size() << " values (or no mixes)";
  }
  // The sublayer's own results come back, or with `next` stay on the device and the next
  // layer's input comes back instead.
  Carve in, res, dev;
  Carve& own = next != nullptr ? dev : res;
  const int64_t host_coef = coef == nullptr ? rows : 0;  // rows of coefficients from the host
  const size_t in_R = in.Take<float>(rows * n), in_post = in.Take<float>(host_coef * hc),
               in_comb = in.Take<float>(host_coef * hc * hc),
               in_pre = in.Take<float>(host_coef * hc), in_norm = in.Take<float>(b.D);
  const int64_t dev_coef = rows - host_coef;  // rows of coefficients made here
  const size_t in_mixes = in.Take<float>(dev_coef * mix),
               in_cbase = in.Take<float>(dev_coef ? mix : 0),
               in_cscale = in.Take<float>(dev_coef ? 3 : 0);
  const size_t c_mixes = dev.Take<float>(dev_coef * mix), c_pre = dev.Take<float>(dev_coef * hc),
               c_post = dev.Take<float>(dev_coef * hc),
               c_comb = dev.Take<float>(dev_coef * hc * hc);
  const size_t own_stream = own.Take<float>(rows * n), own_mixes = own.Take<float>(rows * mix),
               own_out = own.Take<float>(rows * b.D);
  const size_t x_in = dev.Take<float>(rows * b.D);
  size_t in_base = 0, in_scale = 0, in_next_norm = 0, next_stream = 0, next_pre = 0, next_input = 0,
         next_mean = 0, post = 0, comb = 0, in_engram = 0, in_qw = 0, in_kw = 0;
  const bool engram = next != nullptr && next->engram_kv != nullptr;
  if (engram) {
    in_engram = in.Take<float>(rows * (n + b.D));
    in_qw = in.Take<float>(n);
    in_kw = in.Take<float>(n);
  }
  if (next != nullptr) {
    in_base = in.Take<float>(mix);
    in_scale = in.Take<float>(3);
    in_next_norm = in.Take<float>(b.D);
    next_stream = res.Take<float>(rows * n);
    next_pre = res.Take<float>(rows * hc);
    next_input = res.Take<float>(rows * b.D);
    next_mean = res.Take<float>(next->mean != nullptr ? rows * b.D : 0);
    post = dev.Take<float>(rows * hc);
    comb = dev.Take<float>(rows * hc * hc);
  }
  const RoutingRegions routing(b, rows, in, dev);

  MutexLock lock(mu_);
  WaitIfPastLimit(in.bytes() + res.bytes() + dev.bytes());
  // R, the mixes and the next layer's Engram products may still be landing: read where
  // they are. Anything else the call
  // reads from the host has landed first; so have the results it copies out at its wait
  // (with `next`, its pending results land after those pending now, in order).
  SettleUnlessResident(s.R, static_cast<size_t>(rows * n));
  if (coef != nullptr) {
    SettleUnlessResident(coef->mixes, static_cast<size_t>(rows * mix));
  } else {
    SettleFor({{s.post, rows * hc}, {s.comb, rows * hc * hc}, {s.pre, rows * hc}});
  }
  if (next == nullptr) {
    SettleFor({{s.stream, rows * n}, {s.mixes, rows * mix}, {s.out, rows * b.D}});
  } else if (engram) {
    SettleUnlessResident(next->engram_kv, static_cast<size_t>(rows * (n + b.D)));
  }
  const float* d_R = Resident(s.R, static_cast<size_t>(rows * n));
  const float* d_engram =
      engram ? Resident(next->engram_kv, static_cast<size_t>(rows * (n + b.D))) : nullptr;
  const float* d_mixes =
      coef != nullptr ? Resident(coef->mixes, static_cast<size_t>(rows * mix)) : nullptr;
  // (Named copies, not a structured binding: lambdas below capture them.)
  const MoeScratch scratch = ReserveMoe(in.bytes(), res.bytes(), dev.bytes());
  std::byte *const h_in = scratch.h_in, *const d_in = scratch.d_in, *const h_res = scratch.h_res,
                   *const d_res = scratch.d_res, *const d = scratch.dev;
  std::byte* d_own = next != nullptr ? d : d_res;
  auto put = [&](size_t at, const float* from, int64_t count) {
    std::memcpy(At<float>(h_in, at), from, static_cast<size_t>(count) * sizeof(float));
  };
  if (d_R == nullptr) put(in_R, s.R, rows * n);
  if (coef == nullptr) {
    put(in_post, s.post, rows * hc);
    put(in_comb, s.comb, rows * hc * hc);
    put(in_pre, s.pre, rows * hc);
  } else {
    if (d_mixes == nullptr) put(in_mixes, coef->mixes, rows * mix);
    put(in_cbase, coef->base.data(), mix);
    put(in_cscale, coef->scale.data(), 3);
  }
  put(in_norm, s.norm.data(), b.D);
  if (next != nullptr) {
    put(in_base, next->base.data(), mix);
    put(in_scale, next->scale.data(), 3);
    put(in_next_norm, next->norm.data(), b.D);
  }
  if (engram) {
    if (d_engram == nullptr) put(in_engram, next->engram_kv, rows * (n + b.D));
    put(in_qw, next->engram_qw.data(), n);
    put(in_kw, next->engram_kw.data(), n);
  }
  FillRouting(s.moe, h_in, routing);
  CUDA_CHECK(cudaMemcpyAsync(d_in, h_in, in.bytes(), cudaMemcpyHostToDevice, stream_));
  const float* R = d_R != nullptr ? d_R : At<float>(d_in, in_R);
  const float* pre1 = At<float>(d_in, in_pre);
  const float* post1 = At<float>(d_in, in_post);
  const float* comb1 = At<float>(d_in, in_comb);
  if (coef != nullptr) {  // the host's coefficients(w, 0), on a copy of the mixes
    float* m = At<float>(d, c_mixes);
    CUDA_CHECK(cudaMemcpyAsync(m, d_mixes != nullptr ? d_mixes : At<float>(d_in, in_mixes),
                               static_cast<size_t>(rows * mix) * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(LaunchHcScaleMixes(R, rows, n, m, mix, stream_));
    CUDA_CHECK(LaunchHcCoefficients(m, At<float>(d_in, in_cbase), At<float>(d_in, in_cscale), rows,
                                    static_cast<int>(hc), static_cast<int>(coef->iters),
                                    static_cast<float>(coef->hc_eps), At<float>(d, c_pre),
                                    At<float>(d, c_post), At<float>(d, c_comb), stream_));
    pre1 = At<float>(d, c_pre);
    post1 = At<float>(d, c_post);
    comb1 = At<float>(d, c_comb);
  }
  CUDA_CHECK(cudaStreamWaitEvent(stream_, f_ready, 0));
  float* X = At<float>(d_own, own_stream);
  float* mixes = At<float>(d_own, own_mixes);
  float* out = At<float>(d_own, own_out);
  float* xin = At<float>(d, x_in);
  CUDA_CHECK(LaunchHcPost(d_f, R, post1, comb1, rows, hc, b.D, X, stream_));
  CUDA_CHECK(cudaEventRecord(f_read, stream_));  // d_f is free for its producer again
  CUDA_CHECK(LaunchHcPre(X, pre1, rows, hc, b.D, xin, stream_));
  CUDA_CHECK(LaunchRmsNorm(xin, At<float>(d_in, in_norm), rows, b.D, s.eps, xin, stream_));
  Launch(X, rows, n, weights_.at(s.mixes_fn->packed().data()), mix, mixes, stream_);
  QueueRouted(xin, rows, s.moe, d_in, d, routing, out);
  if (next == nullptr) {
    ReturnMoe(h_res, d_res, res.bytes());
    auto get = [&](float* to, size_t at, int64_t count) {
      std::memcpy(to, At<float>(h_res, at), static_cast<size_t>(count) * sizeof(float));
    };
    get(s.stream, own_stream, rows * n);
    get(s.mixes, own_mixes, rows * mix);
    get(s.out, own_out, rows * b.D);
    return;
  }
  // Into the next layer: this sublayer's coefficients, the stream after it, the next
  // layer's attention input — as the host's layer loop computes them.
  float* X2 = At<float>(d_res, next_stream);
  float* pre2 = At<float>(d_res, next_pre);
  float* input = At<float>(d_res, next_input);
  CUDA_CHECK(LaunchHcScaleMixes(X, rows, n, mixes, mix, stream_));
  CUDA_CHECK(LaunchHcCoefficients(mixes, At<float>(d_in, in_base), At<float>(d_in, in_scale), rows,
                                  static_cast<int>(hc), static_cast<int>(next->iters),
                                  static_cast<float>(next->hc_eps), pre2, At<float>(d, post),
                                  At<float>(d, comb), stream_));
  CUDA_CHECK(
      LaunchHcPost(out, X, At<float>(d, post), At<float>(d, comb), rows, hc, b.D, X2, stream_));
  if (engram) {  // the next layer's Engram, gated in before its input is taken
    CUDA_CHECK(LaunchEngramGate(X2, d_engram != nullptr ? d_engram : At<float>(d_in, in_engram),
                                At<float>(d_in, in_qw), At<float>(d_in, in_kw), rows, hc, b.D,
                                stream_));
  }
  if (next->mean != nullptr) {  // of X'' as the next layer takes it (its Engram gated in)
    CUDA_CHECK(LaunchHcMean(X2, rows, hc, b.D, At<float>(d_res, next_mean), b.D, stream_));
  }
  CUDA_CHECK(LaunchHcPre(X2, pre2, rows, hc, b.D, input, stream_));
  CUDA_CHECK(LaunchRmsNorm(input, At<float>(d_in, in_next_norm), rows, b.D, s.eps, input, stream_));
  // No wait here: the results land with the next group's (GemmGroup), whose products may
  // read them where they are.
  CUDA_CHECK(cudaMemcpyAsync(h_res, d_res, res.bytes(), cudaMemcpyDeviceToHost, stream_));
  auto pend = [&](float* to, size_t at, int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pending_.push_back(
        {to, At<float>(h_res, at), At<float>(d_res, at), static_cast<size_t>(count)});
  };
  pend(next->stream, next_stream, rows * n);
  pend(next->pre, next_pre, rows * hc);
  pend(next->input, next_input, rows * b.D);
  for (int64_t r = 0; next->mean != nullptr && r < rows; ++r) {
    pend(next->mean + r * next->mean_stride,
         next_mean + static_cast<size_t>(r * b.D) * sizeof(float), b.D);
  }
}

void DeviceMatmul::SettleFor(std::span<const HostFloats> ranges) const {
  for (const Pending& p : pending_) {
    for (const HostFloats& r : ranges) {
      if (r.count > 0 && r.at < p.to + p.floats && p.to < r.at + r.count) {
        Synchronize();
        return;
      }
    }
  }
}

void DeviceMatmul::Deliver() const {
  for (const Pending& p : pending_) std::memcpy(p.to, p.staged, p.floats * sizeof(float));
  pending_.clear();
  for (const PendingBytes& p : pending_bytes_) std::memcpy(p.to, p.staged, p.bytes);
  pending_bytes_.clear();
  for (const std::function<void()>& landed : on_landed_) landed();
  on_landed_.clear();
}

const DeviceMatmul::Pending* DeviceMatmul::Holding(const float* x, size_t floats) const {
  for (auto p = pending_.rbegin(); p != pending_.rend(); ++p) {  // the latest lands last
    if (x < p->to + p->floats && p->to < x + floats) {
      return x >= p->to && x + floats <= p->to + p->floats ? &*p : nullptr;
    }
  }
  return nullptr;
}

const float* DeviceMatmul::Resident(const float* x, size_t floats) const {
  const Pending* p = Holding(x, floats);
  return p != nullptr ? p->device + (x - p->to) : nullptr;
}

void DeviceMatmul::SettleUnlessResident(const float* x, size_t floats) const {
  if (floats > 0 && Resident(x, floats) == nullptr) {
    SettleFor({{x, static_cast<int64_t>(floats)}});
  }
}

}  // namespace kvc::cuda
