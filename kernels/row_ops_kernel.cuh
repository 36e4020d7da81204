// Device launchers for the engine's per-row ops: RMSNorm, RoPE on the tail dims, the
// ratio-r compressor pooling and the mHC coefficients (Sinkhorn), and the reshuffle the
// output projection needs. The CPU twin's operation order (engine/cpu/ops.h,
// engine/model/layer_ops.h). RMSNorm, RoPE (TurnTails: the CPU's cos/sin handed in, as
// CUDA's may differ in the last bit), pooling (the shared cpu::ExpF) and the reshuffle are
// bit for bit; the mHC coefficients use CUDA's expf, so their parity is by relative error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// y[r] = x[r] · rsqrt(mean(x[r]²) + eps) · w, rows of n (double accumulation, as the CPU).
cudaError_t LaunchRmsNorm(const float* x, const float* w, int64_t rows, int64_t n, double eps,
                          float* y, cudaStream_t stream);
// RoPE with the host's angles (cpu::RopeTurnAt), so the bits are the CPU's: row r·heads + h
// (of `dim`) has its last 2·half dims turned by turns[r][i] = (cos, sin), pair i. One
// thread per pair.
cudaError_t LaunchTurnTails(float* x, int64_t rows, int64_t heads, int64_t dim, const float* turns,
                            int64_t half, cudaStream_t stream);
// y[b][a][c] = x[a][b][c] for x of outer × middle × inner (e.g. rows × groups × width ↔
// groups × rows × width). One thread per value.
cudaError_t LaunchSwapOuterAxes(const float* x, int64_t outer, int64_t middle, int64_t inner,
                                float* y, cudaStream_t stream);
// out[g] = Σ_t kv[g][t] ⊙ softmax_t(score[g][t]) per channel, groups of `ratio` rows.
cudaError_t LaunchPoolGroups(const float* kv, const float* score, int64_t groups, int64_t ratio,
                             int64_t dim, float* out, cudaStream_t stream);
// Per row of mixes m [(2+hc)·hc]: pre [hc], post [hc], comb [hc·hc] as the CPU computes.
cudaError_t LaunchHcCoefficients(const float* m, const float* base, const float* scale,
                                 int64_t rows, int hc, int iters, float eps, float* pre,
                                 float* post, float* comb, cudaStream_t stream);

// out[i] = cpu::ExpF(x[i]) (engine/cpu/exp.h), for the parity test of the shared exp.
cudaError_t LaunchExpF(const float* x, int64_t n, float* out, cudaStream_t stream);

}  // namespace kvc::cuda
