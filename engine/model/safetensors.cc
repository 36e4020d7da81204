#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kvc::model {

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  struct stat st {};
  fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return bad("too short for a safetensors file");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return bad(absl::StrCat("mmap: ", strerror(errno)));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_bytes_ = size;
  const uint8_t* base = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > size - 8) return bad(absl::StrCat("header length ", header_len, " > file"));
  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_bytes = size - 8 - header_len;
  nlohmann::json header = nlohmann::json::parse(base + 8, base + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      if (!t.is_object()) return bad("__metadata__ is not an object");
      for (auto& [k, v] : t.items()) {
        if (v.is_string()) f->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets") || !t["dtype"].is_string() || !t["shape"].is_array() ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor \"", name, "\" lacks dtype, shape or data_offsets"));
    }
    TensorView v;
    v.dtype = t["dtype"].get<std::string>();
    const int64_t width = v.dtype == "F32" ? 4 : v.dtype == "BF16" ? 2 : 0;
    if (width == 0) {
      return bad(
          absl::StrCat("tensor \"", name, "\" has dtype ", v.dtype, "; supported: F32, BF16"));
    }
    for (auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return bad(absl::StrCat("tensor \"", name, "\" has a bad shape"));
      v.shape.push_back(d.get<int64_t>());
    }
    if (!t["data_offsets"][0].is_number_unsigned() || !t["data_offsets"][1].is_number_unsigned())
      return bad(absl::StrCat("tensor \"", name, "\" has bad data_offsets"));
    const uint64_t b = t["data_offsets"][0].get<uint64_t>(),
                   e = t["data_offsets"][1].get<uint64_t>();
    if (b > e || e > data_bytes) {
      return bad(absl::StrCat("tensor \"", name, "\" bytes [", b, ", ", e,
                              ") fall outside the data (", data_bytes, " bytes)"));
    }
    if (static_cast<uint64_t>(v.elements() * width) != e - b) {
      return bad(absl::StrCat("tensor \"", name, "\" shape ", ShapeString(v.shape), " needs ",
                              v.elements() * width, " bytes, has ", e - b));
    }
    v.bytes = std::span<const uint8_t>(data + b, e - b);
    ranges.push_back({b, e});
    f->tensors_.emplace(name, std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad("tensor byte ranges overlap");
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(
    const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", name, "\" is missing (expected shape ", ShapeString(shape), ")"));
  }
  const TensorView& v = it->second;
  if (v.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", name, "\" has shape ",
                                                   ShapeString(v.shape), "; the config needs ",
                                                   ShapeString(shape)));
  }
  std::vector<float> out(v.elements());
  if (v.dtype == "F32") {
    std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
  } else {
    for (int64_t i = 0; i < v.elements(); ++i) {
      uint16_t h;
      std::memcpy(&h, v.bytes.data() + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      std::memcpy(&out[i], &u, 4);
    }
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const uint64_t bytes = t.values.size() * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keeps the data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const NamedTensor& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.values.data()),
              static_cast<std::streamsize>(t.values.size() * 4));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace kvc::model
