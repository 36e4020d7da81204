#include "kernels/device_pages.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_status.h"
#include "kernels/kv_dequant.h"

namespace kvc::cuda {

absl::StatusOr<std::unique_ptr<DevicePages>> DevicePages::Create(const ChunkLayout& layout,
                                                                 int64_t capacity_chunks) {
  if (capacity_chunks <= 0) return absl::InvalidArgumentError("capacity must be positive");
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  std::unique_ptr<DevicePages> p(new DevicePages(layout, capacity_chunks));
  const size_t bytes = static_cast<size_t>(capacity_chunks * layout.chunk_bytes);
  if (cudaMalloc(reinterpret_cast<void**>(&p->pages_), bytes) != cudaSuccess) {
    cudaGetLastError();
    p->pages_ = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes of device memory for ", capacity_chunks, " pages"));
  }
  cudaStream_t s = nullptr;
  KVC_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"));
  p->stream_ = s;
  return p;
}

DevicePages::~DevicePages() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (pages_ != nullptr) cudaFree(pages_);
}

absl::Status DevicePages::UploadAsync(int64_t first, std::span<const uint8_t> host) {
  const int64_t bytes = static_cast<int64_t>(host.size());
  if (bytes % layout_.chunk_bytes != 0 || first < 0 ||
      first + bytes / layout_.chunk_bytes > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("upload of ", bytes, " bytes at page ", first,
                                                   " does not fit ", capacity_, " pages of ",
                                                   layout_.chunk_bytes, " bytes"));
  }
  return FromCuda(cudaMemcpyAsync(pages_ + first * layout_.chunk_bytes, host.data(), host.size(),
                                  cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)),
                  "upload");
}

absl::Status DevicePages::CopyPageFromDeviceAsync(int64_t page, const uint8_t* device_src) {
  if (page < 0 || page >= capacity_ || device_src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", page, " is outside ", capacity_, " pages"));
  }
  return FromCuda(cudaMemcpyAsync(pages_ + page * layout_.chunk_bytes, device_src,
                                  static_cast<size_t>(layout_.chunk_bytes),
                                  cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream_)),
                  "device-to-device page copy");
}

absl::Status DevicePages::Synchronize() {
  return FromCuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "synchronize");
}

absl::Status DevicePages::Download(int64_t first, std::span<uint8_t> host) const {
  const int64_t bytes = static_cast<int64_t>(host.size());
  if (bytes % layout_.chunk_bytes != 0 || first < 0 ||
      first + bytes / layout_.chunk_bytes > capacity_) {
    return absl::InvalidArgumentError("download does not fit the pages");
  }
  return FromCuda(cudaMemcpy(host.data(), pages_ + first * layout_.chunk_bytes, host.size(),
                             cudaMemcpyDeviceToHost),
                  "download");
}

absl::Status DevicePages::RegisterHost(std::span<const uint8_t> host) {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  return FromCuda(
      cudaHostRegister(const_cast<uint8_t*>(host.data()), host.size(), cudaHostRegisterReadOnly),
      "register host memory");
}

void DevicePages::UnregisterHost(std::span<const uint8_t> host) {
  cudaHostUnregister(const_cast<uint8_t*>(host.data()));
}

}  // namespace kvc::cuda
