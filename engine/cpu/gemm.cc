#include "engine/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "base/check.h"
#include "engine/cpu/thread_pool.h"

namespace kvc::cpu {
namespace {

constexpr int64_t kP = PackedMatrix::kPanel;
constexpr int64_t kRows = 4;  // rows per register tile

// Portable: one fmaf chain per element (the same rounding as the FMA instructions).
void PanelPortable(const float* x, int64_t ldx, int64_t rows, const float* panel, int64_t k,
                   float* y, int64_t ldy, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[kP] = {};
    const float* xr = x + r * ldx;
    for (int64_t i = 0; i < k; ++i) {
      const float xv = xr[i];
      const float* w = panel + i * kP;
      for (int64_t c = 0; c < kP; ++c) acc[c] = std::fmaf(xv, w[c], acc[c]);
    }
    std::copy(acc, acc + cols, y + r * ldy);
  }
}

__attribute__((target("avx2,fma"))) void PanelAvx2(const float* x, int64_t ldx, int64_t rows,
                                                   const float* panel, int64_t k, float* y,
                                                   int64_t ldy, int64_t cols) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    const float* x0 = x + r * ldx;
    const float* x1 = x0 + ldx;
    const float* x2 = x1 + ldx;
    const float* x3 = x2 + ldx;
    for (int64_t i = 0; i < k; ++i) {
      const __m256 w0 = _mm256_loadu_ps(panel + i * kP);
      const __m256 w1 = _mm256_loadu_ps(panel + i * kP + 8);
      __m256 v = _mm256_broadcast_ss(x0 + i);
      a0 = _mm256_fmadd_ps(v, w0, a0);
      a1 = _mm256_fmadd_ps(v, w1, a1);
      v = _mm256_broadcast_ss(x1 + i);
      b0 = _mm256_fmadd_ps(v, w0, b0);
      b1 = _mm256_fmadd_ps(v, w1, b1);
      v = _mm256_broadcast_ss(x2 + i);
      c0 = _mm256_fmadd_ps(v, w0, c0);
      c1 = _mm256_fmadd_ps(v, w1, c1);
      v = _mm256_broadcast_ss(x3 + i);
      d0 = _mm256_fmadd_ps(v, w0, d0);
      d1 = _mm256_fmadd_ps(v, w1, d1);
    }
    alignas(32) float out[kRows][kP];
    _mm256_store_ps(out[0], a0);
    _mm256_store_ps(out[0] + 8, a1);
    _mm256_store_ps(out[1], b0);
    _mm256_store_ps(out[1] + 8, b1);
    _mm256_store_ps(out[2], c0);
    _mm256_store_ps(out[2] + 8, c1);
    _mm256_store_ps(out[3], d0);
    _mm256_store_ps(out[3] + 8, d1);
    for (int64_t j = 0; j < kRows; ++j) std::copy(out[j], out[j] + cols, y + (r + j) * ldy);
  }
  for (; r < rows; ++r) {  // the same chain, one row at a time
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const float* x0 = x + r * ldx;
    for (int64_t i = 0; i < k; ++i) {
      const __m256 v = _mm256_broadcast_ss(x0 + i);
      a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(panel + i * kP), a0);
      a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(panel + i * kP + 8), a1);
    }
    alignas(32) float out[kP];
    _mm256_store_ps(out, a0);
    _mm256_store_ps(out + 8, a1);
    std::copy(out, out + cols, y + r * ldy);
  }
}

std::atomic<bool> g_force_portable{false};

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have && !g_force_portable.load(std::memory_order_relaxed);
}

// Rows [r0, r1) × panels [p0, p1).
void Block(const float* x, int64_t r0, int64_t r1, const PackedMatrix& w, int64_t p0, int64_t p1,
           float* y) {
  const int64_t k = w.in_features(), n = w.out_features();
  // Rows in groups that keep a panel in L1 across them.
  constexpr int64_t kRowBlock = 64;
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, r1 - rb);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cols = std::min(kP, n - p * kP);
      float* yp = y + rb * n + p * kP;
      if (HaveAvx2()) {
        PanelAvx2(x + rb * k, k, rows, w.panel(p), k, yp, n, cols);
      } else {
        PanelPortable(x + rb * k, k, rows, w.panel(p), k, yp, n, cols);
      }
    }
  }
}

}  // namespace

PackedMatrix::PackedMatrix(std::span<const float> w, int64_t rows, int64_t cols)
    : n_(rows), k_(cols) {
  KVC_CHECK(static_cast<int64_t>(w.size()) == rows * cols);
  data_.assign(panels() * k_ * kP, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* panel = data_.data() + (r / kP) * k_ * kP;
    for (int64_t c = 0; c < cols; ++c) panel[c * kP + r % kP] = w[r * cols + c];
  }
}

bool Avx2FmaInUse() { return HaveAvx2(); }

void UsePortableKernels(bool portable) { g_force_portable = portable; }

void GemmSerial(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  Block(x, 0, m, w, 0, w.panels(), y);
}

void Gemm(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  const int64_t work = m * w.in_features() * w.out_features();
  ThreadPool& pool = ThreadPool::Default();
  if (work < (1 << 18) || pool.size() == 1) {
    GemmSerial(x, m, w, y);
    return;
  }
  if (m >= 4 * pool.size()) {  // split rows
    pool.ParallelFor(m, 4, [&](int64_t b, int64_t e) { Block(x, b, e, w, 0, w.panels(), y); });
  } else {  // few rows (decode): split output panels
    pool.ParallelFor(w.panels(), 1, [&](int64_t b, int64_t e) { Block(x, 0, m, w, b, e, y); });
  }
}

}  // namespace kvc::cpu
