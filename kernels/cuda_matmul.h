// The engine's matrix products on the GPU (model::MatmulBackend): weights resident in
// device memory from Register on, activations copied up and results copied back per call.
// Each output is the same fma chain as on the CPU (gemm_kernel.cuh), so a model with this
// backend computes the CPU engine's bits — logits, pages, exact resume — only faster
// where the matrices are large.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/gemm.h"
#include "engine/model/matmul.h"

namespace kvc::cuda {

// What another CUDA backend needs to run the engine's products on data already on the
// device: a product with a weight the matmul backend holds, queued on the caller's stream
// (the attention backend runs the output projection so). Both device backends are one,
// each with its bits: MakeCudaMatmul's the CPU's, cuBLAS's its own.
class DeviceProducts {
 public:
  // Whether `w` was registered (its device copy is resident).
  virtual bool Holds(const cpu::PackedMatrix& w) const = 0;
  // Queues y (m × w.out_features()) = x (m × w.in_features()) · Wᵀ on `stream`, x and y in
  // device memory; w must be held.
  virtual void QueueProduct(const float* d_x, int64_t m, const cpu::PackedMatrix& w, float* d_y,
                            cudaStream_t stream) const = 0;
  // Whether MoeSublayerAfter can run `s` over `rows` rows: weights held, a batch the backend
  // routes on the device with the CPU's bits. False for cuBLAS (whose products are not).
  virtual bool RunsMoeSublayer(int64_t rows, const model::MoeSublayer& s) const = 0;
  // The MoE sublayer `s` (model::MoeSublayer) on attention's output d_f (rows × D, device
  // memory), queued after `f_ready` (recorded on the producer's stream); `f_read` is
  // recorded on this backend's stream once d_f has been read: the producer's stream must
  // wait for it before writing d_f again (with s.next this returns before the work ran).
  // Without s.next, its results are copied into s's outputs with one wait, which also
  // covers the producer's work before f_ready. The bits of the host's steps and RoutedMoe.
  virtual void MoeSublayerAfter(const float* d_f, cudaEvent_t f_ready, cudaEvent_t f_read,
                                int64_t rows, const model::MoeSublayer& s) const = 0;
  // When the result landing at host[0, floats) (GemmGroupLater, MoeSublayer::Next) lands
  // there whole: queues its device copy into d_to on this backend's stream, makes `reader`
  // wait for it, and returns true. False, having settled anything that lands in part of
  // those floats, when none does — the host's floats are current then. The copy is this
  // backend's own work: the pending result's memory is free again at its next wait,
  // whichever thread's call that is, so no other stream reads it there. d_to must be free
  // to write once this backend's earlier work and `after` (if not null, an event of the
  // reader's) are done.
  virtual bool CopyLanding(const float* host, size_t floats, float* d_to, cudaStream_t reader,
                           cudaEvent_t after = nullptr) const = 0;
  // Device bytes another stream made that the host needs too (a compressed entry's page
  // bytes and floats): each range lands at `to` with this backend's next wait, as its own
  // pending results do. The copies go after `producer`'s work so far, and what `producer`
  // queues after this call waits for them (it may overwrite the ranges then). `landed`, if
  // set, runs once they are all there (under this backend's lock: it must take none).
  struct HostLanding {
    const void* device;
    size_t bytes;
    void* to;
  };
  virtual void LandOnHost(std::span<const HostLanding> ranges, cudaStream_t producer,
                          std::function<void()> landed = {}) const = 0;

 protected:
  ~DeviceProducts() = default;
};

// Queues model::FinishRows on d_y (rows × width) where it is, one launch, reading the
// finish's norm weight and cos/sin table (cpu::RopeTurns of its rows' positions) from
// device memory at d_norm and d_turns (unread when the finish has none).
void QueueFinish(const model::RowFinish& f, int64_t rows, int64_t width, float* d_y,
                 const float* d_norm, const float* d_turns, cudaStream_t stream);

// A batch's `landing` backend (AttentionBatch::landing, IndexerBatch::landing) as one whose
// landing results a device reader can copy where they are; null when there is none, or —
// having settled it, so that the host's floats are current — when it is not a device one.
const DeviceProducts* LandingOn(const model::MatmulBackend* landing);

// FailedPrecondition without a GPU.
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCudaMatmul();

// The throughput alternative: cuBLAS SGEMM (FP32, the library's default math mode), a
// group's products issued back to back on one stream with one wait. Not batch invariant
// (cuBLAS picks kernels by shape), so logits differ from the CPU's in the last bits and
// the model refuses exact replay with it. FailedPrecondition without a GPU.
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::MatmulBackend>> MakeCublasMatmul();

// One GEMM on device 0 (tests, benchmarks): x is m × w.in_features().
[[nodiscard]] absl::StatusOr<std::vector<float>> GemmOnDevice(std::span<const float> x, int64_t m,
                                                              const cpu::PackedMatrix& w);

}  // namespace kvc::cuda
