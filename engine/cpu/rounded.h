// Single, correctly rounded floating-point operations for the numeric helpers the CPU code
// and the CUDA kernels share (exp.h, swiglu.h, softplus.h, hyper_connections.h): each is
// one IEEE operation in round-to-nearest on both sides, never fused with a neighbour. On
// the device the explicit __d*_rn / __f*_rn intrinsics forbid nvcc's contraction; on the
// host the build's -ffp-contract=off does (CMakeLists.txt: GCC contracts C++ even in its
// ISO modes, and did, in the AVX2 functions these helpers are inlined into).
#pragma once

#include <math.h>

#include "engine/spec/host_device.h"

namespace kvc::cpu::rounded {

#if defined(__CUDA_ARCH__)
KVC_HOST_DEVICE inline double Mul(double a, double b) { return __dmul_rn(a, b); }
KVC_HOST_DEVICE inline double Add(double a, double b) { return __dadd_rn(a, b); }
KVC_HOST_DEVICE inline double Div(double a, double b) { return __ddiv_rn(a, b); }
KVC_HOST_DEVICE inline double Sqrt(double a) { return __dsqrt_rn(a); }
KVC_HOST_DEVICE inline float Mul(float a, float b) { return __fmul_rn(a, b); }
KVC_HOST_DEVICE inline float Add(float a, float b) { return __fadd_rn(a, b); }
KVC_HOST_DEVICE inline float Div(float a, float b) { return __fdiv_rn(a, b); }
KVC_HOST_DEVICE inline float Sqrt(float a) { return __fsqrt_rn(a); }
#else
inline double Mul(double a, double b) { return a * b; }
inline double Add(double a, double b) { return a + b; }
inline double Div(double a, double b) { return a / b; }
inline double Sqrt(double a) { return sqrt(a); }
inline float Mul(float a, float b) { return a * b; }
inline float Add(float a, float b) { return a + b; }
inline float Div(float a, float b) { return a / b; }
inline float Sqrt(float a) { return sqrtf(a); }
#endif

}  // namespace kvc::cpu::rounded
