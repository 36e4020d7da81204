// Runs a program and captures its exit code, stdout and stderr (for CLI tests).
#pragma once

#include <string>
#include <vector>

namespace kvc::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 if it did not exit normally
  std::string out;
  std::string err;
};

// Runs `program` with `args` (no shell), waits for it, returns what it printed.
ProcessResult RunProgram(const std::string& program, const std::vector<std::string>& args);

// A fresh empty directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kvc::testing
