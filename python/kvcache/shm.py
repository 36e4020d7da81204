"""The co-located path: the daemon hands this process its tenant's RAM arena over a Unix
socket (SCM_RIGHTS), the client maps it read-only, and FetchRefs says where leased chunks
are. The arena is sealed by the daemon: nothing here (or anywhere) can write it.

Protocol (wire/arena_handshake.h): send the bearer token and a newline; the answer is
"OK <bytes>\\n" with the fd attached, or "ERR <reason>\\n".
"""
import mmap
import os
import socket
from typing import Optional

from .errors import PermissionDeniedError, UnavailableError


def arena_identity(fd: int) -> int:
    """Which arena an fd is (device and inode of the memfd), as FetchRefs reports it."""
    st = os.fstat(fd)
    return ((st.st_dev << 40) ^ st.st_ino) & 0xFFFFFFFFFFFFFFFF


class MappedArena:
    """A read-only mapping of one arena; `view` is a memoryview over it."""

    def __init__(self, socket_path: str, token: Optional[str]) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(socket_path)
                conn.sendall((token or "").encode() + b"\n")
                text, fds, _, _ = socket.recv_fds(conn, 128, 1)
            except OSError as e:
                raise UnavailableError(f"shared arena {socket_path}: {e}") from e
        try:
            answer = text.decode(errors="replace").strip()
            if not answer.startswith("OK ") or not fds:
                raise PermissionDeniedError(f"shared arena refused: {answer or 'no answer'}")
            self.bytes = int(answer[3:])
            self.id = arena_identity(fds[0])
            self._map = mmap.mmap(fds[0], self.bytes, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ)
        finally:
            for fd in fds:
                os.close(fd)
        self.view = memoryview(self._map)

    VERDICT_PAGE_BYTES = 4096

    @property
    def verdict_offset(self) -> int:
        """Where the arena's verdict count would be (wire/arena_handshake.h): the start of
        its last page. A FetchRefs answer naming the same offset says the daemon keeps it."""
        return self.bytes - self.VERDICT_PAGE_BYTES if self.bytes >= self.VERDICT_PAGE_BYTES else 0

    def verdicts(self, offset: int) -> int:
        """The count of copies the daemon dropped from this arena as corrupt (an aligned
        8-byte read: whole, never torn, on the machines this runs on)."""
        if offset == 0 or offset + 8 > self.bytes:
            return 0
        return int.from_bytes(self.view[offset:offset + 8], "little")

    def close(self) -> None:
        self.view.release()
        self._map.close()
