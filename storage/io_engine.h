// IoEngine: the one seam every SSD byte passes through.
//
// Implementations: io_uring (batched submission, registered buffers), POSIX pread/pwrite
// (the fallback where io_uring is unavailable, and the reference), and a fault-injecting
// wrapper for tests (fault_injection.h). An engine is used by one thread at a time; the
// SSD tier keeps a small pool of them ("lanes"), each with its own registered buffers.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvc::storage {

struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  uint64_t offset = 0;
  uint8_t* buf = nullptr;
  uint32_t len = 0;
  int buf_index = -1;  // index into the engine's registered buffers, -1 if not registered
  // Set by Execute: len on success, a short count at end of file, or -errno.
  int64_t result = 0;
};

// Called once per op as soon as that op is complete (its result set), possibly before
// other ops of the same Execute finish, on the thread that called Execute.
using IoDoneFn = std::function<void(size_t op_index)>;
// Called once per op right before it is first submitted: the caller fills the op's buffer
// just in time, so staging later ops overlaps the I/O of earlier ones. It may also set the
// op's buf and buf_index there: an engine reads them only after on_prepare. At most the
// engine's queue depth of ops (one for posix) are ever between their on_prepare and their
// on_done, so a caller with that many staging buffers can lend one in on_prepare and take
// it back in on_done, and pass more ops than buffers to one Execute. (An op may be reported
// done without having been prepared: a fault-injecting engine fails some before they reach
// the disk.)
using IoPrepareFn = std::function<void(size_t op_index)>;

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;
  // Registers fixed I/O buffers (they must outlive the engine). Optional: ops with
  // buf_index >= 0 then use them; engines without the notion ignore it.
  virtual absl::Status RegisterBuffers(std::span<const iovec> buffers) = 0;
  // Runs every op and waits for all of them; ops may run concurrently and in any order.
  // Short transfers are resumed with the offset advanced; EINTR and EAGAIN are retried.
  // on_prepare and on_done (either may be empty) let the caller stage and consume ops
  // while others are in flight.
  virtual void Execute(std::span<IoOp> ops, const IoPrepareFn& on_prepare,
                       const IoDoneFn& on_done) = 0;
  // Makes what was written to fd durable (fdatasync).
  [[nodiscard]] virtual absl::Status Sync(int fd) = 0;
};

enum class IoBackend { kAuto, kUring, kPosix };

std::unique_ptr<IoEngine> MakePosixIoEngine();
// Unavailable (with the reason) when the kernel or a sandbox refuses io_uring.
absl::StatusOr<std::unique_ptr<IoEngine>> MakeUringIoEngine(unsigned queue_depth);

}  // namespace kvc::storage
