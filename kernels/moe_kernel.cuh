// Device launchers for the MoE experts' element-wise steps around their products
// (model::MatmulBackend::Experts on the device): gathering the rows routed to an expert,
// the gated activation (the shared cpu::SwiGlu, bit for bit) and the sum of the experts'
// outputs into their rows, in the CPU's order (job by job).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// xs[m] = x[rows[m]] for m < n, rows of `width` floats.
cudaError_t LaunchGatherRows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                             float* xs, cudaStream_t stream);
// g[r][i] = cpu::SwiGlu(g[r][i], up[r][i], limit, weights[r]) for r < n, i < width.
cudaError_t LaunchSwiGlu(float* g, const float* up, const float* weights, int64_t n, int64_t width,
                         float limit, cudaStream_t stream);
// out[r][c] += y[slot[e]][c] for e = start[r] … start[r + 1] − 1 in that order (r < rows,
// c < width): each row adds the outputs of the experts that took it, in job order.
cudaError_t LaunchAddRows(float* out, int64_t rows, int64_t width, const float* y,
                          const int64_t* start, const int64_t* slot, cudaStream_t stream);

}  // namespace kvc::cuda
