#include "engine/model/matmul.h"

#include "engine/cpu/ops.h"
#include "engine/spec/check.h"

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

void CheckChain(std::span<const GemmCall> calls, size_t i) {
  const GemmCall& c = calls[i];
  if (c.input_of < 0) return;
  const int64_t k = c.w->in_features();
  KVC_CHECK(static_cast<size_t>(c.input_of) < i && calls[c.input_of].m == c.m &&
            calls[c.input_of].w->out_features() == k && c.norm_weight != nullptr)
      << "product " << i << " of a group chains product " << c.input_of
      << ", which is not an earlier one of " << c.m << " rows × " << k
      << " (or has no norm weight)";
}

size_t SameChainedInput(std::span<const GemmCall> calls, size_t i) {
  const GemmCall& c = calls[i];
  if (c.input_of < 0) return i;
  for (size_t j = static_cast<size_t>(c.input_of) + 1; j < i; ++j) {
    const GemmCall& o = calls[j];
    if (o.input_of == c.input_of && o.norm_weight == c.norm_weight && o.norm_eps == c.norm_eps &&
        o.m > 0 && o.w->out_features() > 0)
      return j;
  }
  return i;
}

const float* HostInput(std::span<const GemmCall> calls, size_t i, std::vector<float>& storage) {
  const GemmCall& c = calls[i];
  if (c.input_of < 0) return c.x;
  CheckChain(calls, i);
  const int64_t k = c.w->in_features();
  storage.resize(static_cast<size_t>(c.m * k));
  for (int64_t r = 0; r < c.m; ++r)
    cpu::RmsNorm(calls[c.input_of].y + r * k, c.norm_weight, k, c.norm_eps, &storage[r * k]);
  return storage.data();
}

std::unique_ptr<MatmulBackend> MakeCpuMatmul() { return std::make_unique<CpuMatmul>(); }

}  // namespace kvc::model
