"""The asyncio client (grpc.aio): the same methods as Client, as coroutines."""
import asyncio
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple, cast

import grpc
import grpc.aio

from ._common import (CHANNEL_OPTIONS, FETCH_METHOD, STORE_METHOD, ChunkSink, Common, Fetched,
                      Match, StoreResult, check_keys)
from .hashing import Namespace, Tokens
from .errors import KvcacheError, PermissionDeniedError, ResourceExhaustedError, from_rpc_error
from .v1 import kvcache_pb2 as pb
from .v1 import kvcache_pb2_grpc as pb_grpc


class AsyncClient(Common):
    """Like Client (see there), for asyncio. Create it inside the event loop that uses it;
    `await client.close()` (or `async with`) when done. With the native library, a fetch's
    gRPC stream runs on the loop's default executor (the GIL released), not on the loop."""

    def __init__(self, target: str, token: Optional[str] = None, timeout_s: float = 30.0,
                 shm_socket: Optional[str] = None, lease_ms: int = 10000,
                 lease_cache: bool = True, max_held_chunks: int = 1024,
                 native_fetch: bool = True) -> None:
        super().__init__(target, token, timeout_s, shm_socket, lease_ms, lease_cache,
                         max_held_chunks, native_fetch)
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.KVCacheStub(self._channel)  # type: ignore[no-untyped-call]
        self._fetch = self._channel.unary_stream(
            FETCH_METHOD, request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=None)
        self._store = self._channel.stream_unary(
            STORE_METHOD, request_serializer=None,
            response_deserializer=pb.StoreResponse.FromString)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._arena is not None:
            for lease in self._leases_to_release() + list(self._held_leases):
                try:
                    await self._call(self._stub.ReleaseRefs, pb.ReleaseRefsRequest(lease_id=lease))
                except KvcacheError:
                    pass  # it ends on time anyway
            self._pending_release = []
        self._drop_arena("closed")
        await self._channel.close()
        if self._native is not None:
            self._native.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout_s, metadata=self._metadata,
                                wait_for_ready=True)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def register_namespace(self, model_config_json: str, model_id: str,
                               chunk_tokens: int = 0) -> Namespace:
        req = self.register_request(model_config_json, model_id, chunk_tokens)
        return self.namespace_from(req, await self._call(self._stub.RegisterNamespace, req))

    async def register_keyed_namespace(self, model_id: str, page_bytes: int,
                                       page_tokens: int = 0) -> Namespace:
        req = self.register_keyed_request(model_id, page_bytes, page_tokens)
        return self.namespace_from(req, await self._call(self._stub.RegisterNamespace, req))

    async def lookup(self, ns: Namespace, tokens: Tokens) -> Match:
        req, keys = self.lookup_request(ns, tokens)
        resp = await self._call(self._stub.Lookup, req)
        retry = self.unpacked_retry(req, resp)
        if retry is not None:
            resp = await self._call(self._stub.Lookup, retry)
        return self.match_from(ns, resp, keys)

    async def lookup_keys(self, ns: Namespace, keys: Sequence[bytes]) -> Match:
        """lookup() by chunk keys the caller holds (nothing hashed)."""
        keys = check_keys(keys)
        req = self.keys_lookup_request(ns, keys)
        resp = await self._call(self._stub.Lookup, req)
        retry = self.unpacked_retry(req, resp)
        if retry is not None:
            resp = await self._call(self._stub.Lookup, retry)
        return self.match_from(ns, resp, keys)

    async def fetch(self, ns: Namespace, keys: Sequence[bytes], out: Optional[Any] = None) -> Fetched:
        keys, out, view = self.fetch_target(ns, keys, out)
        sink = ChunkSink(ns.chunk_bytes, view)
        got = shm = 0
        if self._arena is not None and keys:
            if self.copy_from_held(ns, keys, sink):
                return Fetched(len(keys), out, ns.chunk_bytes, len(keys))
            shm = got = await self._fetch_shared(ns, keys, sink)
        if got < len(keys) and self._native is not None:
            got += await asyncio.get_running_loop().run_in_executor(
                None, self._native.stream_into, self, ns, keys, got, sink, True)
        elif got < len(keys):
            streamed = 0
            async for i, payload in self._stream(ns, keys[got:]):
                sink.put(got + i, payload)
                streamed = i + 1
            got += streamed
        return Fetched(got, out, ns.chunk_bytes, shm)

    async def fetch_iter(self, ns: Namespace, keys: Sequence[bytes]) -> AsyncIterator[Tuple[int, bytes, memoryview]]:
        keys = check_keys(keys)
        async for i, payload in self._stream(ns, keys):
            yield i, keys[i], payload

    async def _stream(self, ns: Namespace, keys: List[bytes]) -> AsyncIterator[Tuple[int, memoryview]]:
        try:
            call = self._fetch(pb.FetchRequest(namespace_id=ns.id, chunk_keys=keys),
                               timeout=self.timeout_s, metadata=self._metadata,
                               wait_for_ready=True)
            i = 0
            async for raw in call:
                yield i, self.take_chunk(ns, keys, raw, i)
                i += 1
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if not self.ends_fetch(error):
                raise error from None

    async def _fetch_shared(self, ns: Namespace, keys: List[bytes], sink: ChunkSink) -> int:
        for attempt in range(2):
            try:
                resp = await self._call(self._stub.FetchRefs, self.refs_request(ns, keys))
            except PermissionDeniedError as e:
                self._drop_arena(e.message)
                return 0
            except ResourceExhaustedError:
                return 0  # this tenant holds all the leases it may: gRPC this time
            got = self.take_refs(ns, keys, resp, sink, attempt)
            if got is not None:
                return got
        return 0

    async def store(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool = True,
                  ttl_s: int = 0, parent: Optional[bytes] = None) -> StoreResult:
        return await self._send_store(ns, self.store_requests(ns, tokens, payloads, durable,
                                                              ttl_s, parent))

    async def store_keys(self, ns: Namespace, keys: Sequence[bytes], payloads: Any,
                         durable: bool = True, ttl_s: int = 0, chain: bool = True) -> StoreResult:
        """Client.store_keys, as a coroutine."""
        requests, _ = self.keyed_store_plan(ns, keys, payloads, durable, ttl_s, chain)
        return await self._send_store(ns, requests)

    async def _send_store(self, ns: Namespace, requests: List[bytes]) -> StoreResult:
        if not requests:
            return StoreResult(0, 0, [])
        try:
            resp = await self._store(iter(requests), timeout=self.timeout_s,
                                     metadata=self._metadata, wait_for_ready=True)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return self.store_result(resp, len(requests), ns)

    async def pin(self, ns: Namespace, keys: Sequence[bytes], ttl_s: int) -> int:
        return int((await self._call(self._stub.Pin, self.pin_request(ns, keys, ttl_s))).pinned)

    async def unpin(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        return int((await self._call(self._stub.Unpin, self.unpin_request(ns, keys))).unpinned)

    async def delete(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        req = self.delete_request(ns, keys)
        self.forget_held(req.chunk_keys)
        return int((await self._call(self._stub.Delete, req)).deleted)

    async def stats(self) -> Dict[str, Any]:
        return self.stats_from(await self._call(self._stub.Stats, pb.StatsRequest()))


class AsyncClusterClient:
    """A cluster (ClusterClient, see there) for asyncio: the same methods as coroutines.

    Each call runs the cluster client on one worker thread of its own (the cluster client
    is not thread-safe; one thread keeps its state in one place), so the event loop never
    blocks on the network; the cluster client itself talks to the nodes in parallel. Create
    it inside the event loop that uses it; `await client.close()` (or `async with`)."""

    def __init__(self, target: str, token: Optional[str] = None, **options: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from .cluster import ClusterClient
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvcache-cluster")
        # Made on the worker thread too: its etcd watch and node clients live there.
        self._cluster: "ClusterClient" = self._executor.submit(
            lambda: ClusterClient(target, token, **options)).result()
        self.target = target

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import asyncio
        import functools
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(fn, *args, **kwargs))

    @property
    def cluster(self) -> Any:
        """The ClusterClient behind it (membership, owners, counters)."""
        return self._cluster

    async def __aenter__(self) -> "AsyncClusterClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._run(self._cluster.close)
        self._executor.shutdown(wait=True)

    async def register_namespace(self, model_config_json: str, model_id: str,
                                 chunk_tokens: int = 0) -> Namespace:
        return cast(Namespace, await self._run(self._cluster.register_namespace,
                                               model_config_json, model_id, chunk_tokens))

    async def register_keyed_namespace(self, model_id: str, page_bytes: int,
                                       page_tokens: int = 0) -> Namespace:
        return cast(Namespace, await self._run(self._cluster.register_keyed_namespace, model_id,
                                               page_bytes, page_tokens))

    def chunk_keys(self, ns: Namespace, tokens: Tokens) -> List[bytes]:
        return self._cluster.chunk_keys(ns, tokens)  # local hashing: no I/O

    def caller_keys(self, ns: Namespace, keys: Sequence[Any]) -> List[bytes]:
        return Common.caller_keys(ns, keys)

    async def lookup(self, ns: Namespace, tokens: Tokens) -> Match:
        return cast(Match, await self._run(self._cluster.lookup, ns, tokens))

    async def lookup_keys(self, ns: Namespace, keys: Sequence[bytes]) -> Match:
        return cast(Match, await self._run(self._cluster.lookup_keys, ns, keys))

    async def fetch(self, ns: Namespace, keys: Sequence[bytes], out: Optional[Any] = None) -> Fetched:
        return cast(Fetched, await self._run(self._cluster.fetch, ns, keys, out))

    async def fetch_scattered(self, ns: Namespace, keys: Sequence[bytes], dsts: Any) -> int:
        return cast(int, await self._run(self._cluster.fetch_scattered, ns, keys, dsts))

    async def store(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool = True,
                    ttl_s: int = 0, parent: Optional[bytes] = None) -> StoreResult:
        return cast(StoreResult, await self._run(self._cluster.store, ns, tokens, payloads,
                                                 durable, ttl_s, parent))

    async def store_keys(self, ns: Namespace, keys: Sequence[bytes], payloads: Any,
                         durable: bool = True, ttl_s: int = 0, chain: bool = True) -> StoreResult:
        return cast(StoreResult, await self._run(self._cluster.store_keys, ns, keys, payloads,
                                                 durable, ttl_s, chain))

    async def pin(self, ns: Namespace, keys: Sequence[bytes], ttl_s: int) -> int:
        return cast(int, await self._run(self._cluster.pin, ns, keys, ttl_s))

    async def unpin(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        return cast(int, await self._run(self._cluster.unpin, ns, keys))

    async def delete(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        return cast(int, await self._run(self._cluster.delete, ns, keys))

    async def stats(self) -> Dict[str, Any]:
        return cast(Dict[str, Any], await self._run(self._cluster.stats))


def connect_async(target: str, token: Optional[str] = None, **options: Any) -> Any:
    """kvcache.connect for asyncio: an AsyncClusterClient for "etcd://H:P[,H:P…]", an
    AsyncClient for one daemon. Call it inside the event loop that uses the client."""
    if target.startswith("etcd://"):
        return AsyncClusterClient(target, token, **options)
    return AsyncClient(target, token, **options)
