// The co-located fast path's handshake, both halves: a Unix socket (mode 0600) through which
// a client on the same machine gets a read-only fd of its tenant's RAM arena (SCM_RIGHTS).
// Protocol: the client sends one line, its bearer token (may be empty); the server answers
// "OK <arena_bytes>\n" with the fd attached, or "ERR <reason>\n". The daemon's acceptor is
// cachesvc/arena_socket.h, the client's mapping client/arena_map.h.
//
// The arena: slots, then a verdict page of kVerdictPageBytes whose first 8 bytes are a
// little-endian count of the copies the daemon dropped from this arena as corrupt
// (storage/ram_arena.h). FetchRefsResponse.verdict_offset names it (arena_bytes −
// kVerdictPageBytes; 0 from a daemon without one).
#pragma once

#include <sys/un.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::wire {

inline constexpr uint64_t kVerdictPageBytes = 4096;

// The socket address of `path` (truncated to sun_path; callers check the length).
sockaddr_un UnixAddress(const std::string& path);

// Which arena an fd is (device and inode of the memfd): FetchRefs answers carry it, so a
// client never reads offsets of a new daemon's arena from an old daemon's mapping.
uint64_t ArenaIdentity(int fd);

// Server side: the client's token line (at most 4 KiB, without the newline); false if the
// client sent none.
bool ReadHandshakeLine(int socket_fd, std::string* line);
// Server side: `text` with `fd` attached (fd < 0: none).
void SendHandshakeAnswer(int socket_fd, const std::string& text, int fd);

// Client side: the server's answer on a connected socket, its text and the fd it carried
// (-1 if none; the caller closes it). Empty text if nothing came.
struct HandshakeAnswer {
  std::string text;
  int fd = -1;
};
HandshakeAnswer ReadHandshakeAnswer(int socket_fd);

// Client side, the whole handshake: the received fd (the caller closes it) and the arena's
// size. Unavailable if nobody answers, PermissionDenied with the server's reason if refused.
struct ReceivedArena {
  int fd = -1;
  uint64_t bytes = 0;
};
absl::StatusOr<ReceivedArena> ReceiveArenaFd(const std::string& socket_path,
                                             const std::string& bearer_token);

}  // namespace kvc::wire
