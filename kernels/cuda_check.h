// CUDA_CHECK(expr): a failed CUDA runtime call is a programmer or environment error that
// the caller cannot handle here, so it aborts, naming the expression, file and line.
// Code that must survive a missing GPU checks cuda::DeviceCount() first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    const cudaError_t kvc_cuda_status_ = (expr);                                            \
    if (kvc_cuda_status_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: CUDA_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(kvc_cuda_status_));                                   \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
