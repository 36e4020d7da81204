// The daemon's side of the co-located fast path's handshake (wire/arena_handshake.h): a
// Unix socket (mode 0600) through which a client on the same machine gets a read-only fd
// of its tenant's RAM arena.
//
// Which arena a tenant gets (or none) is the server's `ArenaFor` rule; the daemon gives
// each tenant an arena holding its own chunks only (shm_access.h), sealed so that no
// client can write it (storage/ram_arena.h).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cachesvc/auth.h"

namespace kvc::cachesvc {

struct SharedArena {
  int fd = -1;  // not owned; stays open while the server runs
  uint64_t bytes = 0;
};

class ArenaSocketServer {
 public:
  // The arena a tenant may map, or an error whose message is sent back (PermissionDenied
  // and the like). Called on the server's thread.
  using ArenaFor = std::function<absl::StatusOr<SharedArena>(const std::string& tenant)>;
  ArenaSocketServer(const Authenticator* auth, ArenaFor arena_for)
      : auth_(auth), arena_for_(std::move(arena_for)) {}
  ~ArenaSocketServer();
  [[nodiscard]] absl::Status Start(const std::string& path);

 private:
  void Serve();
  void Answer(int conn);

  const Authenticator* auth_;
  ArenaFor arena_for_;
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kvc::cachesvc
