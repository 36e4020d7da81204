// KVC_HOST_DEVICE marks a function compiled for both the CPU and, under nvcc, the GPU:
// the few numeric helpers whose bits the CPU code and the CUDA kernels must share.
#pragma once

#if defined(__CUDACC__)
#define KVC_HOST_DEVICE __host__ __device__
#else
#define KVC_HOST_DEVICE
#endif
