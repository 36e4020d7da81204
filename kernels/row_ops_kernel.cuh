// Device launchers for the engine's per-row ops: RMSNorm, RoPE on the tail dims, the
// ratio-r compressor pooling, the mHC math (the mixes' scale, the coefficients with
// Sinkhorn, the pre- and post-mixing of the hc stream copies), and the reshuffle the
// output projection needs. The CPU twin's operation order (engine/cpu/ops.h,
// engine/model/layer_ops.h), and its bits: RoPE takes the CPU's cos/sin (TurnTails, as
// CUDA's may differ in the last bit), pooling and mHC share their code with the CPU
// (cpu::ExpF; engine/cpu/hyper_connections.h).
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

// cpu::HcScaleMixesRow(x[r], n, mixes[r], mix) for every row: the mixes' scale from the
// stream's rows x (n = hc·d each). One thread per row.
cudaError_t LaunchHcScaleMixes(const float* x, int64_t rows, int64_t n, float* mixes, int64_t mix,
                               cudaStream_t stream);
// out[r] (d) = Σ_j a[r][j]·X[r][j] (cpu::HcPreAt): the sublayer's input from the hc copies
// X (rows × hc × d) and the coefficients a (rows × hc). One thread per value.
cudaError_t LaunchHcPre(const float* X, const float* a, int64_t rows, int64_t hc, int64_t d,
                        float* out, cudaStream_t stream);
// out[r·out_stride + i] = cpu::HcMeanAt(X[r], hc, d, i): the mean of each row's hc copies
// (X rows × hc × d), row r of the result at out + r·out_stride. One thread per value.
cudaError_t LaunchHcMean(const float* X, int64_t rows, int64_t hc, int64_t d, float* out,
                         int64_t out_stride, cudaStream_t stream);
// out[r][k] = post[r][k]·f[r] + Σ_j comb[r][j][k]·R[r][j] (cpu::HcPostAt): the stream after
// a sublayer with output f (rows × d), from the stream before it R (rows × hc × d). One
// thread per value; out must not alias R.
cudaError_t LaunchHcPost(const float* f, const float* R, const float* post, const float* comb,
                         int64_t rows, int64_t hc, int64_t d, float* out, cudaStream_t stream);

// Engram's gating of the stream (cpu::EngramGate, cpu::EngramAdd): copy k of row r of X
// (rows × hc × d) += its gate · V, with KV rows of (hc + 1) × d (the keys per copy, then
// the value) and qw, kw of hc × d. One thread per copy.
cudaError_t LaunchEngramGate(float* X, const float* KV, const float* qw, const float* kw,
                             int64_t rows, int64_t hc, int64_t d, cudaStream_t stream);

// out[i] = cpu::ExpF(x[i]) (engine/cpu/exp.h), for the parity test of the shared exp.
cudaError_t LaunchExpF(const float* x, int64_t n, float* out, cudaStream_t stream);

}  // namespace kvc::cuda
