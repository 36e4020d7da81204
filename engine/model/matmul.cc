#include "engine/model/matmul.h"

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

std::unique_ptr<MatmulBackend> MakeCpuMatmul() { return std::make_unique<CpuMatmul>(); }

}  // namespace kvc::model
