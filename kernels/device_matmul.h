// DeviceMatmul: what both device matmul backends (cuda_matmul.cc: our GEMM, cuBLAS) share
// — weights resident on the device, groups of products on one stream through page-locked
// staging with one wait, and the MoE block on the device (device_moe.cc). Internal to
// kernels/: the engine sees model::MatmulBackend and cuda::DeviceProducts only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "engine/cpu/gemm.h"
#include "engine/model/matmul.h"
#include "kernels/cuda_matmul.h"
#include "kernels/device_buffer.h"

namespace kvc::cuda {

// What both device backends share: weights resident on the device (in the layout the
// product wants), and groups of products run on one stream with inputs and results passing
// through page-locked staging — the copies are truly asynchronous, and a group costs one
// wait however many products it has. A subclass says how a weight is laid out and how one
// product is launched.
class DeviceMatmul : public model::MatmulBackend, public DeviceProducts {
 public:
  DeviceMatmul();
  ~DeviceMatmul() override;

  void Register(const cpu::PackedMatrix& w) override;
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    const model::GemmCall call{x, m, &w, y};
    GemmGroup(std::span(&call, 1));
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Gemm(x, m, w, y);
  }
  bool Holds(const cpu::PackedMatrix& w) const override;
  // The device memory (bytes) a call may find held by results still landing and the
  // buffers they pass through before it waits first, which frees them all: a long pass of
  // groups issued without a wait and MoE sublayers stepping on into the next layer would
  // otherwise hold every layer's buffers until it ends. Default: an eighth of the device's
  // memory (at least 256 MiB).
  void LimitInFlight(size_t bytes);
  void QueueProduct(const float* d_x, int64_t m, const cpu::PackedMatrix& w, float* d_y,
                    cudaStream_t stream) const override;

  // Copies every input up, launches every product, copies all results back at once, then
  // waits once. A chained input is normalized on the device from the earlier result; an
  // input still landing is read where it is.
  void GemmGroup(std::span<const model::GemmCall> calls) const override;
  // The same without the wait: the results are pending (delivered at the next wait).
  void GemmGroupLater(std::span<const model::GemmCall> calls) const override;
  void Settle() const override;
  void CopyWhenLanded(const float* from, int64_t count, float* to) const override;
  bool CopyLanding(const float* host, size_t floats, float* d_to, cudaStream_t reader,
                   cudaEvent_t after = nullptr) const override;
  void LandOnHost(std::span<const HostLanding> ranges, cudaStream_t producer,
                  std::function<void()> landed = {}) const override;

  // The experts of a MoE block where their weights are (device_moe.cc): the input
  // uploaded once with the routing, per group of jobs (HostExperts' groups) the rows
  // gathered, the gate and up products, SwiGlu, the down products and the sum into the
  // rows in job order — the host's bits — and one copy back, one wait.
  void Experts(const float* x, int64_t rows, std::span<const model::ExpertJob> jobs, float limit,
               float* out) const override;
  // Routing on the device too (device_moe.cc), for batches of at most kRoutedMoeRows rows
  // on a backend whose products are the CPU's (RoutesOnDevice): the gate and `also`
  // queued, then the router, the slots, the experts' products (tiles of one expert's slots,
  // its weights read once per tile), SwiGlu and the sum — one wait for the whole block. The
  // bound keeps one call's scratch (slots × (2 I + D) floats) within a device's memory at
  // the reference's shapes (~15 GB at 64K rows), and a quarter of the device's memory
  // bounds it too (smaller cards); longer passes route on the host.
  static constexpr int64_t kRoutedMoeRows = 65536;
  bool RoutedMoe(const float* x, int64_t rows, const model::MoeBlock& moe,
                 std::span<const model::GemmCall> also, float* out) const override;
  // The whole MoE sublayer after attention (device_moe.cc): the mHC post-mixing into the
  // stream, the block's input (pre-mixing, RMSNorm), the next mixes' product and the routed
  // block as RoutedMoe runs it.
  bool RunsMoeSublayer(int64_t rows, const model::MoeSublayer& s) const override;
  void MoeSublayerAfter(const float* d_f, cudaEvent_t f_ready, cudaEvent_t f_read, int64_t rows,
                        const model::MoeSublayer& s) const override;

 protected:
  // Whether Launch computes the CPU's bits on panel-layout weights (the router's
  // per-slot product uses that layout and arithmetic).
  virtual bool RoutesOnDevice() const { return false; }
  // Whether RoutedMoe can run `moe` over `rows` rows here (shapes, weights held).
  bool Routes(int64_t rows, const model::MoeBlock& moe) const;
  // w in the device layout the product reads: a view of w itself or of `storage`.
  virtual std::span<const float> Layout(const cpu::PackedMatrix& w,
                                        std::vector<float>& storage) const = 0;
  // Queues d_y (m × n) = d_x (m × k) · Wᵀ on `stream`. Called with mu_ held.
  virtual void Launch(const float* d_x, int64_t m, int64_t k, const float* d_w, int64_t n,
                      float* d_y, cudaStream_t stream) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  cudaStream_t stream_ = nullptr;

