// Device launchers for the MoE block on the device (model::MatmulBackend::Experts and
// RoutedMoe): gathering the rows routed to an expert, the gated activation (the shared
// cpu::SwiGlu, bit for bit), the sum of the experts' outputs into their rows in the CPU's
// order (job by job); and the router, the slots it hands the experts and a tiled product
// that picks each tile's expert on the device, so routing needs no round trip.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// xs[m] = x[rows[m]] for m < n, rows of `width` floats.
cudaError_t LaunchGatherRows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                             float* xs, cudaStream_t stream);
// g[r][i] = cpu::SwiGlu(g[r][i], up[r][i], limit, weights[r]) for r < n, i < width; with
// `count` (device memory) only for r < *count.
cudaError_t LaunchSwiGlu(float* g, const float* up, const float* weights, int64_t n, int64_t width,
                         float limit, cudaStream_t stream, const int64_t* count = nullptr);
// out[r][c] += y[slot[e]][c] for e = start[r] … start[r + 1] − 1 in that order (r < rows,
// c < width): each row adds the outputs of the experts that took it, in job order.
cudaError_t LaunchAddRows(float* out, int64_t rows, int64_t width, const float* y,
                          const int64_t* start, const int64_t* slot, cudaStream_t stream);

// The router on the device (model::RouteToken's arithmetic and cpu::TopKAscending's
// picks, bit for bit): per row of `logits` (rows × experts), score = cpu::SqrtSoftplus,
// the top k of score + bias (ties to the lower expert, −inf never), in increasing expert
// order: picks[r][j] and their weights (score, normalized over the picks if `normalize`,
// times `scale`); npicks[r] how many (k unless scores were −inf). k ≤ kMaxRoutedPerToken.
inline constexpr int64_t kMaxRoutedPerToken = 16;
cudaError_t LaunchRoute(const float* logits, const float* bias, int64_t rows, int64_t experts,
                        int64_t k, bool normalize, float scale, int32_t* picks, float* weights,
                        int32_t* npicks, cudaStream_t stream);
// Slots for the experts' products, in the host's job order: the routed experts by id, each
// with its rows in increasing order, then the shared expert (id `experts`) with every row.
// Per slot its row, expert and routing weight (1 for the shared expert); per pick its slot;
// counts[0] the slots, counts[1] the routed ones (the shared expert's slot of row r is
// counts[1] + r); and the products' tiles (LaunchSlotGemm): counts[2] of them, tile t the
// slots [tiles[2t], tiles[2t] + tiles[2t + 1]), one expert's, at most SlotTilesAtMost.
int64_t SlotTilesAtMost(int64_t rows, int64_t k, int64_t experts);
cudaError_t LaunchDispatch(const int32_t* picks, const float* weights, const int32_t* npicks,
                           int64_t rows, int64_t k, int64_t experts, int64_t* slot_row,
                           int32_t* slot_expert, float* slot_weight, int64_t* pick_slot,
                           int64_t* counts, int64_t* tiles, cudaStream_t stream);
// y[s] = x[row(s)] · W_{slot_expert[s]}ᵀ for the slots of LaunchDispatch's tiles (counts[2]
// of at most max_tiles; k > 0): the GEMM kernel's tiled arithmetic (gemm_tile.cuh: one fma
// chain over k in increasing order from +0, the CPU's) on panel-layout weights, each tile
// its expert's from `panels` (a device table, by expert) — weights read once per tile,
// not once per slot. row(s) = slot_row[s], or s itself when slot_row is null; y has a row
// per slot, only the tiles' rows written.
cudaError_t LaunchSlotGemm(const float* x, const int64_t* slot_row, const int32_t* slot_expert,
                           const float* const* panels, const int64_t* tiles, const int64_t* counts,
                           int64_t max_tiles, int64_t k, int64_t n, float* y, cudaStream_t stream);
// out[r] = Σ_j y[pick_slot[r][j]] (j < npicks[r], in order) + y[counts[1] + r], from +0:
// each row's routed experts by id, then the shared one — the host's sum.
cudaError_t LaunchSumPicks(const float* y, const int64_t* pick_slot, const int32_t* npicks,
                           const int64_t* counts, int64_t rows, int64_t k, int64_t width,
                           float* out, cudaStream_t stream);

}  // namespace kvc::cuda
