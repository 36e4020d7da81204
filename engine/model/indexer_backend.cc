#include "engine/model/indexer_backend.h"

#include <algorithm>
#include <limits>

#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/layer_ops.h"

namespace kvc::model {
namespace {

class CpuIndexer final : public IndexerBackend {
 public:
  const char* name() const override { return "cpu"; }
  void Select(const IndexerBatch& b) const override {
    if (b.landing != nullptr) b.landing->Settle();      // qi and w are read here
    if (b.pool_held != nullptr) b.pool_held->Settle();  // and the pool's masks
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int64_t IH = b.heads, Id = b.dim, a = b.first_position, rows = b.queries;
    const int64_t max_cl = (a + rows) / b.ratio;
    // q·k for every head and key as one batch-invariant GEMM per block of queries (each
    // element is the same fma chain over the head dim whatever the block), then the
    // rectified, weighted head sum per key.
    const cpu::PackedMatrix keys(std::span<const float>(b.keys, max_cl * Id), max_cl, Id);
    constexpr int64_t kQueryBlock = 64;
    const int64_t blocks = (rows + kQueryBlock - 1) / kQueryBlock;
    cpu::ThreadPool::Default().ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> qk, scores;
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r0 = blk * kQueryBlock, r1 = std::min(rows, r0 + kQueryBlock);
        const int64_t width = (a + r1) / b.ratio;  // keys the block's last query sees
        const cpu::PackedMatrix* km = &keys;
        cpu::PackedMatrix narrow;
        if (width < max_cl) {
          narrow = cpu::PackedMatrix(std::span<const float>(b.keys, width * Id), width, Id);
          km = &narrow;
        }
        qk.resize((r1 - r0) * IH * width);
        b.matmul->GemmSerial(&b.qi[r0 * IH * Id], (r1 - r0) * IH, *km, qk.data());
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t cl = (a + r + 1) / b.ratio;
          scores.assign(cl, 0.0f);
          for (int64_t h = 0; h < IH; ++h) {
            const float* d = &qk[((r - r0) * IH + h) * width];
            const float wh = b.w[r * IH + h];
            for (int64_t t = 0; t < cl; ++t) scores[t] += std::max(d[t], 0.0f) * wh;
          }
          if (b.pool_use == PoolUse::kProduce) {
            (*b.pool)[r] = CandidateMask(scores, b.block, b.topk_blocks);
          } else if (b.pool_use == PoolUse::kApply) {
            const std::vector<uint8_t>& mask = (*b.pool)[r];
            for (int64_t t = 0; t < cl; ++t) {
              if (t >= static_cast<int64_t>(mask.size()) || !mask[t]) scores[t] = kNegInf;
            }
          }
          (*b.selected)[r] = cpu::TopKAscending(scores, b.topk);
        }
      }
    });
  }
};

}  // namespace

std::unique_ptr<IndexerBackend> MakeCpuIndexer() { return std::make_unique<CpuIndexer>(); }

}  // namespace kvc::model
