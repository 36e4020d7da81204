"""The blocking client."""
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.experimental

from ._common import (CHANNEL_OPTIONS, FETCH_METHOD, STORE_METHOD, ChunkSink, Common, Fetched,
                      Match, StoreResult, check_keys, sink_for)
from .hashing import Namespace, Tokens
from .errors import (InvalidArgumentError, KvcacheError, PermissionDeniedError,
                     ResourceExhaustedError, from_rpc_error)
from .v1 import kvcache_pb2 as pb
from .v1 import kvcache_pb2_grpc as pb_grpc

__all__ = ["Client", "Fetched", "Match", "StoreResult"]


class Client(Common):
    """A connection to kvcached.

    target: "HOST:PORT" or "unix:PATH". token: the tenant's bearer token. Every call waits
    up to timeout_s, also for the server to come (back) up, so a client outlives a daemon
    restart. shm_socket (default: $KVCACHE_SHM_SOCKET): the daemon's Unix socket for the
    co-located path; when the handshake succeeds, fetch copies RAM chunks out of the
    tenant's shared arena instead of receiving them over gRPC (`shared_memory`,
    `shm_error` say whether and why not). native_fetch: fetches stream through the native
    library beside the package when it is there (`native_fetch` says whether they do; one
    copy per chunk instead of grpcio's two; $KVCACHE_NATIVE_FETCH=0 turns it off). Not
    thread-safe; use one per thread.
    """

    def __init__(self, target: str, token: Optional[str] = None, timeout_s: float = 30.0,
                 shm_socket: Optional[str] = None, lease_ms: int = 10000,
                 lease_cache: bool = True, max_held_chunks: int = 1024,
                 wait_for_ready: bool = True, native_fetch: bool = True) -> None:
        if isinstance(target, str) and target.startswith("etcd://"):
            raise InvalidArgumentError(
                f"{target!r} names a cluster; Client talks to one daemon: use "
                "kvcache.connect(target) (or ClusterClient) for a cluster")
        super().__init__(target, token, timeout_s, shm_socket, lease_ms, lease_cache,
                         max_held_chunks, native_fetch)
        # False (a cluster's node clients): a node that is down fails the call at once, so
        # the next node in the ranking is asked instead.
        self._wait = wait_for_ready
        # Fetch streams run on the calling thread: without this, every message is handed
        # over from gRPC's polling thread (futexes, ~3x the CPU per chunk, measured).
        self._channel = grpc.insecure_channel(
            target, options=CHANNEL_OPTIONS + [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
        self._stub = pb_grpc.KVCacheStub(self._channel)  # type: ignore[no-untyped-call]
        self._fetch = self._channel.unary_stream(
            FETCH_METHOD, request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=None)
        self._store = self._channel.stream_unary(
            STORE_METHOD, request_serializer=None,
            response_deserializer=pb.StoreResponse.FromString)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._arena is not None:
            for lease in self._leases_to_release() + list(self._held_leases):
                try:
                    self._call(self._stub.ReleaseRefs, pb.ReleaseRefsRequest(lease_id=lease))
                except KvcacheError:
                    pass  # it ends on time anyway
            self._pending_release = []
        self._drop_arena("closed")
        self._channel.close()
        if self._native is not None:
            self._native.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s, metadata=self._metadata,
                          wait_for_ready=self._wait)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def register_namespace(self, model_config_json: str, model_id: str,
                               chunk_tokens: int = 0) -> Namespace:
        """The namespace of a model (config.json text or dict) for this tenant."""
        req = self.register_request(model_config_json, model_id, chunk_tokens)
        return self.namespace_from(req, self._call(self._stub.RegisterNamespace, req))

    def register_keyed_namespace(self, model_id: str, page_bytes: int,
                                 page_tokens: int = 0) -> Namespace:
        """A namespace whose keys the caller chooses (a serving engine's page hashes; map
        them with caller_keys): pages of page_bytes laid out by the caller, each covering
        page_tokens tokens (0: not said). Same tenant, model_id, page_bytes and page_tokens:
        the same namespace."""
        req = self.register_keyed_request(model_id, page_bytes, page_tokens)
        return self.namespace_from(req, self._call(self._stub.RegisterNamespace, req))

    def lookup(self, ns: Namespace, tokens: Tokens) -> Match:
        req, keys = self.lookup_request(ns, tokens)
        return self.match_from(ns, self._lookup(req), keys)

    def lookup_keys(self, ns: Namespace, keys: Sequence[bytes]) -> Match:
        """lookup() by the chunk keys a worker already holds (from chunk_keys or an earlier
        turn): nothing is hashed, 16 bytes a chunk go out."""
        keys = check_keys(keys)
        return self.match_from(ns, self._lookup(self.keys_lookup_request(ns, keys)), keys)

    def _lookup(self, req: Any) -> Any:
        resp = self._call(self._stub.Lookup, req)
        retry = self.unpacked_retry(req, resp)
        return resp if retry is None else self._call(self._stub.Lookup, retry)

    def fetch(self, ns: Namespace, keys: Sequence[bytes], out: Optional[Any] = None) -> Fetched:
        """The leading chunks of `keys` that are cached, copied into `out` (any writable
        buffer: bytearray, memoryview, numpy array; a new bytearray if None) back to back.
        Stops at the first chunk not cached."""
        keys, out, view = self.fetch_target(ns, keys, out)
        got, shm = self._fetch_into(ns, keys, ChunkSink(ns.chunk_bytes, view))
        return Fetched(got, out, ns.chunk_bytes, shm)

    def fetch_scattered(self, ns: Namespace, keys: Sequence[bytes], dsts: Sequence[Any]) -> int:
        """Like fetch, with chunk i written straight into dsts[i]: one writable buffer of
        chunk_bytes, or a list of writable buffers whose sizes add up to chunk_bytes (a page
        split over several buffers, e.g. a serving engine's K and V). A cluster client puts
        each node's share of a prefix where it belongs; an engine fills its host pool's
        pages — from the shared arena when co-located, with no buffer in between. dsts may
        also be a ChunkSink made once by the caller (its views are then not checked again).
        Returns how many leading chunks arrived."""
        keys = check_keys(keys)
        sink = sink_for(ns, dsts, len(keys))
        return self._fetch_into(ns, keys, sink)[0]

    def _fetch_into(self, ns: Namespace, keys: List[bytes], sink: ChunkSink) -> Tuple[int, int]:
        """(leading chunks delivered to sink, how many of them from shared memory)."""
        got = shm = 0
        if self._arena is not None and keys:
            if self.copy_from_held(ns, keys, sink):
                return len(keys), len(keys)
            shm = got = self._fetch_shared(ns, keys, sink)
        if got < len(keys):
            got += self._stream_into(ns, keys, got, sink)
        return got, shm

    def _stream_into(self, ns: Namespace, keys: List[bytes], start: int, sink: ChunkSink) -> int:
        """Streams keys[start:] into the sink from chunk `start` on; how many arrived."""
        if self._native is not None:
            return self._native.stream_into(self, ns, keys, start, sink, self._wait)
        streamed = 0
        for i, payload in self._stream(ns, keys[start:]):
            sink.put(start + i, payload)
            streamed = i + 1
        return streamed

    def fetch_iter(self, ns: Namespace, keys: Sequence[bytes]) -> Iterator[Tuple[int, bytes, memoryview]]:
        """Yields (index, key, payload) per chunk as it arrives over gRPC; payload is a
        read-only memoryview valid until the next item. Stops at the first missing chunk."""
        keys = check_keys(keys)
        for i, payload in self._stream(ns, keys):
            yield i, keys[i], payload

    def _stream(self, ns: Namespace, keys: List[bytes]) -> Iterator[Tuple[int, memoryview]]:
        try:
            call = self._fetch(pb.FetchRequest(namespace_id=ns.id, chunk_keys=keys),
                               timeout=self.timeout_s, metadata=self._metadata,
                               wait_for_ready=self._wait)
            for i, raw in enumerate(call):
                yield i, self.take_chunk(ns, keys, raw, i)
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if not self.ends_fetch(error):
                raise error from None

    def _fetch_shared(self, ns: Namespace, keys: List[bytes], sink: ChunkSink) -> int:
        for attempt in range(2):
            try:
                resp = self._call(self._stub.FetchRefs, self.refs_request(ns, keys))
            except PermissionDeniedError as e:
                self._drop_arena(e.message)
                return 0
            except ResourceExhaustedError:
                return 0  # this tenant holds all the leases it may: gRPC this time
            got = self.take_refs(ns, keys, resp, sink, attempt)
            if got is not None:
                return got
        return 0

    def store(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool = True,
                  ttl_s: int = 0, parent: Optional[bytes] = None) -> StoreResult:
        """Stores the whole chunks of `tokens` with their payloads (one buffer of the whole
        chunks × chunk_bytes, or one buffer per whole chunk); a partial last chunk is left
        out, and the result's `tokens` says how many tokens were covered. `parent`: the key
        of the chunk before tokens[0] (None: tokens start the prefix). durable=False
        acknowledges once in RAM."""
        return self.send_store(ns, self.store_requests(ns, tokens, payloads, durable, ttl_s, parent))

    def store_keys(self, ns: Namespace, keys: Sequence[bytes], payloads: Any, durable: bool = True,
                   ttl_s: int = 0, chain: bool = True) -> StoreResult:
        """Stores chunks of a caller-keyed namespace under `keys` (from caller_keys): one
        buffer of len(keys) × chunk_bytes, or one payload per key (a buffer, or a list of
        part buffers that add up to chunk_bytes). chain: the keys are one prefix's pages in
        order (each names the one before as its parent, so eviction takes the tail first)."""
        requests, _ = self.keyed_store_plan(ns, keys, payloads, durable, ttl_s, chain)
        return self.send_store(ns, requests)

    def send_store(self, ns: Namespace, requests: Sequence[Any]) -> StoreResult:
        """Sends StoreRequests made by store_requests() (any subset, each naming its parent)
        in one stream: what a router sends each node, its share of a prefix."""
        if not requests:
            return StoreResult(0, 0, [])
        try:
            resp = self._store(iter(requests), timeout=self.timeout_s, metadata=self._metadata,
                               wait_for_ready=self._wait)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return self.store_result(resp, len(requests), ns)

    def tiers_of(self, ns: Namespace, keys: Sequence[bytes]) -> List[str]:
        """The tier of every chunk of `keys` on this daemon ("none" where it has none), not
        only the leading run's: what a cluster client merges across nodes."""
        return self.tiers_and_deleted_of(ns, keys)[0]

    def tiers_and_deleted_of(self, ns: Namespace,
                             keys: Sequence[bytes]) -> Tuple[List[str], Set[int]]:
        """tiers_of(), and the indices of the chunks this daemon's tenant deleted (a cluster
        node remembers them: a chunk another node still holds missed the delete, and a
        cluster client treats it as missing; docs/cluster.md, "Deletes")."""
        if not keys:
            return [], set()
        req = self.keys_lookup_request(ns, keys, every_chunk=True)
        resp = self._lookup(req)
        deleted = {int(i) for i in resp.deleted_chunks if int(i) < len(keys)}
        return self.match_from(ns, resp, keys).tiers, deleted

    def pin(self, ns: Namespace, keys: Sequence[bytes], ttl_s: int) -> int:
        """Keeps the chunks (and so their prefix) from eviction for ttl_s; how many found."""
        return int(self._call(self._stub.Pin, self.pin_request(ns, keys, ttl_s)).pinned)

    def unpin(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        return int(self._call(self._stub.Unpin, self.unpin_request(ns, keys)).unpinned)

    def delete(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        req = self.delete_request(ns, keys)
        self.forget_held(req.chunk_keys)
        return int(self._call(self._stub.Delete, req).deleted)

    def stats(self) -> Dict[str, Any]:
        return self.stats_from(self._call(self._stub.Stats, pb.StatsRequest()))
