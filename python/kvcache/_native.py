"""The Fetch stream through libkvcache_fetch.so (client/fetch_c.cc), when it is beside the
package: each payload is copied once, from gRPC's receive buffers into the caller's buffer.
Through grpcio it is copied twice (into a `bytes` object first), which held the Python
client's fetch to ~0.6 x the C++ client's (docs/benchmarks.md).

The library is built with the C++ tree; without it (a wheel, a sanitizer build) fetches
go through grpcio, with the same checks and answers. KVCACHE_NATIVE_FETCH=0 turns it off
(for A/B); KVCACHE_NATIVE_FETCH_LIB names another path.
"""
import ctypes
import os
from typing import Any, List, Optional, Sequence, Tuple

from .errors import from_status
from .v1 import kvcache_pb2 as pb

_MESSAGE_ROOM = 1024


def _load() -> Optional[ctypes.CDLL]:
    if os.environ.get("KVCACHE_NATIVE_FETCH", "1") == "0":
        return None
    path = os.environ.get("KVCACHE_NATIVE_FETCH_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "libkvcache_fetch.so")
    try:
        lib = ctypes.CDLL(path)
        lib.kvc_fetch_open.restype = ctypes.c_void_p
        lib.kvc_fetch_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int32, ctypes.c_int32]
        lib.kvc_fetch_close.restype = None
        lib.kvc_fetch_close.argtypes = [ctypes.c_void_p]
        lib.kvc_fetch.restype = ctypes.c_uint64
        lib.kvc_fetch.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64,
            ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double,
            ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p, ctypes.c_uint64]
    except (OSError, AttributeError):
        return None
    return lib


_LIB = _load()


def available() -> bool:
    """Whether fetches can go through the native library."""
    return _LIB is not None


def address(view: memoryview) -> int:
    """The address of a writable byte view's first byte (the view stays exported while the
    call runs: the caller holds it)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class NativeFetch:
    """A channel of the library's to one kvcached, with the Python client's settings."""

    def __init__(self, target: str, token: Optional[str], service_config: str,
                 max_message: int, lookahead: int) -> None:
        assert _LIB is not None
        self._handle = _LIB.kvc_fetch_open(target.encode(), (token or "").encode(),
                                           service_config.encode(), max_message, lookahead)

    def close(self) -> None:
        if self._handle is not None and _LIB is not None:
            _LIB.kvc_fetch_close(self._handle)
            self._handle = None

    def fetch(self, request: bytes, keys: Sequence[bytes], chunk_bytes: int,
              layout: Tuple[List[int], List[int], List[int]], timeout_s: float,
              wait_for_ready: bool) -> Tuple[int, int, str]:
        """(leading chunks written, gRPC status code, its message). layout: each destination
        part's address and size, and where each chunk's parts end in those lists (a chunk
        is copied into its parts in order). The GIL is released while the stream runs."""
        assert _LIB is not None and self._handle is not None
        addrs, sizes, ends = layout
        code = ctypes.c_int32(0)
        message = ctypes.create_string_buffer(_MESSAGE_ROOM)
        got = _LIB.kvc_fetch(self._handle, request, len(request), b"".join(keys), len(keys),
                             chunk_bytes, (ctypes.c_uint64 * len(addrs))(*addrs),
                             (ctypes.c_uint64 * len(sizes))(*sizes),
                             (ctypes.c_uint64 * len(ends))(*ends), timeout_s,
                             1 if wait_for_ready else 0, ctypes.byref(code), message,
                             _MESSAGE_ROOM)
        return int(got), code.value, message.value.decode("utf-8", "replace")

    def stream_into(self, common: Any, ns: Any, keys: Sequence[bytes], start: int, sink: Any,
                    wait_for_ready: bool) -> int:
        """keys[start:] fetched into sink from chunk `start` on, as a client's grpcio stream
        would (`common`: the client, for its timeout and its rule on which NOT_FOUND only
        ends a fetch); how many arrived. Raises what that stream would raise."""
        rest = keys[start:]
        request = pb.FetchRequest(namespace_id=ns.id, chunk_keys=rest).SerializeToString()
        got, code, message = self.fetch(request, rest, ns.chunk_bytes,
                                        sink.layout(start, len(rest)), common.timeout_s,
                                        wait_for_ready)
        if code != 0:
            error = from_status(code, message)
            if not common.ends_fetch(error):
                raise error
        return got

    def __del__(self) -> Any:
        self.close()
