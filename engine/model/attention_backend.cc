#include "engine/model/attention_backend.h"

#include "engine/cpu/thread_pool.h"
#include "engine/model/layer_ops.h"

namespace kvc::model {
namespace {

class CpuAttention final : public AttentionBackend {
 public:
  const char* name() const override { return "cpu"; }
  void Attend(const AttentionBatch& b) const override {
    if (b.landing != nullptr) b.landing->Settle();  // q and the fresh rows are read here
    const int64_t ring_rows = b.dim > 0 ? static_cast<int64_t>(b.window.size()) / b.dim : 0;
    auto window_row = [&](int64_t e) {
      return e < ring_rows ? b.window.data() + e * b.dim : b.fresh + (e - ring_rows) * b.dim;
    };
    cpu::ThreadPool::Default().ParallelFor(b.queries, 4, [&](int64_t r0, int64_t r1) {
      std::vector<const float*> keys;
      for (int64_t r = r0; r < r1; ++r) {
        keys.clear();
        for (int32_t k = b.offsets[r]; k < b.offsets[r + 1]; ++k) {
          const int32_t e = b.entries[k];
          keys.push_back(e >= 0 ? window_row(e)
                                : b.compressed + (-static_cast<int64_t>(e) - 1) * b.dim);
        }
        const int64_t at = r * b.heads * b.dim;
        AttendHeads(b.q + at, b.heads, keys, b.dim, b.sink, b.scale, b.out + at);
      }
    });
  }
};

}  // namespace

std::unique_ptr<AttentionBackend> MakeCpuAttention() { return std::make_unique<CpuAttention>(); }

}  // namespace kvc::model
