// The co-located fast path's handshake: a Unix socket (mode 0600) through which a client
// on the same machine gets the RAM arena's memfd (SCM_RIGHTS) and maps it read-only.
// Protocol: the client sends one line, its bearer token (may be empty); the server
// answers "OK <arena_bytes>\n" with the fd attached, or "ERR <reason>\n".
//
// The arena holds every tenant's chunks, so only tenants trusted with all of them may
// map it: with authentication on, `allowed_tenants` names them (empty: nobody).
#pragma once

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cachesvc/auth.h"

namespace kvc::cachesvc {

class ArenaSocketServer {
 public:
  ArenaSocketServer(const Authenticator* auth, std::set<std::string> allowed_tenants, int arena_fd,
                    uint64_t arena_bytes)
      : auth_(auth),
        allowed_(std::move(allowed_tenants)),
        arena_fd_(arena_fd),
        arena_bytes_(arena_bytes) {}
  ~ArenaSocketServer();
  [[nodiscard]] absl::Status Start(const std::string& path);

 private:
  void Serve();
  void Answer(int conn);

  const Authenticator* auth_;
  std::set<std::string> allowed_;
  int arena_fd_;
  uint64_t arena_bytes_;
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Client side: connects, authenticates, receives the fd and maps the arena read-only.
struct MappedArena {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t id = 0;  // ArenaIdentity of the mapped memfd
};
// Which arena an fd is (device and inode of the memfd): FetchRefs answers carry it, so a
// client never reads offsets of a new daemon's arena from an old daemon's mapping.
uint64_t ArenaIdentity(int fd);
absl::StatusOr<MappedArena> MapArena(const std::string& socket_path,
                                     const std::string& bearer_token);
void UnmapArena(const MappedArena& arena);

}  // namespace kvc::cachesvc
