// Safetensors files: a little-endian u64 header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw data. Read by mmap (no copy of the data);
// written tensor by tensor.
//
// Every malformed input (short file, header not JSON, ranges outside the data or
// overlapping, a shape that does not match the byte count, an unsupported dtype) is an
// InvalidArgument status naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::model {

struct TensorView {
  std::string dtype;  // "F32" or "BF16"
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
  int64_t elements() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The tensor as float32 values (BF16 widened), checked against `shape`.
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name,
                                             const std::vector<int64_t>& shape) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // written as F32
};

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

std::string ShapeString(const std::vector<int64_t>& shape);  // "[4, 256]"

}  // namespace kvc::model
