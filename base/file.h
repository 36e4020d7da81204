// A whole file's bytes, the one way the programs read an input file; and a whole buffer
// written to a file descriptor.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

// Internal naming `what` and errno's text (for a failed system call).
inline absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

// Writes all of `bytes` at fd's offset, again after a short write or EINTR; Internal naming
// `path` otherwise.
inline absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("write " + path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// fsyncs the directory `dir`, so that the entries made or renamed in it last.
inline absl::Status SyncDirectory(const std::string& dir) {
  const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return ErrnoError("open " + dir);
  const int rc = fsync(d);
  close(d);
  return rc == 0 ? absl::OkStatus() : ErrnoError("fsync " + dir);
}

// Replaces `path` (in `dir`) with `bytes` as a whole or not at all: written to path.tmp
// (0600), synced, renamed over path, and the directory synced.
inline absl::Status ReplaceFileDurably(const std::string& dir, const std::string& path,
                                       std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open " + tmp);
  absl::Status w = WriteAll(fd, bytes, tmp);
  if (w.ok() && fsync(fd) != 0) w = ErrnoError("fsync " + tmp);
  close(fd);
  if (!w.ok()) return w;
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp);
  return SyncDirectory(dir);
}

}  // namespace kvc
