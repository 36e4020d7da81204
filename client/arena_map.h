// A client's read-only mapping of its tenant's RAM arena in a co-located kvcached, got
// through the handshake of wire/arena_handshake.h.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::client {

struct MappedArena {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t id = 0;  // wire::ArenaIdentity of the mapped memfd
};
// The handshake, then a read-only shared mapping of the arena.
absl::StatusOr<MappedArena> MapArena(const std::string& socket_path,
                                     const std::string& bearer_token);
void UnmapArena(const MappedArena& arena);

}  // namespace kvc::client
