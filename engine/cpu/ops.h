// The model's elementwise and small ops on float32 rows, as the reference defines them
// (../shared notes: v41-model-notes.md §3–9). Each is a plain loop with a fixed order of
// operations, so a row's result never depends on other rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvc::cpu {

// y = x · rsqrt(mean(x²) + eps) · w  (in place allowed: y may alias x).
void RmsNorm(const float* x, const float* w, int64_t n, double eps, float* y);

// RoPE frequencies for `rope_dim` dims (rope_dim / 2 of them), with YaRN when
// original_seq_len > 0 (notes §6).
std::vector<double> RopeFrequencies(int64_t rope_dim, double base, int64_t original_seq_len,
                                    double factor, double beta_fast, double beta_slow);
struct RopeTurn {
  float cos = 1.0f, sin = 0.0f;
};
// cos and sin, as floats, of the angle ApplyRope turns a pair by: pos·freq (inverse:
// −pos·freq). One definition, so a device can rotate with the CPU's exact values.
RopeTurn RopeTurnAt(double freq, int64_t pos, bool inverse);
// The table of them for rows at `positions`: [row][i] = (cos, sin) of pair i.
std::vector<float> RopeTurns(std::span<const double> freqs, std::span<const int64_t> positions,
                             bool inverse);
// Rotates the pairs (x[2i], x[2i+1]) of the last rope_dim dims of x by pos·f_i
// (inverse: by −pos·f_i).
void ApplyRope(float* x, int64_t dim, const std::vector<double>& freqs, int64_t pos,
               bool inverse = false);

// Single-pass mHC coefficients from one token's mixes m [(2+hc)·hc] (notes §4).
struct HcCoefficients {
  std::vector<float> pre;   // hc
  std::vector<float> post;  // hc
  std::vector<float> comb;  // hc × hc, comb[j·hc + k]
};
// The mHC math is hyper_connections.h's, shared with the kernels (the same bits).
HcCoefficients HcFromMixes(std::span<const float> m, std::span<const float> base,
                           std::span<const float> scale, int64_t hc, int64_t iters, double eps);
// Σ_j a[j]·X[j] over hc copies of width d.
void HcPre(const float* X, const float* a, int64_t hc, int64_t d, float* out);
// out[k] = post[k]·f + Σ_j comb[j][k]·R[j].
void HcPost(const float* f, const float* R, const HcCoefficients& c, int64_t hc, int64_t d,
            float* out);

// Indices of the k largest values, ties to the lower index, returned in ascending index
// order. Entries equal to -inf are never picked.
std::vector<int32_t> TopKAscending(std::span<const float> scores, int64_t k);

}  // namespace kvc::cpu
