#include "engine/model/layer_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/cpu/exp.h"
#include "engine/cpu/exp_avx2.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/softplus.h"

namespace kvc::model {

std::vector<float> PoolGroup(const float* kv, const float* score, int64_t ratio, int64_t dim) {
  std::vector<float> out(dim);
  for (int64_t ch = 0; ch < dim; ++ch) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < ratio; ++t) mx = std::max(mx, score[t * dim + ch]);
    float den = 0.0f;
    for (int64_t t = 0; t < ratio; ++t) den += cpu::ExpF(score[t * dim + ch] - mx);
    float acc = 0.0f;
    for (int64_t t = 0; t < ratio; ++t)
      acc += kv[t * dim + ch] * (cpu::ExpF(score[t * dim + ch] - mx) / den);
    out[ch] = acc;
  }
  return out;
}

namespace {

void AttendHeadPortable(const float* q, std::span<const float* const> keys, int64_t dim, float sink,
                        float scale, float* o) {
  std::vector<float> sc(keys.size());
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < keys.size(); ++t) {
    float d = 0.0f;
    for (int64_t e = 0; e < dim; ++e) d = std::fmaf(q[e], keys[t][e], d);
    sc[t] = d * scale;
    mx = std::max(mx, sc[t]);
  }
  std::fill(o, o + dim, 0.0f);
  if (keys.empty()) return;
  float den = 0.0f;
  for (size_t t = 0; t < keys.size(); ++t) {
    const float p = cpu::ExpF(sc[t] - mx);
    den += p;
    for (int64_t e = 0; e < dim; ++e) o[e] = std::fmaf(p, keys[t][e], o[e]);
  }
  den += cpu::ExpF(sink - mx);
  for (int64_t e = 0; e < dim; ++e) o[e] /= den;
}

// The same arithmetic in the same order, faster. Scores: each (head, key) dot product is
// still one fmaf chain over e, in order; eight keys' chains run side by side in the lanes of
// a vector — the eight keys' rows transposed eight elements at a time, so each chain step is
// one vector FMA — and the heads of a query, which read the same keys (MQA), share each
// transpose. The weighted sum is a chain over t per output element, eight elements to a
// vector. FMA instructions round exactly as fmaf does, so the result is bit-identical to
// AttendHeadPortable per head (layer_ops_test checks it).

// Columns i = 0..7 of the 8×8 block rows[j][0..7] (j = 0..7): c[i] lane j = rows[j][i].
__attribute__((target("avx2,fma"))) inline void Transpose8(const float* const* rows, int64_t at,
                                                           __m256 c[8]) {
  const __m256 r0 = _mm256_loadu_ps(rows[0] + at), r1 = _mm256_loadu_ps(rows[1] + at),
               r2 = _mm256_loadu_ps(rows[2] + at), r3 = _mm256_loadu_ps(rows[3] + at),
               r4 = _mm256_loadu_ps(rows[4] + at), r5 = _mm256_loadu_ps(rows[5] + at),
               r6 = _mm256_loadu_ps(rows[6] + at), r7 = _mm256_loadu_ps(rows[7] + at);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
               t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
               t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// d[h][j] = q_h · k_j for HN heads (rows of q, dim apart) and eight keys, unscaled.
template <int HN>
__attribute__((target("avx2,fma"))) void DotsOf8Keys(const float* q, int64_t dim,
                                                     const float* const* k, float d[][8]) {
  __m256 acc[HN];
  for (int h = 0; h < HN; ++h) acc[h] = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + 8 <= dim; e += 8) {
    __m256 c[8];
    Transpose8(k, e, c);
    for (int i = 0; i < 8; ++i) {
      for (int h = 0; h < HN; ++h)
        acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(q[h * dim + e + i]), c[i], acc[h]);
    }
  }
  for (int h = 0; h < HN; ++h) _mm256_storeu_ps(d[h], acc[h]);
  for (; e < dim; ++e) {
    for (int h = 0; h < HN; ++h) {
      for (int j = 0; j < 8; ++j) d[h][j] = __builtin_fmaf(q[h * dim + e], k[j][e], d[h][j]);
    }
  }
}

// One head's output from its scores (overwritten with the weights).
__attribute__((target("avx2,fma"))) void WeightedSumAvx2(float* sc,
                                                         std::span<const float* const> keys,
                                                         int64_t dim, float sink, float* o) {
  const size_t n = keys.size();
  std::fill(o, o + dim, 0.0f);
  if (n == 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t u = 0; u < n; ++u) mx = std::max(mx, sc[u]);
  float* p = sc;  // the weights replace the scores in place
  size_t v = 0;   // eight weights at a time, then the rest
  for (const __m256 m8 = _mm256_set1_ps(mx); v + 8 <= n; v += 8)
    _mm256_storeu_ps(p + v, cpu::ExpF8(_mm256_sub_ps(_mm256_loadu_ps(sc + v), m8)));
  for (; v < n; ++v) p[v] = cpu::ExpF(sc[v] - mx);
  float den = 0.0f;
  for (size_t u = 0; u < n; ++u) den += p[u];
  int64_t e = 0;
  for (; e + 32 <= dim; e += 32) {  // four vectors of the output held in registers across t
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t u = 0; u < n; ++u) {
      const __m256 pv = _mm256_set1_ps(p[u]);
      const float* k = keys[u] + e;
      a0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(k), a0);
      a1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(k + 8), a1);
      a2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(k + 16), a2);
      a3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(k + 24), a3);
    }
    _mm256_storeu_ps(o + e, a0);
    _mm256_storeu_ps(o + e + 8, a1);
    _mm256_storeu_ps(o + e + 16, a2);
    _mm256_storeu_ps(o + e + 24, a3);
  }
  for (; e + 8 <= dim; e += 8) {
    __m256 a = _mm256_setzero_ps();
    for (size_t u = 0; u < n; ++u)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[u]), _mm256_loadu_ps(keys[u] + e), a);
    _mm256_storeu_ps(o + e, a);
  }
  for (; e < dim; ++e) {
    float a = 0.0f;
    for (size_t u = 0; u < n; ++u) a = __builtin_fmaf(p[u], keys[u][e], a);
    o[e] = a;
  }
  den += cpu::ExpF(sink - mx);
  for (int64_t i = 0; i < dim; ++i) o[i] /= den;
}

