"""What the blocking and the asyncio clients share: argument checks, request building,
answer checking and the copies out of the shared arena. No I/O here."""
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import xxhash

from . import _allocator, _native, _wire
from .errors import DataLossError, InvalidArgumentError, KvcacheError, NotFoundError
from .hashing import Namespace, Tokens, as_tokens, caller_chunk_keys, chunk_keys
from .shm import MappedArena
from .v1 import kvcache_pb2 as pb

_TIERS = {pb.TIER_NONE: "none", pb.TIER_HBM: "hbm", pb.TIER_RAM: "ram", pb.TIER_SSD: "ssd",
          pb.TIER_RADOS: "rados"}
MAX_MESSAGE = 256 << 20
LOOKAHEAD_BYTES = 8 << 20  # HTTP/2's window per stream: room for several chunks
# A call that meets a connection the daemon just dropped (a restart) is retried: every
# call of the API is idempotent (a stored chunk is already_present the second time).
RETRY_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "kvcache.v1.KVCache"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
                   ("grpc.max_send_message_length", MAX_MESSAGE),
                   ("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES),
                   ("grpc.enable_retries", 1),
                   # After a failed connection attempt, ask again after 20 ms, never over 1 s
                   # apart (gRPC: 1 s growing to 2 min; client/channel_args.h says why).
                   ("grpc.initial_reconnect_backoff_ms", 20),
                   ("grpc.max_reconnect_backoff_ms", 1000),
                   # A connection per client, not one per process and daemon (client/client.cc).
                   ("grpc.use_local_subchannel_pool", 1),
                   ("grpc.service_config", RETRY_SERVICE_CONFIG)]
FETCH_METHOD = "/kvcache.v1.KVCache/Fetch"
STORE_METHOD = "/kvcache.v1.KVCache/Store"


@dataclass(frozen=True)
class Match:
    """A Lookup answer: the keys of every whole chunk, how many leading ones are cached,
    and the tier of each of those ("hbm", "ram", "ssd", "rados")."""
    matched_chunks: int
    keys: List[bytes]
    tiers: List[str]
    chunk_tokens: int

    @property
    def matched_tokens(self) -> int:
        return self.matched_chunks * self.chunk_tokens

    @property
    def matched_keys(self) -> List[bytes]:
        return self.keys[:self.matched_chunks]


@dataclass
class Fetched:
    """A fetch: `chunks` leading chunks are in `buffer` (the caller's `out`, or a new
    bytearray), `shm_chunks` of them copied from the shared arena."""
    chunks: int
    buffer: object
    chunk_bytes: int
    shm_chunks: int = 0

    @property
    def nbytes(self) -> int:
        return self.chunks * self.chunk_bytes


@dataclass(frozen=True)
class StoreResult:
    """What a store did: chunks newly stored and already present, the keys of every whole
    chunk, and `tokens`: how many of the given tokens those chunks cover (a partial last
    chunk is not stored; store it once it is whole, with the last key as its parent)."""
    stored: int
    already_present: int
    keys: List[bytes] = field(default_factory=list)
    tokens: int = 0


key_bytes = _wire.key_bytes


def refuse_caller_keyed(ns: Namespace, call: str) -> None:
    if ns.caller_keys:
        raise InvalidArgumentError(
            f"namespace {ns.id} is caller-keyed: {call} does not apply; use caller_keys(ns, keys) "
            "with lookup_keys, store_keys, fetch")


def check_keys(keys: Any) -> List[bytes]:
    """`keys` as a list of 16-byte bytes, or InvalidArgumentError naming the first bad one.
    Keys that are already 16-byte bytes (what chunk_keys gives) are checked by two C-level
    passes instead of a Python call per key (a 1M-token prefix: 3,906 keys)."""
    if not isinstance(keys, (str, bytes, bytearray, memoryview)):
        keys = list(keys)
        if set(map(type, keys)) <= {bytes} and set(map(len, keys)) <= {16}:
            return cast(List[bytes], keys)
    return [key_bytes(k, f"keys[{i}]") for i, k in enumerate(keys)]


