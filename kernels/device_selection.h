// DeviceSelection: the CUDA indexer's selection as it lies on the device, for the CUDA
// attention to read there (model::HeldSelection). A reader waits for `ready` on its
// stream before reading and records `consumed` on it after: the indexer reuses the
// memory only once `consumed` has passed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/model/indexer_backend.h"

namespace kvc::cuda {

class DeviceSelection : public model::HeldSelection {
 public:
  const int32_t* positions = nullptr;  // queries × k, ascending; query q's first counts[q]
  const int32_t* counts = nullptr;     // queries
  int64_t queries = 0, k = 0;
  cudaEvent_t ready = nullptr, consumed = nullptr;
  // The candidate pool it produced (kProduce; else null), on the indexer's stream: per
  // query pool_width positions, ascending, −1 after the first pool_count[q]; for queries at
  // first_position, first_position + 1, … seeing (position + 1) / ratio keys.
  const int32_t* pool = nullptr;
  const int32_t* pool_count = nullptr;
  int64_t pool_width = 0, first_position = 0, ratio = 0;
};

}  // namespace kvc::cuda
