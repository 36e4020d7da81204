/* Fused CPU kernels for the training step's small per-token products (kvtrain/kernels.py
 * compiles this file on first use and calls it through ctypes).
 *
 * Why: on a CPU core the step spent ~40 % of its time in PyTorch operations on tiny
 * per-token tensors — mHC's Sinkhorn (a 4 x 4 matrix per token, 20 iterations: ~250
 * launches over [T, 4, 4]), hc_post (a 4 x 4 by 4 x D product per token, which batched
 * GEMM runs at a tenth of its speed) and the top-k attention's products with each query's
 * 64 selected rows (a 32 MB gathered copy forward, a 32 MB dense scatter and a full GEMM
 * backward). Here each is one pass over its tokens, the selected rows read in place (one
 * batch row's entries are 256 KB: they stay in cache).
 *
 * Every kernel exists for float and double (the gradient checks run in double); layouts are
 * row-major and contiguous, as kernels.py hands them over. The math is model.py's: the
 * PyTorch forms there stay the reference the tests hold these to. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KVT_DEFINE(T, S)                                                                      \
  /* y = x / (sum + eps) along each of hc lines of an hc x hc matrix: line o holds the    \
   * elements o*so + i*si (rows: so = hc, si = 1; columns: so = 1, si = hc); d gets the   \
   * divisors. */                                                                         \
  static void normalize_##S(T* m, int hc, int so, int si, T eps, T* d) {                  \
    for (int o = 0; o < hc; ++o) {                                                        \
      T s = 0;                                                                            \
      for (int i = 0; i < hc; ++i) s += m[o * so + i * si];                               \
      d[o] = s + eps;                                                                     \
      for (int i = 0; i < hc; ++i) m[o * so + i * si] /= d[o];                            \
    }                                                                                     \
  }                                                                                       \
  /* Its backward along the same lines: dx = (dy - sum_line(dy * y)) / d, in place in g. */\
  static void normalize_bwd_##S(T* g, const T* y, const T* d, int hc, int so, int si) {   \
    for (int o = 0; o < hc; ++o) {                                                        \
      T s = 0;                                                                            \
      for (int i = 0; i < hc; ++i) s += g[o * so + i * si] * y[o * so + i * si];          \
      for (int i = 0; i < hc; ++i) g[o * so + i * si] = (g[o * so + i * si] - s) / d[o];  \
    }                                                                                     \
  }                                                                                       \
  /* Sinkhorn: per token a row softmax of the hc x hc logits (+ eps), then `iters`          \
   * normalizations — the first of columns only, later rows then columns — each            \
   * y = x / (sum + eps). With `trace`, every step's output and divisors are kept for the   \
   * backward (steps x (hc*hc + hc) values), and P (the softmax) in trace's first slot. */  \
  static int sinkhorn_steps_##S(int iters) { return 2 * (iters > 1 ? iters : 1) - 1; }      \
  static void sinkhorn_one_##S(const T* z, T* out, int hc, int iters, T eps, T* trace) {    \
    T m[64];                                                                                \
    for (int r = 0; r < hc; ++r) {                                                          \
      T mx = z[r * hc];                                                                     \
      for (int c = 1; c < hc; ++c) mx = z[r * hc + c] > mx ? z[r * hc + c] : mx;           \
      T s = 0;                                                                              \
      for (int c = 0; c < hc; ++c) s += (m[r * hc + c] = (T)exp(z[r * hc + c] - mx));      \
      for (int c = 0; c < hc; ++c) m[r * hc + c] /= s;                                      \
    }                                                                                       \
    if (trace) memcpy(trace, m, sizeof(T) * hc * hc);                                       \
    for (int i = 0; i < hc * hc; ++i) m[i] += eps;                                          \
    int step = 0;                                                                           \
    for (int it = 0; it < (iters > 1 ? iters : 1); ++it) {                                  \
      for (int a = (it > 0 ? 0 : 1); a < 2; ++a, ++step) {                                  \
        T d[8];                                                                             \
        /* rows (a == 0): each row by its sum over columns; columns: each column */       \
        normalize_##S(m, hc, a == 0 ? hc : 1, a == 0 ? 1 : hc, eps, d);                   \
        if (trace) {                                                                        \
          T* t = trace + hc * hc + (size_t)step * (hc * hc + hc);                           \
          memcpy(t, m, sizeof(T) * hc * hc);                                                \
          memcpy(t + hc * hc, d, sizeof(T) * hc);                                           \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    memcpy(out, m, sizeof(T) * hc * hc);                                                    \
  }                                                                                         \
  int kvt_sinkhorn_fwd_##S(const T* logits, T* out, int64_t n, int hc, int iters, T eps) {  \
    if (hc < 1 || hc > 8) return -1;                                                        \
    for (int64_t t = 0; t < n; ++t)                                                         \
      sinkhorn_one_##S(logits + t * hc * hc, out + t * hc * hc, hc, iters, eps, NULL);      \
    return 0;                                                                               \
  }                                                                                         \
  /* Backward, the forward recomputed per token: y = x / d along an axis gives              \
   * dx = (dy - sum_axis(dy * y)) / d; the softmax's dz = P * (g - sum_cols(g * P)). */     \
  int kvt_sinkhorn_bwd_##S(const T* logits, const T* grad, T* dlogits, int64_t n, int hc,   \
                           int iters, T eps) {                                              \
    if (hc < 1 || hc > 8) return -1;                                                        \
    const int steps = sinkhorn_steps_##S(iters);                                            \
    T* trace = (T*)malloc(sizeof(T) * (hc * hc + (size_t)steps * (hc * hc + hc)));          \
    if (!trace) return -2;                                                                  \
    T y[64], g[64];                                                                         \
    for (int64_t t = 0; t < n; ++t) {                                                       \
      sinkhorn_one_##S(logits + t * hc * hc, y, hc, iters, eps, trace);                     \
      memcpy(g, grad + t * hc * hc, sizeof(T) * hc * hc);                                   \
      for (int step = steps - 1; step >= 0; --step) {                                       \
        const T* ys = trace + hc * hc + (size_t)step * (hc * hc + hc);                      \
        const T* d = ys + hc * hc;                                                          \
        const int rows = (step == 0) ? 0 : ((step - 1) % 2 == 0);                           \
        normalize_bwd_##S(g, ys, d, hc, rows ? hc : 1, rows ? 1 : hc);                    \
      }                                                                                     \
      const T* P = trace;                                                                   \
      T* dz = dlogits + t * hc * hc;                                                        \
      for (int r = 0; r < hc; ++r) {                                                        \
        T s = 0;                                                                            \
        for (int c = 0; c < hc; ++c) s += g[r * hc + c] * P[r * hc + c];                   \
        for (int c = 0; c < hc; ++c) dz[r * hc + c] = P[r * hc + c] * (g[r * hc + c] - s);  \
      }                                                                                     \
    }                                                                                       \
    free(trace);                                                                            \
    return 0;                                                                               \
  }                                                                                         \
                                                                                            \
  /* hc_post: out[k] = post[k] * f + sum_j comb[j][k] * R[j], per token (f [D], R [hc, D],  \
   * post [hc], comb [hc, hc]). */                                                          \
  void kvt_hc_post_fwd_##S(const T* f, const T* R, const T* post, const T* comb, T* out,    \
                           int64_t n, int hc, int64_t D) {                                  \
    for (int64_t t = 0; t < n; ++t) {                                                       \
      const T* ft = f + t * D;                                                              \
      const T* Rt = R + t * hc * D;                                                         \
      const T* ct = comb + t * hc * hc;                                                     \
      for (int k = 0; k < hc; ++k) {                                                        \
        T* o = out + (t * hc + k) * D;                                                      \
        const T pk = post[t * hc + k];                                                      \
        for (int64_t x = 0; x < D; ++x) o[x] = pk * ft[x];                                  \
        for (int j = 0; j < hc; ++j) {                                                      \
          const T w = ct[j * hc + k];                                                       \
          const T* Rj = Rt + j * D;                                                         \
          for (int64_t x = 0; x < D; ++x) o[x] += w * Rj[x];                                \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  }                                                                                         \
  void kvt_hc_post_bwd_##S(const T* f, const T* R, const T* post, const T* comb,            \
                           const T* g, T* df, T* dR, T* dpost, T* dcomb, int64_t n, int hc, \
                           int64_t D) {                                                     \
    for (int64_t t = 0; t < n; ++t) {                                                       \
      const T* ft = f + t * D;                                                              \
      const T* Rt = R + t * hc * D;                                                         \
      const T* gt = g + t * hc * D;                                                         \
      const T* ct = comb + t * hc * hc;                                                     \
      T* dft = df + t * D;                                                                  \
      T* dRt = dR + t * hc * D;                                                             \
      memset(dft, 0, sizeof(T) * D);                                                        \
      memset(dRt, 0, sizeof(T) * hc * D);                                                   \
      for (int k = 0; k < hc; ++k) {                                                        \
        const T* gk = gt + k * D;                                                           \
        const T pk = post[t * hc + k];                                                      \
        T s = 0;                                                                            \
        _Pragma("omp simd reduction(+ : s)") for (int64_t x = 0; x < D; ++x) {              \
          s += gk[x] * ft[x];                                                               \
          dft[x] += pk * gk[x];                                                             \
        }                                                                                   \
        dpost[t * hc + k] = s;                                                              \
        for (int j = 0; j < hc; ++j) {                                                      \
          const T* Rj = Rt + j * D;                                                         \
          T* dRj = dRt + j * D;                                                             \
          const T w = ct[j * hc + k];                                                       \
          T sc = 0;                                                                         \
          _Pragma("omp simd reduction(+ : sc)") for (int64_t x = 0; x < D; ++x) {           \
            sc += gk[x] * Rj[x];                                                            \
            dRj[x] += w * gk[x];                                                            \
          }                                                                                 \
          dcomb[t * hc * hc + j * hc + k] = sc;                                             \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  }                                                                                         \
                                                                                            \
  /* Each query's products with the k rows of `main` it selected (idx [B, N, k] into main  \
   * [B, Nc, hd]), read in place. keys: rows [B, N, H, hd] -> out [B, N, H, k] (scores);    \
   * values: rows [B, N, H, k] -> out [B, N, H, hd] (weighted sums). */                     \
  int kvt_selected_fwd_##S(const T* rows, const T* main, const int64_t* idx, T* out,        \
                           int64_t B, int64_t N, int64_t H, int64_t k, int64_t Nc,          \
                           int64_t hd, int keys) {                                          \
    for (int64_t b = 0; b < B; ++b) {                                                       \
      const T* mb = main + b * Nc * hd;                                                     \
      for (int64_t q = 0; q < N; ++q) {                                                     \
        const int64_t* iq = idx + (b * N + q) * k;                                          \
        const int64_t base = (b * N + q) * H;                                               \
        if (!keys) memset(out + base * hd, 0, sizeof(T) * H * hd);                          \
        for (int64_t j = 0; j < k; ++j) {                                                   \
          if (iq[j] < 0 || iq[j] >= Nc) return -1;                                          \
          const T* m = mb + iq[j] * hd;                                                     \
          for (int64_t h = 0; h < H; ++h) {                                                 \
            if (keys) {                                                                     \
              const T* r = rows + (base + h) * hd;                                          \
              T s = 0;                                                                      \
              _Pragma("omp simd reduction(+ : s)") for (int64_t x = 0; x < hd; ++x) s +=    \
                  r[x] * m[x];                                                              \
              out[(base + h) * k + j] = s;                                                  \
            } else {                                                                        \
              const T w = rows[(base + h) * k + j];                                         \
              T* o = out + (base + h) * hd;                                                 \
              for (int64_t x = 0; x < hd; ++x) o[x] += w * m[x];                            \
            }                                                                               \
          }                                                                                 \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    return 0;                                                                               \
  }                                                                                         \
  /* Backward: grad_rows is written; grad_main [B, Nc, hd] is added to (zeroed by the       \
   * caller) — each selected row gets sum_h of its factor times the query's vector. */      \
  int kvt_selected_bwd_##S(const T* rows, const T* main, const int64_t* idx, const T* grad, \
                           T* grad_rows, T* grad_main, int64_t B, int64_t N, int64_t H,     \
                           int64_t k, int64_t Nc, int64_t hd, int keys) {                   \
    for (int64_t b = 0; b < B; ++b) {                                                       \
      const T* mb = main + b * Nc * hd;                                                     \
      T* gmb = grad_main + b * Nc * hd;                                                     \
      for (int64_t q = 0; q < N; ++q) {                                                     \
        const int64_t* iq = idx + (b * N + q) * k;                                          \
        const int64_t base = (b * N + q) * H;                                               \
        if (keys) memset(grad_rows + base * hd, 0, sizeof(T) * H * hd);                     \
        for (int64_t j = 0; j < k; ++j) {                                                   \
          if (iq[j] < 0 || iq[j] >= Nc) return -1;                                          \
          const T* m = mb + iq[j] * hd;                                                     \
          T* gm = gmb + iq[j] * hd;                                                         \
          for (int64_t h = 0; h < H; ++h) {                                                 \
            if (keys) { /* out = r . m: g [.., k] */                                        \
              const T gj = grad[(base + h) * k + j];                                        \
              const T* r = rows + (base + h) * hd;                                          \
              T* gr = grad_rows + (base + h) * hd;                                          \
              for (int64_t x = 0; x < hd; ++x) {                                            \
                gr[x] += gj * m[x];                                                         \
                gm[x] += gj * r[x];                                                         \
              }                                                                             \
            } else { /* out = sum_j w_j m_j: g [.., hd] */                                  \
              const T* gq = grad + (base + h) * hd;                                         \
              const T w = rows[(base + h) * k + j];                                         \
              T s = 0;                                                                      \
              _Pragma("omp simd reduction(+ : s)") for (int64_t x = 0; x < hd; ++x) {       \
                s += gq[x] * m[x];                                                          \
                gm[x] += w * gq[x];                                                         \
              }                                                                             \
              grad_rows[(base + h) * k + j] = s;                                            \
            }                                                                               \
          }                                                                                 \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    return 0;                                                                               \
  }

KVT_DEFINE(float, f32)
KVT_DEFINE(double, f64)