def byte_view(obj: Any, what: str) -> memoryview:
    """`obj` as a flat byte memoryview, without a copy; InvalidArgumentError naming `what`
    for an object without the buffer protocol or with gaps in its memory."""
    try:
        view = memoryview(obj)
    except TypeError as e:
        raise InvalidArgumentError(f"{what} ({type(obj).__name__}) has no buffer protocol") from e
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{what} must be C-contiguous")
    if view.nbytes == 0:
        return memoryview(bytearray(0)) if not view.readonly else memoryview(b"")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def writable_view(out: Any, need_bytes: int) -> memoryview:
    """`out` as a flat writable byte view of at least need_bytes, without a copy."""
    view = byte_view(out, "out")
    if view.readonly:
        raise InvalidArgumentError("out is read-only")
    if view.nbytes < need_bytes:
        raise InvalidArgumentError(
            f"out holds {view.nbytes} bytes; the chunks asked for need {need_bytes}")
    return view


class ChunkSink:
    """Where fetched chunks go: chunk i into `out` at i × chunk_bytes (one buffer), or
    into its own list of parts (a page split over several buffers, e.g. K and V): each
    chunk is copied once, from the shared arena or the gRPC message, straight to its
    place."""

    def __init__(self, chunk_bytes: int, view: Optional[memoryview] = None,
                 parts: Optional[List[List[memoryview]]] = None) -> None:
        self.n = chunk_bytes
        # One of the two: the flat view (unused, empty, when there are parts) or the parts.
        self._view: memoryview = view if view is not None else memoryview(b"")
        self._parts = parts
        self.chunks = len(parts) if parts is not None else (
            view.nbytes // chunk_bytes if view is not None and chunk_bytes else 0)

    def put(self, i: int, src: Any) -> None:
        if self._parts is None:
            self._view[i * self.n:(i + 1) * self.n] = src
            return
        at = 0
        for p in self._parts[i]:
            p[:] = src[at:at + p.nbytes]
            at += p.nbytes

    def layout(self, start: int, count: int) -> Tuple[List[int], List[int], List[int]]:
        """Where chunks start .. start+count-1 go, for the native fetch: (each part's
        address, each part's size, the end of each chunk's parts in those lists)."""
        if self._parts is None:
            base = _native.address(self._view)
            return ([base + (start + i) * self.n for i in range(count)], [self.n] * count,
                    list(range(1, count + 1)))
        addrs, sizes, ends = [], [], []
        for parts in self._parts[start:start + count]:
            for p in parts:
                if p.nbytes:
                    addrs.append(_native.address(p))
                    sizes.append(p.nbytes)
            ends.append(len(addrs))
        return addrs, sizes, ends

    def dest(self, i: int) -> Any:
        """Chunk i's destination: a view of chunk_bytes, or its list of parts."""
        if self._parts is None:
            return self._view[i * self.n:(i + 1) * self.n]
        return self._parts[i]

    def digest(self, i: int) -> int:
        """XXH3-64 of chunk i as it now lies in the destination."""
        if self._parts is None:
            return xxhash.xxh3_64_intdigest(self._view[i * self.n:(i + 1) * self.n])
        h = xxhash.xxh3_64()
        for p in self._parts[i]:
            h.update(p)
        return h.intdigest()


def _flat_view(obj: Any, what: str) -> memoryview:
    # Flat byte views (what an engine adapter passes, per page part) are taken as they are.
    if type(obj) is memoryview and obj.ndim == 1 and obj.format == "B":
        return obj
    return byte_view(obj, what)


def scatter_sink(ns: Namespace, dsts: Sequence[Any], chunks: int) -> "ChunkSink":
    """A ChunkSink over dsts: one writable buffer per chunk, or per chunk a list of
    writable buffers whose sizes add up to chunk_bytes. InvalidArgumentError naming the
    destination of the wrong size."""
    if len(dsts) != chunks:
        raise InvalidArgumentError(f"{len(dsts)} destinations for {chunks} chunks")
    parts = []
    for i, d in enumerate(dsts):
        views = ([_flat_view(p, f"destination {i} part {j}") for j, p in enumerate(d)]
                 if isinstance(d, (list, tuple)) else [_flat_view(d, f"destination {i}")])
        if any(v.readonly for v in views):
            raise InvalidArgumentError(f"destination {i} is read-only")
        total = sum(v.nbytes for v in views)
        if total != ns.chunk_bytes:
            raise InvalidArgumentError(
                f"destination {i} is {total} bytes; a chunk of this namespace is {ns.chunk_bytes}")
        parts.append(views)
    return ChunkSink(ns.chunk_bytes, parts=parts)


def sink_for(ns: Namespace, dsts: Any, chunks: int) -> ChunkSink:
    """fetch_scattered's destinations as a ChunkSink: one given ready-made (checked for its
    size only), or one made from the buffers (scatter_sink)."""
    sink = dsts if isinstance(dsts, ChunkSink) else scatter_sink(ns, dsts, chunks)
    if sink.chunks != chunks or sink.n != ns.chunk_bytes:
        raise InvalidArgumentError(f"destinations for {sink.chunks} chunks of {sink.n} bytes; "
                                   f"asked {chunks} of {ns.chunk_bytes}")
    return sink


def chunk_payloads(ns: Namespace, payloads: Any, chunks: int) -> List[Any]:
    """Per-chunk byte views of `payloads`: one buffer of chunks × chunk_bytes, or a
    sequence of chunk-sized buffers. InvalidArgumentError naming the wrong size."""
    if isinstance(payloads, (list, tuple)):
        if len(payloads) != chunks:
            raise InvalidArgumentError(f"{len(payloads)} payloads for {chunks} whole chunks")
        # A payload may itself be a list of parts (a page over several buffers), joined
        # into the request message as it is written (the one copy a store makes).
        views: List[Any] = [[byte_view(q, f"payloads[{i}][{j}]") for j, q in enumerate(p)]
                 if isinstance(p, (list, tuple)) else byte_view(p, f"payloads[{i}]")
                 for i, p in enumerate(payloads)]
        for i, v in enumerate(views):
            size = sum(q.nbytes for q in v) if isinstance(v, list) else v.nbytes
            if size != ns.chunk_bytes:
                raise InvalidArgumentError(
                    f"payloads[{i}] is {size} bytes; namespace {ns.id} expects {ns.chunk_bytes}")
        return views
    view = byte_view(payloads, "payloads")
    if view.nbytes != chunks * ns.chunk_bytes:
        raise InvalidArgumentError(
            f"payloads are {view.nbytes} bytes; {chunks} chunks of namespace {ns.id} are "
            f"{chunks * ns.chunk_bytes}")
    return [view[i * ns.chunk_bytes:(i + 1) * ns.chunk_bytes] for i in range(chunks)]


class Common:
    """State and pure logic of a client; subclasses make the calls."""

    def __init__(self, target: str, token: Optional[str] = None, timeout_s: float = 30.0,
                 shm_socket: Optional[str] = None, lease_ms: int = 10000,
                 lease_cache: bool = True, max_held_chunks: int = 1024,
                 native_fetch: bool = True) -> None:
        if not target:
            raise InvalidArgumentError("target is empty (HOST:PORT or unix:PATH)")
        if target.startswith("etcd://"):
            raise InvalidArgumentError(
                f"target {target}: AsyncClient talks to one kvcached (HOST:PORT or unix:PATH); "
                "for a cluster use kvcache.connect(\"etcd://...\"), a ClusterClient")
        self.target = target
        self.timeout_s = timeout_s
        self.lease_ms = lease_ms
        # Chunk-sized buffers from the heap, not a fresh mmap each (see _allocator).
        self.heap_kept = _allocator.keep_large_buffers()
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # The native library's Fetch channel (connects on its first call), or None.
        self._native = self._open_native(native_fetch)
        self._shm_socket = shm_socket if shm_socket is not None else os.environ.get(
            "KVCACHE_SHM_SOCKET", "")
        self._arena: Optional[MappedArena] = None
        self.shm_error = ""
        self._pending_release: List[int] = []
        # The lease cache: chunks leased by earlier fetches stay readable until a quarter
        # of their lease is left, so fetching them again is a copy with no call at all.
        self._lease_cache = lease_cache
        self._max_held = max_held_chunks
        self._held_refs: Dict[bytes, Tuple[int, int, int]] = {}  # key -> (lease, offset, checksum)
        # lease id -> [usable until (monotonic s), chunks held, verdict count, its offset]
        self._held_leases: Dict[int, List[Any]] = {}
        self.refs_verdicts = 0  # the arena's verdict count read before the last FetchRefs
        if self._shm_socket:
            self._map_arena()
        else:
            self.shm_error = "no shared-memory socket given (shm_socket or $KVCACHE_SHM_SOCKET)"

    # ---- the native fetch ----
    def _open_native(self, wanted: bool) -> Optional["_native.NativeFetch"]:
        """The native library's Fetch channel with this client's settings (_native.py), or
        None when not wanted or the library is absent."""
        if not wanted or not _native.available():
            return None
        return _native.NativeFetch(self.target, self._token, RETRY_SERVICE_CONFIG, MAX_MESSAGE,
                                   LOOKAHEAD_BYTES)

    @property
    def native_fetch(self) -> bool:
        """Whether fetches stream through the native library (else through grpcio)."""
        return self._native is not None

    # ---- shared memory ----
    @property
    def shared_memory(self) -> bool:
        return self._arena is not None

    def _map_arena(self) -> None:
        try:
            self._arena = MappedArena(self._shm_socket, self._token)
            self.shm_error = ""
        except KvcacheError as e:
            self._arena = None
            self.shm_error = e.message

    def _drop_arena(self, why: str) -> None:
        if self._arena is not None:
            self._arena.close()
        self._arena = None
        self._held_refs.clear()
        self._held_leases.clear()
        self.shm_error = why

    def copy_from_held(self, ns: Namespace, keys: List[bytes], sink: ChunkSink) -> bool:
        """Copies every key from held leases (all or nothing), each copy checked against the
        chunk's checksum; False if one is missing, its lease is about to end, or its copy
        does not verify (the daemon's RAM scrub may have found it corrupt since: that chunk
        is no longer held, and the next call asks the daemon)."""
        if not self._lease_cache:
            return False
        now = time.monotonic()
        arena = self._arena
        assert arena is not None
        held_refs = []
        for k in keys:
            held = self._held_refs.get(k)
            if held is None:
                return False
            until, _, verdicts, verdict_offset = self._held_leases[held[0]]
            if until <= now:
                return False
            if verdict_offset and arena.verdicts(verdict_offset) != verdicts:
                # A copy in this arena was found corrupt since the lease: perhaps one of
                # ours. Give up every held lease; the daemon's answer decides.
                self._pending_release.extend(self._held_leases)
                self._held_leases.clear()
                self._held_refs.clear()
                return False
            held_refs.append(held)
        view, n = arena.view, ns.chunk_bytes
        for i, (lease_id, off, checksum) in enumerate(held_refs):
            sink.put(i, view[off:off + n])
            # A daemon without a verdict count: each copy is checked instead.
            if not self._held_leases[lease_id][3] and checksum and sink.digest(i) != checksum:
                self.forget_held([keys[i]])
                return False
        return True

    def _leases_to_release(self) -> List[int]:
        now = time.monotonic()
        done = [lid for lid, (until, refs, _, _) in self._held_leases.items()
                if refs == 0 or until <= now]
        for lid in done:
            del self._held_leases[lid]
        if done:
            self._held_refs = {k: v for k, v in self._held_refs.items() if v[0] in self._held_leases}
        out, self._pending_release = self._pending_release + done, []
        return out

    def forget_held(self, keys: Sequence[Any]) -> None:
        """Chunks this client deleted leave its held leases at once."""
        for k in keys:
            held = self._held_refs.pop(bytes(k), None)
            if held is not None:
                self._held_leases[held[0]][1] -= 1

    def refs_request(self, ns: Namespace, keys: List[bytes]) -> Any:
        self.refs_sent = time.monotonic()
        # Read before asking: a verdict that lands while the call is under way is news.
        arena = self._arena
        self.refs_verdicts = arena.verdicts(arena.verdict_offset) if arena is not None else 0
        return pb.FetchRefsRequest(namespace_id=ns.id, chunk_keys=keys, lease_ms=self.lease_ms,
                                   release_lease_ids=self._leases_to_release())

    def copy_refs(self, ns: Namespace, keys: List[bytes], resp: Any, sink: ChunkSink) -> int:
        """Copies the leased chunks of a FetchRefs answer out of the mapping and holds the
        lease (or releases it with the next call); returns how many leading chunks it
        copied. A ref that does not match the request is DataLossError."""
        arena = self._arena
        assert arena is not None
        offsets, checksums = [], []
        for i, ref in enumerate(resp.refs):
            if (i >= len(keys) or ref.chunk_key != keys[i] or ref.length != ns.chunk_bytes
                    or ref.arena_offset + ref.length > arena.bytes):
                if resp.lease_id:
                    self._pending_release.append(resp.lease_id)
                raise DataLossError(f"FetchRefs answer {i} does not match the request")
            sink.put(i, arena.view[ref.arena_offset:ref.arena_offset + ref.length])
            offsets.append(ref.arena_offset)
            checksums.append(ref.checksum)
        if resp.lease_id:
            if self._lease_cache:
                # The lease started after the request left; stop using it a quarter early.
                until = self.refs_sent + resp.lease_ms * 0.75e-3
                verdict_offset = resp.verdict_offset if resp.verdict_offset == arena.verdict_offset else 0
                self._hold(resp.lease_id, until, keys[:len(offsets)], offsets, checksums,
                           self.refs_verdicts, verdict_offset)
            else:
                self._pending_release.append(resp.lease_id)
        return len(offsets)

    def take_refs(self, ns: Namespace, keys: List[bytes], resp: Any, sink: ChunkSink,
                  attempt: int) -> Optional[int]:
        """A FetchRefs answer: the chunks copied, or None to ask again (the daemon
        restarted, its offsets are into a new arena, which is now mapped)."""
        assert self._arena is not None
        if resp.arena_id == self._arena.id:
            return self.copy_refs(ns, keys, resp, sink)
        self._drop_arena("the shared arena's identity does not match kvcached's answers")
        if attempt == 0:
            self._map_arena()
        return None if self._arena is not None and attempt == 0 else 0

    def _hold(self, lease_id: int, until: float, keys: List[bytes], offsets: List[int],
              checksums: List[int], verdicts: int, verdict_offset: int) -> None:
        self._held_leases[lease_id] = [until, 0, verdicts, verdict_offset]
        for k, off, checksum in zip(keys, offsets, checksums):
            old = self._held_refs.get(k)
            if old is not None:
                self._held_leases[old[0]][1] -= 1
            self._held_refs[k] = (lease_id, off, checksum)
            self._held_leases[lease_id][1] += 1
        while len(self._held_refs) > self._max_held and len(self._held_leases) > 1:
            oldest = next(iter(self._held_leases))  # dicts keep insertion order
            self._held_leases[oldest][1] = 0
            self._held_refs = {k: v for k, v in self._held_refs.items() if v[0] != oldest}

    # ---- namespaces, lookups ----
    @staticmethod
    def register_request(model_config_json: Any, model_id: str, chunk_tokens: int) -> Any:
        if not model_id:
            raise InvalidArgumentError("model_id is empty")
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or \
                not 0 <= chunk_tokens < 2**32:
            raise InvalidArgumentError(
                f"chunk_tokens is {chunk_tokens!r}; it must be an int from 0 (the server's "
                "default) to 2**32 - 1")
        if isinstance(model_config_json, dict):
            model_config_json = json.dumps(model_config_json)
        return pb.RegisterNamespaceRequest(model_config_json=model_config_json,
                                           model_id=model_id, chunk_tokens=chunk_tokens)

    @staticmethod
    def register_keyed_request(model_id: str, page_bytes: int, page_tokens: int) -> Any:
        if not model_id:
            raise InvalidArgumentError("model_id is empty")
        for name, value, top in (("page_bytes", page_bytes, 2**64), ("page_tokens", page_tokens, 2**32)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < top:
                raise InvalidArgumentError(f"{name} is {value!r}; it must be an int from 0 to {top} - 1")
        if page_bytes == 0:
            raise InvalidArgumentError("page_bytes is 0; a caller-keyed namespace needs the bytes of one page")
        return pb.RegisterNamespaceRequest(model_id=model_id, key_mode=pb.KEY_MODE_CALLER,
                                           page_bytes=page_bytes, chunk_tokens=page_tokens)

    @staticmethod
    def namespace_from(req: Any, resp: Any) -> Namespace:
        if req.key_mode == pb.KEY_MODE_CALLER:
            if resp.key_mode != pb.KEY_MODE_CALLER:
                raise KvcacheError("this kvcached predates caller-keyed namespaces "
                                   "(it answered with a token-keyed one)")
            return Namespace(resp.namespace_id, bytes(resp.root_key), resp.chunk_bytes,
                             resp.chunk_tokens, resp.kv_layout_version, None, True)
        vocab = None
        try:  # a Hugging Face config keeps the text model's fields under text_config
            config = json.loads(req.model_config_json)
            vocab = int(config.get("text_config", config).get("vocab_size"))
        except (ValueError, TypeError, AttributeError):
            pass
        return Namespace(resp.namespace_id, bytes(resp.root_key), resp.chunk_bytes,
                         resp.chunk_tokens, resp.kv_layout_version, vocab)

    def chunk_keys(self, ns: Namespace, tokens: Tokens) -> List[bytes]:
        """The keys of every whole chunk of tokens in ns, computed here."""
        refuse_caller_keyed(ns, "chunk_keys(ns, tokens)")
        return chunk_keys(ns.root_key, as_tokens(tokens, ns.vocab_size), ns.chunk_tokens)

    @staticmethod
    def caller_keys(ns: Namespace, keys: Sequence[Any]) -> List[bytes]:
        """The chunk keys (16 bytes each) of the caller's own keys (str or bytes, 1 to 64
        bytes: a page hash) in a caller-keyed namespace; every other call takes these."""
        if not ns.caller_keys:
            raise InvalidArgumentError(
                f"namespace {ns.id} derives its keys from tokens; caller keys need a namespace "
                "from register_keyed_namespace")
        return caller_chunk_keys(ns.root_key, keys)

    @staticmethod
    def lookup_request(ns: Namespace, tokens: Tokens) -> Tuple[Any, Optional[List[bytes]]]:
        """The Lookup request for tokens, and the keys it asks about (None if the daemon is to
        hash the tokens). Knowing the vocabulary, the client checks the ids and hashes them
        itself and sends 16 bytes a chunk; the daemon then hashes nothing."""
        refuse_caller_keyed(ns, "lookup(ns, tokens)")
        arr = as_tokens(tokens, ns.vocab_size)
        if ns.vocab_size is None:
            return pb.LookupRequest(namespace_id=ns.id, tokens=arr.tolist()), None
        keys = chunk_keys(ns.root_key, arr, ns.chunk_tokens)
        return Common.keys_lookup_request(ns, keys), keys

    @staticmethod
    def keys_lookup_request(ns: Namespace, keys: Sequence[bytes], every_chunk: bool = False) -> Any:
        """A Lookup by keys, packed end to end (one field, not one string per key)."""
        return pb.LookupRequest(namespace_id=ns.id, packed_chunk_keys=_wire.pack_keys(keys),
                                every_chunk=every_chunk)

    @staticmethod
    def unpacked_retry(req: Any, resp: Any) -> Any:
        """The same question with one string per key when the daemon predates packed keys
        (it saw none of them: keys_seen 0); None when the answer stands."""
        if not req.packed_chunk_keys or resp.keys_seen * 16 == len(req.packed_chunk_keys):
            return None
        return pb.LookupRequest(namespace_id=req.namespace_id, every_chunk=req.every_chunk,
                                chunk_keys=_wire.unpack_keys(req.packed_chunk_keys))

    @staticmethod
    def match_from(ns: Namespace, resp: Any, keys: Optional[Sequence[bytes]] = None) -> Match:
        """A Lookup answer as a Match; `keys`: what a lookup by keys asked (the answer
        then carries none)."""
        if keys is None:
            keys = [bytes(k) for k in resp.chunk_keys]
        got = list(map(_TIERS.get, resp.tiers))  # one C-level pass; a tier unknown here
        tiers = [t or "none" for t in got] if None in got else cast(List[str], got)  # (newer)
        return Match(resp.matched_chunks, keys if isinstance(keys, list) else list(keys), tiers,
                     ns.chunk_tokens)

    @staticmethod
    def stats_from(resp: Any) -> Dict[str, Any]:
        """The Stats answer as a dict; a message field (quota) as a dict, or None if absent;
        a repeated one (ssd_classes) as a list."""
        def as_dict(sub: Any) -> Dict[str, Any]:
            return {g.name: value(sub, g) for g in sub.DESCRIPTOR.fields}

        def value(msg: Any, f: Any) -> Any:
            if f.label == f.LABEL_REPEATED:
                items = getattr(msg, f.name)
                return [as_dict(i) for i in items] if f.message_type is not None else list(items)
            if f.message_type is None:
                return getattr(msg, f.name)
            if not msg.HasField(f.name):
                return None
            return as_dict(getattr(msg, f.name))
        return {f.name: value(resp, f) for f in resp.DESCRIPTOR.fields}

    # ---- fetch ----
    @staticmethod
    def fetch_target(ns: Namespace, keys: Any, out: Any) -> Tuple[List[bytes], Any, memoryview]:
        keys = check_keys(keys)
        need = len(keys) * ns.chunk_bytes
        if out is None:
            out = bytearray(need)
        return keys, out, writable_view(out, need)

    @staticmethod
    def take_chunk(ns: Namespace, keys: List[bytes], raw: bytes, index: int) -> memoryview:
        """The payload view of raw FetchResponse `index`, checked against the request."""
        if index >= len(keys):
            raise DataLossError(f"Fetch answer {index}: an answer past the last chunk asked for")
        got_key, payload = _wire.split_fetch_response(raw)
        if got_key != keys[index]:
            raise DataLossError(f"Fetch answer {index} is another chunk than asked for")
        if payload.nbytes != ns.chunk_bytes:
            raise DataLossError(
                f"Fetch answer {index} is {payload.nbytes} bytes; namespace {ns.id} chunks are "
                f"{ns.chunk_bytes}")
        return payload

    @staticmethod
    def ends_fetch(error: BaseException) -> bool:
        """A NOT_FOUND naming a chunk ends a fetch after the leading chunks (not an error);
        a missing namespace is."""
        return isinstance(error, NotFoundError) and "namespace" not in error.message

    # ---- store ----
    def store_requests(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool,
                       ttl_s: int, parent: Optional[bytes]) -> List[bytes]:
        return self.store_plan(ns, tokens, payloads, durable, ttl_s, parent)[0]

    @staticmethod
    def store_plan(ns: Namespace, tokens: Tokens, payloads: Any, durable: bool, ttl_s: int,
                   parent: Optional[bytes]) -> Tuple[List[bytes], List[bytes]]:
        """(one serialized StoreRequest per whole chunk, each naming its own parent; the
        chunks' keys), after checking every argument."""
        refuse_caller_keyed(ns, "store(ns, tokens, …)")
        arr = as_tokens(tokens, ns.vocab_size)
        chunks = arr.size // ns.chunk_tokens
        arr = arr[:chunks * ns.chunk_tokens]  # a partial last chunk is not stored
        if ttl_s < 0 or ttl_s >= 2**32:
            raise InvalidArgumentError(f"ttl_s is {ttl_s}")
        views = chunk_payloads(ns, payloads, chunks)
        parent = b"" if parent is None else key_bytes(parent, "parent")
        durability = pb.DURABILITY_DURABLE if durable else pb.DURABILITY_MEMORY
        keys = chunk_keys(parent or ns.root_key, arr, ns.chunk_tokens)
        requests = []
        for i in range(chunks):
            requests.append(_wire.store_request(
                ns.id, parent if i == 0 else keys[i - 1],
                arr[i * ns.chunk_tokens:(i + 1) * ns.chunk_tokens], views[i], durability, ttl_s))
        return requests, keys

    @staticmethod
    def keyed_store_plan(ns: Namespace, keys: Any, payloads: Any, durable: bool, ttl_s: int,
                         chain: bool) -> Tuple[List[bytes], List[bytes]]:
        """(one serialized StoreRequest per chunk of a caller-keyed namespace; their keys):
        `keys` are chunk keys (caller_keys), `payloads` as in store (one buffer, or one
        buffer — or list of part buffers — per key). chain: each chunk names the one
        before it as its parent (eviction then takes a chain's tail first)."""
        if not ns.caller_keys:
            raise InvalidArgumentError(
                f"namespace {ns.id} derives its keys from tokens: store(ns, tokens, payloads)")
        keys = check_keys(keys)
        if ttl_s < 0 or ttl_s >= 2**32:
            raise InvalidArgumentError(f"ttl_s is {ttl_s}")
        views = chunk_payloads(ns, payloads, len(keys))
        durability = pb.DURABILITY_DURABLE if durable else pb.DURABILITY_MEMORY
        return [_wire.store_request(ns.id, keys[i - 1] if chain and i else b"", None, views[i],
                                    durability, ttl_s, keys[i])
                for i in range(len(keys))], keys

    @staticmethod
    def pin_request(ns: Namespace, keys: Any, ttl_s: int) -> Any:
        if ttl_s <= 0 or ttl_s >= 2**32:
            raise InvalidArgumentError(f"ttl_s is {ttl_s}; a pin needs a positive TTL")
        return pb.PinRequest(namespace_id=ns.id, chunk_keys=check_keys(keys), ttl_seconds=ttl_s)

    @staticmethod
    def unpin_request(ns: Namespace, keys: Any) -> Any:
        return pb.UnpinRequest(namespace_id=ns.id, chunk_keys=check_keys(keys))

    @staticmethod
    def delete_request(ns: Namespace, keys: Any) -> Any:
        return pb.DeleteRequest(namespace_id=ns.id, chunk_keys=check_keys(keys))

    @staticmethod
    def store_result(resp: Any, chunks: int, ns: Namespace) -> StoreResult:
        return StoreResult(resp.stored, resp.already_present, [bytes(k) for k in resp.chunk_keys],
                           chunks * ns.chunk_tokens)
