#include "wire/arena_handshake.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvc::wire {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

sockaddr_un UnixAddress(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  return a;
}

uint64_t ArenaIdentity(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return 0;
  return (static_cast<uint64_t>(st.st_dev) << 40) ^ static_cast<uint64_t>(st.st_ino);
}

bool ReadHandshakeLine(int fd, std::string* line) {
  char c;
  while (line->size() < 4096) {
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;  // a signal, not the client
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
  return false;
}

void SendHandshakeAnswer(int socket_fd, const std::string& text, int fd) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  (void)sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
}

HandshakeAnswer ReadHandshakeAnswer(int socket_fd) {
  char text[256] = {0};
  iovec iov{text, sizeof text - 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {  // a signal (a profiler's, a fuzzer's timer) must not read as "no answer"
    n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  HandshakeAnswer a;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      std::memcpy(&a.fd, CMSG_DATA(c), sizeof a.fd);
  }
  if (n > 0) a.text.assign(text, static_cast<size_t>(n));
  return a;
}

absl::StatusOr<ReceivedArena> ReceiveArenaFd(const std::string& socket_path,
                                             const std::string& bearer_token) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  const sockaddr_un a = UnixAddress(socket_path);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const absl::Status s =
        absl::UnavailableError(absl::StrCat("connect ", socket_path, ": ", strerror(errno)));
    close(fd);
    return s;
  }
  const std::string line = bearer_token + "\n";
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    close(fd);
    return Errno("write " + socket_path);
  }
  const HandshakeAnswer answer = ReadHandshakeAnswer(fd);
  close(fd);
  if (answer.text.empty()) {
    if (answer.fd >= 0) close(answer.fd);
    return absl::UnavailableError("no answer from " + socket_path);
  }
  const int arena_fd = answer.fd;
  const char* text = answer.text.c_str();
  unsigned long long bytes = 0;
  if (std::strncmp(text, "OK ", 3) != 0 || arena_fd < 0 ||
      std::sscanf(text + 3, "%llu", &bytes) != 1) {
    if (arena_fd >= 0) close(arena_fd);
    std::string reason(text);
    while (!reason.empty() && reason.back() == '\n') reason.pop_back();
    return absl::PermissionDeniedError(absl::StrCat("shared arena refused: ", reason));
  }
  return ReceivedArena{arena_fd, bytes};
}

}  // namespace kvc::wire
