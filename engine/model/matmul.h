// MatmulBackend: the seam between the model's control flow and the device that runs its
// matrix products (every projection, the experts, the indexer's q·k, the vocabulary head).
//
// The contract is the CPU GEMM's (engine/cpu/gemm.h): y (m × out) = x (m × in) · Wᵀ with
// every output element ONE fused multiply-add chain over k in increasing order, starting
// from +0. A backend that keeps it computes the same bits as the CPU for any batch shape,
// so the engine stays batch invariant (exact resume) and its logits do not depend on the
// backend. Backends are told which matrices are weights (Register, once, after loading)
// so they can keep them resident; any other matrix is transient (valid for one call).
// Thread-safe: the model calls Gemm from several threads at once.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/cpu/gemm.h"

namespace kvc::model {

class MatmulBackend {
 public:
  virtual ~MatmulBackend() = default;
  virtual const char* name() const = 0;
  // `w` is a weight that stays alive and unchanged as long as the backend is used.
  virtual void Register(const cpu::PackedMatrix& w) = 0;
  // y (m × w.out_features()) = x (m × w.in_features()) · Wᵀ.
  virtual void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const = 0;
  // The same, called from inside one of the CPU thread pool's parallel loops.
  virtual void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w,
                          float* y) const = 0;
};

// The CPU's batch-invariant GEMM (the default backend).
std::unique_ptr<MatmulBackend> MakeCpuMatmul();

}  // namespace kvc::model
