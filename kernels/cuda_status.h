// FromCuda: a CUDA runtime result as an absl::Status (Internal, naming what failed), for
// host code whose callers can handle the failure; the sticky error is cleared.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::cuda {

inline absl::Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace kvc::cuda
