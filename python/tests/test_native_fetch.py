"""The Fetch stream through libkvcache_fetch.so (kvcache/_native.py) against the grpcio path:
the same bytes, the same leading counts, the same exception classes, and answers that are
not the chunk asked for refused."""
import asyncio
import os
from concurrent import futures

import grpc
import numpy as np
import pytest

import kvcache
from kvcache import _native, _wire
from kvcache._common import ChunkSink
from kvcache.v1 import kvcache_pb2 as pb
from conftest import free_port
from kvcache.hashing import native_hashing


@pytest.fixture(autouse=True)
def built_library():
    # The C++ build puts both native libraries beside the package (not a sanitized build,
    # nor a wheel): with the hashing one there, the fetch one must be there and load.
    if not _native.available():
        if os.environ.get("KVCACHE_NATIVE_FETCH") == "0":
            pytest.skip("the native fetch is turned off (KVCACHE_NATIVE_FETCH=0)")
        if native_hashing():
            pytest.fail("libkvcache_hash.so is beside the package but libkvcache_fetch.so "
                        "is not, or does not load")
        pytest.skip("no native libraries beside the package (a pure-Python install)")


def clients(address, **kw):
    return kvcache.Client(address, **kw), kvcache.Client(address, native_fetch=False, **kw)


def random_cut(rng, n):
    """Sizes of a chunk split at random points, with an empty part now and then."""
    cuts = sorted(int(c) for c in rng.integers(0, n + 1, int(rng.integers(1, 4))))
    return [b - a for a, b in zip([0] + cuts, cuts + [n])]


def test_native_and_grpcio_fetches_give_the_same_bytes(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)
    native, plain = clients(daemon.address)
    with native, plain:
        assert native.native_fetch and not plain.native_fetch
        ns = native.register_namespace(mini_config, "mini", 64)
        chunks = 6
        tokens = rng.integers(0, ns.vocab_size, chunks * ns.chunk_tokens)
        payloads = rng.integers(0, 256, chunks * ns.chunk_bytes, dtype=np.uint8)
        keys = native.store(ns, tokens, payloads, durable=False).keys
        want = payloads.tobytes()
        for c in (native, plain):
            for out in (None, bytearray(len(want)), np.zeros((chunks, ns.chunk_bytes), np.uint8),
                        memoryview(bytearray(len(want) + 5))):
                got = c.fetch(ns, keys, out=out)
                assert got.chunks == chunks
                assert bytes(memoryview(got.buffer).cast("B")[:len(want)]) == want
            # Scattered, each chunk split into parts at random points (K and V halves, …).
            parts = [[np.zeros(n, np.uint8) for n in random_cut(rng, ns.chunk_bytes)]
                     for _ in range(chunks)]
            assert c.fetch_scattered(ns, keys, parts) == chunks
            assert b"".join(p.tobytes() for ps in parts for p in ps) == want
            sink = ChunkSink(ns.chunk_bytes, parts=[[memoryview(bytearray(ns.chunk_bytes))]
                                                    for _ in range(chunks)])
            assert c.fetch_scattered(ns, keys, sink) == chunks
            assert b"".join(bytes(sink.dest(i)[0]) for i in range(chunks)) == want
        # A chunk missing in the middle: the leading ones, from both.
        assert native.delete(ns, keys[3:4]) == 1
        assert native.fetch(ns, keys).chunks == plain.fetch(ns, keys).chunks == 3
        # An unknown namespace is an error, not a short fetch, on both paths.
        other = kvcache.Namespace(9999, ns.root_key, ns.chunk_bytes, 64, 1)
        messages = []
        for c in (native, plain):
            with pytest.raises(kvcache.NotFoundError) as e:
                c.fetch(other, keys)
            messages.append(e.value.message)
        assert messages[0] == messages[1] and "namespace" in messages[0]


def test_the_async_client_fetches_natively_off_the_loop(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)

    async def main():
        async with kvcache.AsyncClient(daemon.address) as native, \
                kvcache.AsyncClient(daemon.address, native_fetch=False) as plain:
            assert native.native_fetch and not plain.native_fetch
            ns = await native.register_namespace(mini_config, "mini", 64)
            tokens = rng.integers(0, ns.vocab_size, 4 * ns.chunk_tokens)
            payloads = rng.integers(0, 256, 4 * ns.chunk_bytes, dtype=np.uint8)
            keys = (await native.store(ns, tokens, payloads, durable=False)).keys
            # Fetches of both kinds at once on one loop: each into its own buffer.
            got = await asyncio.gather(*[c.fetch(ns, keys) for c in (native, plain) * 3])
            assert all(g.chunks == 4 and bytes(g.buffer) == payloads.tobytes() for g in got)
            assert await native.delete(ns, keys[1:2]) == 1
            assert (await native.fetch(ns, keys)).chunks == (await plain.fetch(ns, keys)).chunks == 1
            other = kvcache.Namespace(9999, ns.root_key, ns.chunk_bytes, 64, 1)
            with pytest.raises(kvcache.NotFoundError, match="namespace"):
                await native.fetch(other, keys)

    asyncio.run(main())


