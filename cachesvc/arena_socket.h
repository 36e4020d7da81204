// The co-located fast path's handshake: a Unix socket (mode 0600) through which a client
// on the same machine gets a read-only fd of its tenant's RAM arena (SCM_RIGHTS) and maps
// it read-only. Protocol: the client sends one line, its bearer token (may be empty); the
// server answers "OK <arena_bytes>\n" with the fd attached, or "ERR <reason>\n".
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

// Client side: connects, authenticates, receives the fd and maps the arena read-only.
struct MappedArena {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t id = 0;  // ArenaIdentity of the mapped memfd
};
// Which arena an fd is (device and inode of the memfd): FetchRefs answers carry it, so a
// client never reads offsets of a new daemon's arena from an old daemon's mapping.
uint64_t ArenaIdentity(int fd);
// The server's answer on a connected socket: its text and the fd it carried (-1 if none;
// the caller closes it). Empty text if nothing came.
struct HandshakeAnswer {
  std::string text;
  int fd = -1;
};
HandshakeAnswer ReadHandshakeAnswer(int socket_fd);
// The handshake alone: the received fd (the caller closes it) and the arena's size.
// Unavailable if nobody answers, PermissionDenied with the server's reason if refused.
struct ReceivedArena {
  int fd = -1;
  uint64_t bytes = 0;
};
absl::StatusOr<ReceivedArena> ReceiveArenaFd(const std::string& socket_path,
                                             const std::string& bearer_token);
// The handshake, then a read-only shared mapping of the arena.
absl::StatusOr<MappedArena> MapArena(const std::string& socket_path,
                                     const std::string& bearer_token);
void UnmapArena(const MappedArena& arena);

}  // namespace kvc::cachesvc
