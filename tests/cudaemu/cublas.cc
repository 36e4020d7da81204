// cuBLAS SGEMM on the CPU for the emulation build: column-major, one fma chain per output
// in k order; operands must be device memory, as cuBLAS requires.
#include <cmath>
#include <cstdio>

#include "cublas_v2.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

namespace {

bool OnDevice(const float* p, int rows, int cols, int ld, const char* what) {
  if (rows == 0 || cols == 0) return true;
  const size_t span = (static_cast<size_t>(cols) - 1) * ld + rows;
  if (cudaemu::Classify(p, span * sizeof(float)) == cudaemu::Memory::kDevice) return true;
  std::fprintf(stderr, "cudaemu: cublasSgemm: %s (%d x %d, ld %d) at %p is not device memory\n",
               what, rows, cols, ld, static_cast<const void*>(p));
  return false;
}

}  // namespace

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  if (!OnDevice(a, ta ? k : m, ta ? m : k, lda, "A") ||
      !OnDevice(b, tb ? n : k, tb ? k : n, ldb, "B") || !OnDevice(c, m, n, ldc, "C")) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // alpha and beta are read now (host pointer mode), the matrices when the stream runs.
  const float alpha_v = *alpha, beta_v = *beta;
  cudaemu::Enqueue(handle->stream, [=] {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int l = 0; l < k; ++l) {
          const float av =
              ta ? a[l + static_cast<size_t>(i) * lda] : a[i + static_cast<size_t>(l) * lda];
          const float bv =
              tb ? b[j + static_cast<size_t>(l) * ldb] : b[l + static_cast<size_t>(j) * ldb];
          acc = std::fma(av, bv, acc);
        }
        float& out = c[i + static_cast<size_t>(j) * ldc];
        // beta == 0: C is not read (it may hold NaN), as cuBLAS specifies.
        out = beta_v == 0.0f ? alpha_v * acc : alpha_v * acc + beta_v * out;
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