def test_native_fetch_failures_have_the_grpcio_classes(make_daemon, seed, mini_config, tmp_path):
    rng = np.random.default_rng(seed)
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("tok-a acme\n")
    d = make_daemon(["--auth-tokens", str(tokens_file)])
    with kvcache.Client(d.address, token="tok-a") as a:
        ns = a.register_namespace(mini_config, "mini", 64)
        tokens = rng.integers(0, ns.vocab_size, 2 * ns.chunk_tokens)
        payloads = rng.integers(0, 256, 2 * ns.chunk_bytes, dtype=np.uint8)
        keys = a.store(ns, tokens, payloads, durable=False).keys
        assert bytes(a.fetch(ns, keys).buffer) == payloads.tobytes()
    for c in clients(d.address, token="wrong"):
        with c, pytest.raises(kvcache.PermissionDeniedError, match="unknown bearer token"):
            c.fetch(ns, keys)
    for c in clients(f"127.0.0.1:{free_port()}", timeout_s=0.5, wait_for_ready=False):
        with c, pytest.raises(kvcache.UnavailableError):
            c.fetch(ns, keys)
    # A ready-made sink whose parts do not add up to a chunk: refused before any call.
    with kvcache.Client(d.address, token="tok-a") as c:
        short = ChunkSink(ns.chunk_bytes, parts=[[memoryview(bytearray(ns.chunk_bytes - 1))]] * 2)
        with pytest.raises(kvcache.InvalidArgumentError, match="destination 0 is"):
            c.fetch_scattered(ns, keys, short)


def connections_to(port):
    """Established TCP connections in this network namespace to `port` (gRPC's sockets
    are IPv6 ones carrying mapped IPv4 addresses, so /proc/net/tcp6 too)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                    n += 1
    return n


def test_each_client_has_connections_of_its_own(daemon, seed, mini_config):
    # gRPC's default gives every channel of a process to one daemon a single shared
    # connection; a worker's clients (an adapter's I/O threads) would then queue on it.
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address) as first:
        ns = first.register_namespace(mini_config, "mini", 64)
        tokens = rng.integers(0, ns.vocab_size, ns.chunk_tokens)
        keys = first.store(ns, tokens, rng.integers(0, 256, ns.chunk_bytes, dtype=np.uint8),
                           durable=False).keys
        assert first.fetch(ns, keys).chunks == 1
        before = connections_to(daemon.port)
        more = [kvcache.Client(daemon.address) for _ in range(3)]
        for c in more:
            assert c.fetch(ns, keys).chunks == 1  # a call on each of its two channels
            c.stats()
        assert connections_to(daemon.port) == before + 3 * 2
        for c in more:
            c.close()


class LyingServer:
    """A Fetch service that answers each request with what `answers(keys)` returns."""

    def __init__(self, answers):
        self.port = free_port()
        self._answers = answers
        handler = grpc.method_handlers_generic_handler("kvcache.v1.KVCache", {
            "Fetch": grpc.unary_stream_rpc_method_handler(
                self._fetch, request_deserializer=pb.FetchRequest.FromString,
                response_serializer=None)})
        self.server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def _fetch(self, request, context):
        yield from self._answers(list(request.chunk_keys))


@pytest.mark.parametrize("lie,what", [
    ("other_key", "another chunk"), ("short", "bytes"), ("extra", "past the last"),
    ("garbage", "FetchResponse")])
def test_an_answer_that_is_not_the_chunk_asked_for_is_data_loss(seed, lie, what):
    rng = np.random.default_rng(seed)
    n = 4096
    payload = rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    def answers(keys):
        if lie == "garbage":
            yield b"\x0a\x10" + keys[0][:4]  # a key field running past the end
            return
        for i, k in enumerate(keys):
            key = bytes(16) if lie == "other_key" and i == 1 else k
            size = n - 1 if lie == "short" and i == 1 else n
            yield _wire.fetch_response_header(key, size) + payload[:size]
        if lie == "extra":
            yield _wire.fetch_response_header(keys[0], n) + payload

    server = LyingServer(answers)
    try:
        ns = kvcache.Namespace(1, bytes(16), n, 4, 1)
        keys = [rng.bytes(16) for _ in range(3)]
        for c in clients(f"127.0.0.1:{server.port}", timeout_s=5):
            with c, pytest.raises(kvcache.DataLossError) as e:
                c.fetch(ns, keys)
            if c.native_fetch:
                assert what in e.value.message, e.value.message
    finally:
        server.server.stop(0)