__attribute__((target("avx2,fma"))) void AttendHeadsAvx2(const float* q, int64_t heads,
                                                         std::span<const float* const> keys,
                                                         int64_t dim, const float* sinks,
                                                         float scale, float* o) {
  const size_t n = keys.size();
  std::vector<float> sc(static_cast<size_t>(heads) * n);  // sc[h * n + t]
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const float* k[8];
    for (int j = 0; j < 8; ++j) k[j] = keys[t + j];
    for (int64_t h0 = 0; h0 < heads; h0 += 4) {
      float d[4][8];
      const float* qh = q + h0 * dim;
      const int64_t hn = std::min<int64_t>(4, heads - h0);
      switch (hn) {
        case 1:
          DotsOf8Keys<1>(qh, dim, k, d);
          break;
        case 2:
          DotsOf8Keys<2>(qh, dim, k, d);
          break;
        case 3:
          DotsOf8Keys<3>(qh, dim, k, d);
          break;
        default:
          DotsOf8Keys<4>(qh, dim, k, d);
          break;
      }
      for (int64_t h = 0; h < hn; ++h) {
        for (int j = 0; j < 8; ++j) sc[(h0 + h) * n + t + j] = d[h][j] * scale;
      }
    }
  }
  for (; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float d = 0.0f;
      for (int64_t e = 0; e < dim; ++e) d = __builtin_fmaf(q[h * dim + e], keys[t][e], d);
      sc[h * n + t] = d * scale;
    }
  }
  for (int64_t h = 0; h < heads; ++h)
    WeightedSumAvx2(sc.data() + h * n, keys, dim, sinks[h], o + h * dim);
}

}  // namespace

void AttendHeads(const float* q, int64_t heads, std::span<const float* const> keys, int64_t dim,
                 const float* sinks, float scale, float* o) {
  if (cpu::Avx2FmaInUse()) {
    AttendHeadsAvx2(q, heads, keys, dim, sinks, scale, o);
  } else {
    for (int64_t h = 0; h < heads; ++h)
      AttendHeadPortable(q + h * dim, keys, dim, sinks[h], scale, o + h * dim);
  }
}

void AttendHead(const float* q, std::span<const float* const> keys, int64_t dim, float sink,
                float scale, float* o) {
  AttendHeads(q, 1, keys, dim, &sink, scale, o);
}

std::vector<uint8_t> CandidateMask(std::span<const float> scores, int64_t block,
                                   int64_t topk_blocks) {
  const int64_t cl = static_cast<int64_t>(scores.size());
  const int64_t nblocks = (cl + block - 1) / block;
  std::vector<float> best(nblocks, -std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < cl; ++t) best[t / block] = std::max(best[t / block], scores[t]);
  if (cl > 0) best[(cl - 1) / block] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> mask(cl, 0);
  for (int32_t b : cpu::TopKAscending(best, topk_blocks)) {
    for (int64_t t = b * block; t < std::min(cl, (b + 1) * block); ++t) mask[t] = 1;
  }
  return mask;
}

std::vector<std::pair<int32_t, float>> RouteToken(std::span<const float> logits,
                                                  std::span<const float> bias, int64_t k,
                                                  bool normalize, float routed_scale) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<float> score(n), biased(n);
  for (int64_t e = 0; e < n; ++e) {
    score[e] = cpu::SqrtSoftplus(logits[e]);
    biased[e] = score[e] + bias[e];
  }
  const std::vector<int32_t> pick = cpu::TopKAscending(biased, k);
  float sum = 0.0f;
  for (int32_t e : pick) sum += score[e];
  std::vector<std::pair<int32_t, float>> out;
  for (int32_t e : pick) {
    const float w = normalize ? score[e] / (sum + 1e-20f) : score[e];
    out.push_back({e, w * routed_scale});
  }
  return out;
}

std::vector<int64_t> EngramRows(std::span<const uint32_t> tokens, int64_t pos,
                                std::span<const int64_t> multipliers,
                                std::span<const int64_t> primes, std::span<const int64_t> offsets,
                                int64_t heads, int64_t pad_token, int64_t compressed_vocab) {
  auto cmp = [&](int64_t tok) { return tok % compressed_vocab; };
  std::vector<int64_t> rows;
  uint64_t h = 0;
  for (size_t k = 0; k < multipliers.size(); ++k) {
    const int64_t tok = pos >= static_cast<int64_t>(k) ? cmp(tokens[pos - k]) : cmp(pad_token);
    const uint64_t term = static_cast<uint64_t>(tok) * static_cast<uint64_t>(multipliers[k]);
    h = k == 0 ? term : h ^ term;
    if (k == 0) continue;
    for (int64_t j = 0; j < heads; ++j) {
      const size_t slot = (k - 1) * heads + j;
      const int64_t r = static_cast<int64_t>(h) % primes[slot];
      rows.push_back((r < 0 ? r + primes[slot] : r) + offsets[slot]);
    }
  }
  return rows;
}

}  // namespace kvc::model
