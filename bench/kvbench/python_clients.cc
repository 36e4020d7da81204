#include "bench/kvbench/python_clients.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {
namespace {

// One line from `f` without its newline; false at end of file.
bool ReadLine(FILE* f, std::string* line) {
  line->clear();
  char buf[65536];
  while (fgets(buf, sizeof buf, f) != nullptr) {
    line->append(buf);
    if (!line->empty() && line->back() == '\n') {
      line->pop_back();
      return true;
    }
  }
  return !line->empty();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PythonClients>> PythonClients::Start(const PythonClientsOptions& o,
                                                                    int n) {
  if (access(o.python.c_str(), X_OK) != 0 || access(o.script.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("the Python clients need ", o.python, " and ",
                                                      o.script, " (scripts/install-deps.sh)"));
  }
  std::unique_ptr<PythonClients> clients(new PythonClients());
  for (int c = 0; c < n; ++c) {
    // Made before fork: the child of a threaded process may only make async-signal-safe
    // calls before exec (no allocation, no setenv).
    std::vector<std::string> args = {
        o.python,      o.script,          "--target",  o.target,     "--config",
        o.config_file, "--keys-file",     o.keys_file, "--per-call", std::to_string(o.per_call),
        "--client",    std::to_string(c), "--api",     o.api};
    if (!o.shm_socket.empty()) args.insert(args.end(), {"--shm-socket", o.shm_socket});
    if (!o.native_fetch) args.push_back("--no-native-fetch");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string pythonpath = "PYTHONPATH=" + o.package_dir;
    std::vector<char*> envp = {pythonpath.data()};
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) envp.push_back(*e);
    envp.push_back(nullptr);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe");
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork");
    if (pid == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    clients->workers_.push_back({pid, fdopen(in[1], "w"), fdopen(out[0], "r")});
  }
  for (Worker& w : clients->workers_) {
    std::string line;
    if (!ReadLine(w.from, &line) || line != "ready") {
      return absl::FailedPreconditionError(
          absl::StrCat("a Python client did not start (PYTHONPATH=", o.package_dir,
                       "; needs python3-grpcio, python3-protobuf, python3-numpy, "
                       "python3-xxhash and the built stubs); it said \"",
                       line, "\""));
    }
  }
  return clients;
}

PythonClients::~PythonClients() {
  for (Worker& w : workers_) {
    if (w.to != nullptr) {
      std::fputs("quit\n", w.to);
      std::fclose(w.to);
    }
  }
  for (Worker& w : workers_) {
    int status = 0;
    if (w.pid > 0 && waitpid(w.pid, &status, 0) < 0) kill(w.pid, SIGKILL);
    if (w.from != nullptr) std::fclose(w.from);
  }
}

absl::StatusOr<Sample> PythonClients::Run(int n, double seconds, uint64_t bytes_per_call) {
  if (n > static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " Python clients asked of ", workers_.size(), " started"));
  }
  for (int c = 0; c < n; ++c) {
    std::fprintf(workers_[c].to, "run %.6f\n", seconds);
    std::fflush(workers_[c].to);
  }
  Sample s;
  for (int c = 0; c < n; ++c) {
    std::string line;
    if (!ReadLine(workers_[c].from, &line)) {
      return absl::InternalError(absl::StrCat("Python client ", c, " stopped during a run"));
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("calls")) {
      return absl::InternalError(absl::StrCat("Python client ", c, " answered \"", line, "\""));
    }
    s.seconds = std::max(s.seconds, j["seconds"].get<double>());
    s.bytes += j["calls"].get<uint64_t>() * bytes_per_call;
    for (double us : j["lat_us"]) s.lat_us.push_back(us);
  }
  return s;
}

}  // namespace kvc::bench