 private:
  // The routed block's regions in a call's buffers (device_moe.cc); with mu_ held, the
  // routing's tables written into the upload, and the block queued on x (device).
  struct RoutingRegions;
  // With mu_ held: the MoE calls' buffers (uploads staged and on the device, results on
  // the device and staged, device-only scratch), at least these sizes; and the results
  // copied back with the call's one wait.
  struct MoeScratch {
    std::byte *h_in, *d_in, *h_res, *d_res, *dev;
  };
  MoeScratch ReserveMoe(size_t in_bytes, size_t res_bytes, size_t dev_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnMoe(std::byte* h_res, const std::byte* d_res, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The buffers one call stages its inputs and results through and computes in. Calls take
  // sets in turn, and every set is free again only after the stream's next wait
  // (Synchronize): a result still in flight — a MoE sublayer's pending results, read on
  // the device by a later group — never has its buffers reused by a later call, whatever
  // that call is. With mu_ held.
  struct BufferSet {
    GrowingDeviceBuffer<float> x, y, w;
    GrowingPinnedBuffer<float> hx, hy;
    GrowingDeviceBuffer<int64_t> index;  // the experts' routing
    GrowingPinnedBuffer<int64_t> hindex;
    // RoutedMoe's: its inputs and results (staged both ways) and what stays on the device.
    GrowingDeviceBuffer<std::byte> moe_in, moe_res, moe_dev;
    GrowingPinnedBuffer<std::byte> moe_in_host, moe_res_host;
    GrowingPinnedBuffer<std::byte> landing;  // another stream's bytes for the host (LandOnHost)
  };
  BufferSet& TakeSet() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With mu_ held: queues the group `calls` on one set — inputs up, products, finishes, the
  // results back into page-locked staging — and says where each call's result lies in the
  // set's device results and their staging (y_at[i], floats from the start).
  struct Pending;
  struct QueuedGroup {
    const float *d_y = nullptr, *h_y = nullptr;
    std::vector<size_t> y_at;
    std::vector<Pending> inputs;  // chained inputs asked for (GemmCall::input_out)
  };
  QueuedGroup QueueGroup(std::span<const model::GemmCall> calls) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the stream; then every result has landed: pending ones are delivered, and
  // every set is free.
  void Synchronize() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::vector<std::unique_ptr<BufferSet>> sets_ ABSL_GUARDED_BY(mu_);
  mutable size_t sets_taken_ ABSL_GUARDED_BY(mu_) = 0;
  void FillRouting(const model::MoeBlock& moe, std::byte* h_in, const RoutingRegions& at) const;
  void QueueRouted(const float* d_x, int64_t rows, const model::MoeBlock& moe, std::byte* d_in,
                   std::byte* d_dev, const RoutingRegions& at, float* d_out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Results returned before they landed — a group's (GemmGroupLater), a MoE sublayer's that
  // went on into the next layer (MoeSublayer::Next), a second place for one of them
  // (CopyWhenLanded): where each goes, its page-locked copy once the stream has run, and
  // its device copy, which later calls read instead of the host's (Resident, CopyLanding).
  // Delivered at the next wait (Synchronize), in the order they were added; a call whose
  // host inputs or results overlap one it cannot read whole waits for them first
  // (SettleFor, SettleUnlessResident). With mu_ held.
  struct Pending {
    float* to;
    const float* staged;
    const float* device;
    size_t floats;
  };
  // Host floats a call reads or writes. If a pending result lands in any of them, the call
  // waits for it first (SettleFor): it would read stale floats, or have its results
  // overwritten by the delivery.
  struct HostFloats {
    const float* at;
    int64_t count;
  };
  void SettleFor(std::span<const HostFloats> ranges) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SettleFor(std::initializer_list<HostFloats> ranges) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SettleFor(std::span(ranges.begin(), ranges.size()));
  }
  void Deliver() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The latest pending result landing in x[0, floats) if it holds all of them; null when
  // none lands there, or the latest covers only part of them.
  const Pending* Holding(const float* x, size_t floats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its device copy of x[0, floats), or null (Holding).
  const float* Resident(const float* x, size_t floats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits first (Synchronize) when a pending result lands in part of x[0, floats) but
  // Resident would not read it there: the host's floats are the current ones then.
  void SettleUnlessResident(const float* x, size_t floats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // With mu_ held, before a call takes `bytes` of buffers and reads anything landing: waits
  // first (Synchronize) when what is in flight would pass the limit with them.
  void WaitIfPastLimit(size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t in_flight_limit_ = 0;
  size_t routed_scratch_limit_ = 0;  // a quarter of the device's memory (Routes)
  mutable size_t in_flight_ ABSL_GUARDED_BY(mu_) =
      0;                 // bytes of the sets taken since the last wait
  struct PendingBytes {  // LandOnHost's: delivered with pending_, never read on the device
    void* to;
    const std::byte* staged;
    size_t bytes;
  };
  mutable std::vector<PendingBytes> pending_bytes_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::function<void()>> on_landed_
      ABSL_GUARDED_BY(mu_);  // run after the deliveries

  cudaEvent_t landed_ = nullptr;    // recorded for a reader of a pending result (CopyLanding)
  cudaEvent_t produced_ = nullptr;  // recorded on a producer's stream (LandOnHost)
  mutable Mutex mu_;                // one group at a time on the stream and the scratch buffers
  std::unordered_map<const float*, float*> weights_;  // host panels → device copy
};

}  // namespace kvc::cuda
