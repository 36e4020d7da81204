#include "cachesvc/arena_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/arena_handshake.h"

namespace kvc::cachesvc {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

}  // namespace

ArenaSocketServer::~ArenaSocketServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (!path_.empty()) unlink(path_.c_str());
}

absl::Status ArenaSocketServer::Start(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return absl::InvalidArgumentError("socket path too long: " + path);
  unlink(path.c_str());  // a stale socket from a previous run
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Errno("socket");
  const sockaddr_un a = wire::UnixAddress(path);
  if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return Errno("bind " + path);
  chmod(path.c_str(), 0600);
  if (listen(listen_fd_, 16) != 0) return Errno("listen " + path);
  path_ = path;
  thread_ = std::thread([this] { Serve(); });
  return absl::OkStatus();
}

void ArenaSocketServer::Serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    timeval timeout{2, 0};  // a silent client cannot hold the acceptor
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    Answer(conn);
    close(conn);
  }
}

void ArenaSocketServer::Answer(int conn) {
  std::string token;
  auto reply = [&](const std::string& text, int fd) { wire::SendHandshakeAnswer(conn, text, fd); };
  if (!wire::ReadHandshakeLine(conn, &token)) return reply("ERR expected a token line\n", -1);
  absl::StatusOr<std::string> tenant = auth_->TenantFor("Bearer " + token);
  if (!tenant.ok()) return reply("ERR unknown bearer token\n", -1);
  absl::StatusOr<SharedArena> arena = arena_for_(*tenant);
  if (!arena.ok()) return reply(absl::StrCat("ERR ", arena.status().message(), "\n"), -1);
  reply(absl::StrCat("OK ", arena->bytes, "\n"), arena->fd);
}

}  // namespace kvc::cachesvc
