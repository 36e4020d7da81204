// A free TCP port on the loopback interface, for the servers that programs and tests start
// next to themselves (kvcached, etcd, Redis): a socket bound to port 0, the port the kernel
// gave it read back, the socket closed. Another process may take the port before the
// caller binds it; the servers started this way fail naming the port when that happens
// (kvcached listens without gRPC's default SO_REUSEPORT for this reason).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kvc {

// The port, or 0 when no loopback socket could be bound.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace kvc
