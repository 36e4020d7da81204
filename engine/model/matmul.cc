#include "engine/model/matmul.h"

#include "base/check.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/layer_ops.h"

namespace kvc::model {
namespace {

class CpuMatmul final : public MatmulBackend {
 public:
  const char* name() const override { return "cpu"; }
  void Register(const cpu::PackedMatrix&) override {}  // weights already live in host memory
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    cpu::Gemm(x, m, w, y);
  }
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    cpu::GemmSerial(x, m, w, y);
  }
};

}  // namespace

void CheckFinish(const RowFinish& f, int64_t width) {
  const int64_t block = f.round ? SpecOf(*f.round).scale_block : 1;
  KVC_CHECK(f.heads > 0 && width % f.heads == 0 && (width / f.heads) % block == 0)
      << "a product's rows of " << width << " floats are not " << f.heads
      << " vectors of whole blocks of " << block;
}

void FinishRows(const RowFinish& f, int64_t rows, int64_t width, float* y) {
  CheckFinish(f, width);
  const int64_t dim = width / f.heads;
  cpu::ThreadPool::Default().ParallelFor(rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < f.heads; ++h) {
        float* v = y + r * width + h * dim;
        if (f.norm != nullptr) cpu::RmsNorm(v, f.norm, dim, f.eps, v);
        if (f.rope_freqs != nullptr) cpu::ApplyRope(v, dim, *f.rope_freqs, f.first_position + r);
        if (f.round) FakeQuantize(*f.round, std::span<float>(v, dim));
        if (f.multiplier != 1.0f) {
          for (int64_t i = 0; i < dim; ++i) v[i] *= f.multiplier;
        }
      }
    }
  });
}

void CheckChain(std::span<const GemmCall> calls, size_t i) {
  const GemmCall& c = calls[i];
  KVC_CHECK(c.input_out == nullptr || c.input_of >= 0)
      << "product " << i << " of a group asks for its input back, which is not a chained one";
  if (c.input_of < 0) return;
  const int64_t k = c.w->in_features();
  if (c.pool_ratio > 0) {
    const bool fits =
        static_cast<size_t>(c.input_of) < i && c.score_of >= 0 &&
        static_cast<size_t>(c.score_of) < i && calls[c.input_of].w->out_features() == k &&
        calls[c.score_of].w->out_features() == k && calls[c.score_of].m == calls[c.input_of].m &&
        c.pool_pending >= 0 && c.m * c.pool_ratio <= c.pool_pending + calls[c.input_of].m &&
        (c.pool_pending == 0 || (c.pool_kv != nullptr && c.pool_score != nullptr)) &&
        c.norm_weight != nullptr;
    KVC_CHECK(fits) << "product " << i << " of a group pools " << c.m << " groups of "
                    << c.pool_ratio << " rows from " << c.pool_pending
                    << " pending rows and products " << c.input_of << ", " << c.score_of
                    << ", which do not hold them (or has no norm weight)";
    return;
  }
  KVC_CHECK(static_cast<size_t>(c.input_of) < i && calls[c.input_of].m == c.m &&
            calls[c.input_of].w->out_features() == k && c.norm_weight != nullptr)
      << "product " << i << " of a group chains product " << c.input_of
      << ", which is not an earlier one of " << c.m << " rows × " << k
      << " (or has no norm weight)";
}

void PooledRows(std::span<const GemmCall> calls, size_t i, std::vector<float>& kv,
                std::vector<float>& score) {
  const GemmCall& c = calls[i];
  const int64_t k = c.w->in_features(), rows = c.m * c.pool_ratio;
  const int64_t fresh = rows - c.pool_pending;
  kv.assign(c.pool_kv, c.pool_kv + c.pool_pending * k);
  score.assign(c.pool_score, c.pool_score + c.pool_pending * k);
  kv.insert(kv.end(), calls[c.input_of].y, calls[c.input_of].y + fresh * k);
  score.insert(score.end(), calls[c.score_of].y, calls[c.score_of].y + fresh * k);
}

size_t SameChainedInput(std::span<const GemmCall> calls, size_t i) {
  const GemmCall& c = calls[i];
  if (c.input_of < 0 || c.pool_ratio > 0) return i;
  for (size_t j = static_cast<size_t>(c.input_of) + 1; j < i; ++j) {
    const GemmCall& o = calls[j];
    if (o.input_of == c.input_of && o.pool_ratio == 0 && o.norm_weight == c.norm_weight &&
        o.norm_eps == c.norm_eps && o.m > 0 && o.w->out_features() > 0)
      return j;
  }
  return i;
}

const float* HostInput(std::span<const GemmCall> calls, size_t i, std::vector<float>& storage) {
  const GemmCall& c = calls[i];
  if (c.input_of < 0) return c.x;
  CheckChain(calls, i);
  const int64_t k = c.w->in_features();
  if (c.pool_ratio > 0) {
    std::vector<float> kv, score;
    PooledRows(calls, i, kv, score);
    storage.resize(static_cast<size_t>(c.m * k));
    for (int64_t g = 0; g < c.m; ++g) {
      const int64_t at = g * c.pool_ratio * k;
      const std::vector<float> latent = PoolGroup(&kv[at], &score[at], c.pool_ratio, k);
      cpu::RmsNorm(latent.data(), c.norm_weight, k, c.norm_eps, &storage[g * k]);
    }
    return storage.data();
  }
  storage.resize(static_cast<size_t>(c.m * k));
  for (int64_t r = 0; r < c.m; ++r)
    cpu::RmsNorm(calls[c.input_of].y + r * k, c.norm_weight, k, c.norm_eps, &storage[r * k]);
  return storage.data();
}

std::unique_ptr<MatmulBackend> MakeCpuMatmul() { return std::make_unique<CpuMatmul>(); }

}  // namespace kvc::model
