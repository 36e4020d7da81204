// libFuzzer target: the shared-memory handshake (cachesvc/arena_socket.h) as a hostile
// local process speaks it. A real ArenaSocketServer on a Unix socket, with two tenants'
// tokens ("a" may map its arena, "b" may not); each input is sent as the client's bytes.
// Whatever they are, the server answers, and it hands out an fd only when the first line
// is exactly tenant a's token — that fd is read-only and the arena's size; then a proper
// handshake still works (the server survived).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "base/check.h"
#include "cachesvc/arena_socket.h"
#include "wire/arena_handshake.h"

namespace {

constexpr char kTokenA[] = "fuzz-token-a";
constexpr char kTokenB[] = "fuzz-token-b";
constexpr uint64_t kArenaBytes = 8192;

struct Fixture {
  std::string dir, socket;
  int arena_fd = -1, arena_ro = -1;
  kvc::cachesvc::Authenticator auth;
  std::unique_ptr<kvc::cachesvc::ArenaSocketServer> server;

  Fixture() {
    char tmpl[] = "/tmp/kvc-shm-fuzz-XXXXXX";
    dir = mkdtemp(tmpl);
    socket = dir + "/s.sock";
    std::ofstream(dir + "/tokens") << kTokenA << " a\n" << kTokenB << " b\n";
    absl::StatusOr<kvc::cachesvc::Authenticator> a =
        kvc::cachesvc::Authenticator::FromFile(dir + "/tokens");
    KVC_CHECK(a.ok()) << a.status();
    auth = *std::move(a);
    arena_fd = memfd_create("fuzz-arena", MFD_CLOEXEC);
    KVC_CHECK(arena_fd >= 0 && ftruncate(arena_fd, kArenaBytes) == 0);
    arena_ro = open(("/proc/self/fd/" + std::to_string(arena_fd)).c_str(), O_RDONLY | O_CLOEXEC);
    KVC_CHECK(arena_ro >= 0);
    server = std::make_unique<kvc::cachesvc::ArenaSocketServer>(
        &auth, [this](const std::string& tenant) -> absl::StatusOr<kvc::cachesvc::SharedArena> {
          if (tenant != "a") return absl::PermissionDeniedError("tenant has no shared memory");
          return kvc::cachesvc::SharedArena{arena_ro, kArenaBytes};
        });
    KVC_CHECK(server->Start(socket).ok());
  }
};

Fixture& Get() {
  static Fixture* f = new Fixture();  // lives for the whole run
  return *f;
}

// Sends raw bytes as the client and returns the answer's text and fd (-1 if none).
std::string Exchange(const std::string& path, const uint8_t* data, size_t size, int* fd_out) {
  *fd_out = -1;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  KVC_CHECK(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  KVC_CHECK(connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  for (size_t at = 0; at < size;) {
    const ssize_t n = send(fd, data + at, size - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // libFuzzer's timer signal
    if (n <= 0) break;                      // the server answered and closed after a line
    at += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  kvc::wire::HandshakeAnswer answer = kvc::wire::ReadHandshakeAnswer(fd);
  close(fd);
  *fd_out = answer.fd;
  return answer.text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = Get();
  int fd = -1;
  const std::string answer = Exchange(f.socket, data, size, &fd);
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const bool is_a = nl != std::string::npos && nl <= 4096 && input.substr(0, nl) == kTokenA;
  KVC_CHECK(!answer.empty()) << "the server did not answer";
  if (answer.rfind("OK ", 0) == 0) {
    KVC_CHECK(is_a) << "an fd for a first line that is not tenant a's token";
    KVC_CHECK(fd >= 0) << "OK without an fd";
    KVC_CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY) << "the arena fd is writable";
    struct stat st {};
    KVC_CHECK(fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == kArenaBytes);
    KVC_CHECK(answer == "OK " + std::to_string(kArenaBytes) + "\n") << answer;
  } else {
    KVC_CHECK(answer.rfind("ERR ", 0) == 0) << "neither OK nor ERR: " << answer;
    KVC_CHECK(fd < 0) << "an fd with a refusal";
    KVC_CHECK(!is_a) << "tenant a's token was refused: " << answer;
  }
  if (fd >= 0) close(fd);
  // The server still serves a proper handshake.
  const std::string good = std::string(kTokenA) + "\n";
  const std::string again =
      Exchange(f.socket, reinterpret_cast<const uint8_t*>(good.data()), good.size(), &fd);
  KVC_CHECK(again.rfind("OK ", 0) == 0 && fd >= 0) << "the server stopped serving: " << again;
  close(fd);
  return 0;
}
