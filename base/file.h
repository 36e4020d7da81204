// A whole file's bytes, the one way the programs read an input file.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvc {

// NotFound naming the path when it cannot be opened.
inline absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open \"", path, "\""));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kvc
