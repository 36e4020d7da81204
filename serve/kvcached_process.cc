#include "serve/kvcached_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvc::serve {

KvcachedProcess::KvcachedProcess(std::string binary, std::string data_dir,
                                 std::vector<std::string> extra, int port)
    : binary_(std::move(binary)),
      dir_(std::move(data_dir)),
      extra_(std::move(extra)),
      port_(port) {}

KvcachedProcess::~KvcachedProcess() { Stop(SIGKILL); }

absl::Status KvcachedProcess::Start() {
  // Everything the child needs is made before fork: between fork and exec the child of a
  // threaded process may only make async-signal-safe calls — another thread may have held
  // the allocator's lock at the fork (under ASan a child allocating there hung for good).
  // The pipe and the log are close-on-exec, so no other child inherits them.
  std::vector<std::string> args = {binary_, "--data-dir", dir_, "--listen",
                                   absl::StrCat("127.0.0.1:", port_)};
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + ".log";
  const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    if (err >= 0) close(err);
    return absl::InternalError("pipe");
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);  // dup2's copies stay open across exec
    if (err >= 0) dup2(err, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (err >= 0) close(err);
  if (pid_ < 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("fork");
  }
  close(out[1]);
  out_ = fdopen(out[0], "r");
  char line[512] = {0};
  if (fgets(line, sizeof line, out_) == nullptr || strstr(line, "listening on ") == nullptr) {
    Stop(SIGKILL);
    return absl::UnavailableError(
        absl::StrCat("kvcached did not start (", binary_, "; its log: ", dir_, ".log)"));
  }
  const std::string l(line);
  address_ = l.substr(l.find("listening on ") + 13);
  address_ = address_.substr(0, address_.find(' '));
  return absl::OkStatus();
}

void KvcachedProcess::Stop(int sig) {
  if (pid_ <= 0) return;
  kill(pid_, sig);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (out_) fclose(out_);  // kept open until now so kvcached never gets SIGPIPE
  out_ = nullptr;
}

}  // namespace kvc::serve
