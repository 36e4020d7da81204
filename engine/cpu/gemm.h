// Batch-invariant matrix multiply: y[m][n] = Σ_k x[m][k] · W[n][k], W in the
// nn.Linear layout [out][in].
//
// Every output element is one fused multiply-add chain over k in increasing order,
// whatever the number of rows in the call, the tile a row falls in, or the thread that
// computes it. So a token's activations do not depend on which other tokens share its
// call — the property exact resume rests on (a resumed sequence recomputes some rows in
// other batch shapes than the cold run). Tuned BLAS libraries do not promise this: their
// kernels and K-blocking change with the matrix shape (docs/model.md has a measurement).
// The AVX2+FMA path and the portable path round identically (both are fmaf chains).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvc::cpu {

// W repacked into panels of 16 output columns: panel p holds, for each k, the 16 weights
// W[16p .. 16p+15][k] (zero past the last row of W).
class PackedMatrix {
 public:
  PackedMatrix() = default;
  // w: rows × cols, row-major ([out][in]).
  PackedMatrix(std::span<const float> w, int64_t rows, int64_t cols);
  int64_t out_features() const { return n_; }
  int64_t in_features() const { return k_; }
  const float* panel(int64_t p) const { return data_.data() + p * k_ * kPanel; }
  int64_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  // Every panel, in order (panels() · in_features() · kPanel floats): what a device copy holds.
  std::span<const float> packed() const { return data_; }
  static constexpr int64_t kPanel = 16;

 private:
  int64_t n_ = 0, k_ = 0;
  std::vector<float> data_;
};

// y (m × out) = x (m × in) · Wᵀ. Uses the default thread pool for large calls.
void Gemm(const float* x, int64_t m, const PackedMatrix& w, float* y);
// The same without threads (for callers already inside a parallel loop).
void GemmSerial(const float* x, int64_t m, const PackedMatrix& w, float* y);
// Whether the AVX2+FMA paths run (the CPU has them and UsePortableKernels is off). Gemm and
// model::AttendHead dispatch on it; both paths round identically (fmaf chains in one order).
bool Avx2FmaInUse();
// Forces the portable paths even where AVX2+FMA exist (tests compare the two).
void UsePortableKernels(bool portable);

}  // namespace kvc::cpu
