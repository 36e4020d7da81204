#include "storage/ram_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvc::storage {

absl::StatusOr<std::unique_ptr<RamArena>> RamArena::Create(uint64_t slot_bytes, uint32_t slots) {
  const uint64_t bytes = slot_bytes * slots;
  const int fd = memfd_create("kvcache-ram-tier", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("ftruncate RAM arena to ", bytes, " bytes: ", strerror(err)));
  }
  void* base = nullptr;
  if (bytes > 0) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return absl::InternalError(
          absl::StrCat("mmap RAM arena of ", bytes, " bytes: ", strerror(err)));
    }
  }
  return std::unique_ptr<RamArena>(
      new RamArena(fd, static_cast<uint8_t*>(base), slot_bytes, slots));
}

RamArena::~RamArena() {
  if (base_ != nullptr) munmap(base_, slot_bytes_ * slots_);
  close(fd_);
}

}  // namespace kvc::storage
