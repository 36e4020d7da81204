// ForEachQuerySlice: launches whose grid.y counts queries go in slices of at most 65535
// (CUDA's grid.y limit; a 64K-token prefill is more queries than that).
#pragma once

#include <cstdint>

namespace kvc::cuda {

// Calls launch(first, count) for consecutive slices covering [0, queries).
template <typename Launch>
void ForEachQuerySlice(int64_t queries, Launch launch) {
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t q0 = 0; q0 < queries; q0 += kMaxGridY) {
    launch(q0, queries - q0 < kMaxGridY ? queries - q0 : kMaxGridY);
  }
}

}  // namespace kvc::cuda
