#include "kernels/hbm_arena.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_status.h"

namespace kvc::cuda {
namespace {

bool HaveDevice(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return device >= 0 && device < count;
}

class CudaHbmArena final : public storage::DeviceArena {
 public:
  CudaHbmArena(int device, uint8_t* base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes), id_(std::random_device{}() | 1ull << 63) {}
  ~CudaHbmArena() override {
    cudaSetDevice(device_);
    cudaFree(base_);
  }
  uint64_t bytes() const override { return bytes_; }
  absl::Status Write(uint64_t offset, std::span<const uint8_t> host) override {
    if (offset + host.size() > bytes_) return absl::OutOfRangeError("write past the HBM arena");
    KVC_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device_), "select the HBM tier's GPU"));
    return FromCuda(cudaMemcpy(base_ + offset, host.data(), host.size(), cudaMemcpyHostToDevice),
                    "copy a chunk into HBM");
  }
  absl::Status Read(uint64_t offset, std::span<uint8_t> host) const override {
    if (offset + host.size() > bytes_) return absl::OutOfRangeError("read past the HBM arena");
    KVC_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device_), "select the HBM tier's GPU"));
    return FromCuda(cudaMemcpy(host.data(), base_ + offset, host.size(), cudaMemcpyDeviceToHost),
                    "copy a chunk out of HBM");
  }
  std::string ExportHandle() const override {
    cudaIpcMemHandle_t h{};
    cudaSetDevice(device_);
    if (cudaIpcGetMemHandle(&h, base_) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  }
  int device() const override { return device_; }
  uint64_t id() const override { return id_; }

 private:
  const int device_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t id_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<storage::DeviceArena>> MakeHbmArena(int device, uint64_t bytes) {
  if (!HaveDevice(device)) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device));
  }
  KVC_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "select the HBM tier's GPU"));
  uint8_t* base = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&base), bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes on CUDA device ", device));
  }
  return std::make_unique<CudaHbmArena>(device, base, bytes);
}

absl::StatusOr<std::unique_ptr<MappedHbmArena>> MappedHbmArena::Open(std::string_view handle,
                                                                     int device) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA IPC handle has ", sizeof(cudaIpcMemHandle_t), " bytes, got ", handle.size()));
  }
  if (!HaveDevice(device)) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device));
  }
  KVC_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "select the HBM tier's GPU"));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  std::unique_ptr<MappedHbmArena> m(new MappedHbmArena());
  m->device_ = device;
  void* p = nullptr;
  KVC_RETURN_IF_ERROR(FromCuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                               "map the HBM tier (cudaIpcOpenMemHandle)"));
  m->base_ = static_cast<uint8_t*>(p);
  return m;
}

MappedHbmArena::~MappedHbmArena() {
  if (base_ != nullptr) {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(base_);
  }
}

absl::Status MappedHbmArena::CopyToPages(std::span<const HbmChunk> chunks, DevicePages& pages,
                                         int64_t first) const {
  const uint64_t page_bytes = static_cast<uint64_t>(pages.layout().chunk_bytes);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].length != page_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " has ", chunks[i].length, " bytes; a page has ", page_bytes));
    }
    KVC_RETURN_IF_ERROR(
        pages.CopyPageFromDeviceAsync(first + static_cast<int64_t>(i), base_ + chunks[i].offset));
  }
  return absl::OkStatus();
}

absl::Status MappedHbmArena::CopyToHost(std::span<const HbmChunk> chunks,
                                        std::span<uint8_t> out) const {
  uint64_t total = 0;
  for (const HbmChunk& c : chunks) total += c.length;
  if (total != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(chunks.size(), " chunks hold ", total, " bytes; the buffer has ", out.size()));
  }
  KVC_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device_), "select the HBM tier's GPU"));
  uint8_t* at = out.data();
  for (const HbmChunk& c : chunks) {
    if (absl::Status s =
            FromCuda(cudaMemcpy(at, base_ + c.offset, c.length, cudaMemcpyDeviceToHost),
                     "copy a chunk out of the HBM tier");
        !s.ok())
      return s;
    at += c.length;
  }
  return absl::OkStatus();
}

}  // namespace kvc::cuda
