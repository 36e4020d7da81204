#include "client/arena_map.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "wire/arena_handshake.h"

namespace kvc::client {

absl::StatusOr<MappedArena> MapArena(const std::string& socket_path,
                                     const std::string& bearer_token) {
  KVC_ASSIGN_OR_RETURN(wire::ReceivedArena received,
                       wire::ReceiveArenaFd(socket_path, bearer_token));
  void* base = mmap(nullptr, received.bytes, PROT_READ, MAP_SHARED, received.fd, 0);
  const uint64_t id = wire::ArenaIdentity(received.fd);
  close(received.fd);  // the mapping keeps the memory alive
  if (base == MAP_FAILED)
    return absl::InternalError(absl::StrCat("mmap shared arena: ", strerror(errno)));
  return MappedArena{static_cast<const uint8_t*>(base), received.bytes, id};
}

void UnmapArena(const MappedArena& arena) {
  if (arena.base != nullptr) munmap(const_cast<uint8_t*>(arena.base), arena.bytes);
}

}  // namespace kvc::client
