#include "storage/ram_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older libc headers lack the name
#endif

namespace kvc::storage {
namespace {

absl::Status Fail(int fd, const std::string& what) {
  const int err = errno;
  if (fd >= 0) close(fd);
  return absl::InternalError(absl::StrCat(what, ": ", strerror(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RamArena>> RamArena::Create(uint64_t slot_bytes, uint32_t slots,
                                                           const std::string& name, bool prefault) {
  const uint64_t bytes = slots == 0 ? 0 : slot_bytes * slots + kVerdictPageBytes;
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Fail(-1, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return Fail(fd, absl::StrCat("ftruncate RAM arena to ", bytes, " bytes"));
  void* base = nullptr;
  if (bytes > 0) {
    // The only writable mapping there will ever be: made before the seals go on.
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return Fail(fd, absl::StrCat("mmap RAM arena of ", bytes, " bytes"));
    // Best effort: a kernel before 5.14 says EINVAL and pages fault in on first use.
    if (prefault) (void)madvise(base, bytes, MADV_POPULATE_WRITE);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
      0) {
    if (base != nullptr) munmap(base, bytes);
    return Fail(fd, "sealing the RAM arena (F_SEAL_FUTURE_WRITE needs Linux 5.1)");
  }
  // A read-only open file description of the same memfd: what clients get. (They could
  // reopen it read-write through /proc, which is why the seals above are the real guard.)
  const std::string self = absl::StrCat("/proc/self/fd/", fd);
  const int ro = open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    if (base != nullptr) munmap(base, bytes);
    return Fail(fd, "reopening the RAM arena read-only via " + self);
  }
  return std::unique_ptr<RamArena>(
      new RamArena(fd, ro, static_cast<uint8_t*>(base), slot_bytes, slots));
}

RamArena::~RamArena() {
  if (base_ != nullptr) munmap(base_, bytes());
  close(read_only_fd_);
  close(fd_);
}

}  // namespace kvc::storage
