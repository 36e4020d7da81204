// A whole file's bytes, the one way the programs read an input file.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
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

// A credential kept in a file (a password, a shared secret): its text without trailing
// whitespace (the newline an editor or `echo` leaves). NotFound naming the path.
inline absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return std::string(absl::StripTrailingAsciiWhitespace(*text));
}

}  // namespace kvc
