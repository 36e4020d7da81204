#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "storage/io_engine.h"

namespace kvc::storage {
namespace {

class PosixIoEngine final : public IoEngine {
 public:
  const char* name() const override { return "posix"; }
  absl::Status RegisterBuffers(std::span<const iovec>) override { return absl::OkStatus(); }

  void Execute(std::span<IoOp> ops, const IoPrepareFn& on_prepare,
               const IoDoneFn& on_done) override {
    for (IoOp& op : ops) {
      uint32_t done = 0;
      op.result = 0;
      if (on_prepare) on_prepare(static_cast<size_t>(&op - ops.data()));
      while (done < op.len) {
        const ssize_t n =
            op.kind == IoOp::Kind::kRead
                ? pread(op.fd, op.buf + done, op.len - done, static_cast<off_t>(op.offset + done))
                : pwrite(op.fd, op.buf + done, op.len - done, static_cast<off_t>(op.offset + done));
        if (n < 0) {
          if (errno == EINTR || errno == EAGAIN) continue;
          op.result = -errno;
          break;
        }
        if (n == 0) break;  // end of file: a short result
        done += static_cast<uint32_t>(n);
      }
      if (op.result == 0) op.result = done;
      if (on_done) on_done(static_cast<size_t>(&op - ops.data()));
    }
  }

  absl::Status Sync(int fd) override {
    while (fdatasync(fd) != 0) {
      if (errno != EINTR) return absl::InternalError(absl::StrCat("fdatasync: ", strerror(errno)));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<IoEngine> MakePosixIoEngine() { return std::make_unique<PosixIoEngine>(); }

}  // namespace kvc::storage
