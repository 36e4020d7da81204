#include "engine/model/layer_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/cpu/exp.h"
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

// The same arithmetic in the same order, faster: each key's dot product is still one fmaf
// chain over e, but eight keys' chains run side by side (independent, so the FMA units stay
// busy instead of waiting on one chain's latency); the weighted sum is a chain over t per
// output element, eight elements to a vector. FMA instructions round exactly as fmaf does,
// so the result is bit-identical to AttendHeadPortable (layer_ops_test checks it).
__attribute__((target("avx2,fma"))) void AttendHeadAvx2(const float* q,
                                                        std::span<const float* const> keys,
                                                        int64_t dim, float sink, float scale,
                                                        float* o) {
  const size_t n = keys.size();
  std::vector<float> sc(n);
  float mx = -std::numeric_limits<float>::infinity();
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const float* k[8];
    for (int j = 0; j < 8; ++j) k[j] = keys[t + j];
    float d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t e = 0; e < dim; ++e) {
      const float qe = q[e];
      for (int j = 0; j < 8; ++j) d[j] = __builtin_fmaf(qe, k[j][e], d[j]);
    }
    for (int j = 0; j < 8; ++j) {
      sc[t + j] = d[j] * scale;
      mx = std::max(mx, sc[t + j]);
    }
  }
  for (; t < n; ++t) {
    float d = 0.0f;
    for (int64_t e = 0; e < dim; ++e) d = __builtin_fmaf(q[e], keys[t][e], d);
    sc[t] = d * scale;
    mx = std::max(mx, sc[t]);
  }
  std::fill(o, o + dim, 0.0f);
  if (n == 0) return;
  std::vector<float>& p = sc;  // the weights replace the scores in place
  float den = 0.0f;
  for (size_t u = 0; u < n; ++u) {
    p[u] = cpu::ExpF(sc[u] - mx);
    den += p[u];
  }
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

}  // namespace

void AttendHead(const float* q, std::span<const float* const> keys, int64_t dim, float sink,
                float scale, float* o) {
  if (cpu::Avx2FmaInUse()) {
    AttendHeadAvx2(q, keys, dim, sink, scale, o);
  } else {
    AttendHeadPortable(q, keys, dim, sink, scale, o);
  }
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
