"""The Python client against the real kvcached on loopback."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvcache
from kvcache.v1 import kvcache_pb2 as pb
from kvcache import _wire
from conftest import BIN_DIR, MINI_CONFIG, SOURCE_DIR, run


def random_prefix(rng, ns, chunks):
    tokens = rng.integers(0, ns.vocab_size, chunks * ns.chunk_tokens)
    payloads = rng.integers(0, 256, chunks * ns.chunk_bytes, dtype=np.uint8)
    return tokens, payloads


def test_keys_match_the_published_vectors():
    with open(os.path.join(SOURCE_DIR, "tests/client/prefix_hash_vectors.json")) as f:
        vectors = json.load(f)["vectors"]
    assert vectors
    for v in vectors:
        keys = kvcache.chunk_keys(bytes.fromhex(v["root_key"]), v["tokens"], v["chunk_tokens"])
        assert [k.hex() for k in keys] == v["chunk_keys"]


def test_native_and_python_hashing_give_the_same_keys(seed):
    """The one-call native hashing (libkvcache_hash.so, built with the C++ tree) and the
    Python loop agree on the vectors and on random prefixes, partial tails and all; without
    the library (KVCACHE_NATIVE_HASH=0) chunk_keys still gives the vectors' keys."""
    from kvcache import hashing
    assert hashing.native_hashing(), "libkvcache_hash.so beside the package did not load"
    with open(os.path.join(SOURCE_DIR, "tests/client/prefix_hash_vectors.json")) as f:
        vectors = json.load(f)["vectors"]
    rng = np.random.default_rng(seed)
    cases = [(bytes.fromhex(v["root_key"]), v["tokens"], v["chunk_tokens"]) for v in vectors]
    for _ in range(20):
        chunk = int(rng.integers(1, 300))
        cases.append((rng.bytes(16), rng.integers(0, 2**32, int(rng.integers(0, 5000)),
                                                  dtype=np.uint64).tolist(), chunk))
    for root, tokens, chunk in cases:
        native = hashing.chunk_keys(root, tokens, chunk)
        assert native == hashing.chunk_keys_python(root, hashing.as_tokens(tokens), chunk)
        assert len(native) == len(tokens) // chunk
    code = ("import json, sys, kvcache; from kvcache import hashing; "
            "assert not hashing.native_hashing(); v = json.load(open(sys.argv[1]))['vectors']; "
            "assert all([k.hex() for k in kvcache.chunk_keys(bytes.fromhex(x['root_key']), "
            "x['tokens'], x['chunk_tokens'])] == x['chunk_keys'] for x in v)")
    env = dict(os.environ, KVCACHE_NATIVE_HASH="0")
    subprocess.run([sys.executable, "-c", code,
                    os.path.join(SOURCE_DIR, "tests/client/prefix_hash_vectors.json")],
                   env=env, check=True)


def test_caller_keys_match_the_published_vectors():
    with open(os.path.join(SOURCE_DIR, "tests/client/prefix_hash_vectors.json")) as f:
        vectors = json.load(f)["caller_vectors"]
    assert vectors
    for v in vectors:
        root = kvcache.hashing.caller_namespace_root(v["tenant"], v["model_id"], v["page_bytes"],
                                                     v["page_tokens"])
        assert root.hex() == v["root_key"]
        keys = kvcache.hashing.caller_chunk_keys(root, [bytes.fromhex(k["caller_key"]) for k in v["keys"]])
        assert [k.hex() for k in keys] == [k["chunk_key"] for k in v["keys"]]


def test_caller_keyed_pages_round_trip_into_scattered_parts(daemon, seed):
    """A caller-keyed namespace from both clients: pages stored under the caller's keys
    (str or bytes), found as a leading run, fetched into a page split over two buffers —
    through shared memory and over gRPC — and token calls refused, naming the mode."""
    rng = np.random.default_rng(seed)
    page = int(rng.integers(500, 5000))
    with kvcache.Client(daemon.address, shm_socket=daemon.socket) as c:
        ns = c.register_keyed_namespace("vllm:m", page, 16)
        assert ns.caller_keys and ns.chunk_bytes == page and ns.vocab_size is None
        assert ns.root_key == kvcache.hashing.caller_namespace_root("default", "vllm:m", page, 16)
        names = [rng.bytes(int(rng.integers(1, 65))) for _ in range(4)] + ["page-é"]
        keys = c.caller_keys(ns, names)
        pages = rng.integers(0, 256, (5, page), dtype=np.uint8)
        r = c.store_keys(ns, keys, [pages[i] for i in range(5)], durable=False)
        assert (r.stored, r.already_present, r.keys) == (5, 0, keys)
        assert c.store_keys(ns, keys[:1], pages[0]).already_present == 1
        assert c.lookup_keys(ns, keys[:2] + c.caller_keys(ns, ["absent"]) + keys[2:]).matched_chunks == 2
        for shared in (True, False):
            client = c if shared else kvcache.Client(daemon.address, shm_socket="")
            cut = int(rng.integers(1, page))
            heads = [np.zeros(cut, np.uint8) for _ in range(5)]
            tails = [bytearray(page - cut) for _ in range(5)]
            assert client.fetch_scattered(ns, keys, [[h, t] for h, t in zip(heads, tails)]) == 5
            for i in range(5):
                assert heads[i].tobytes() + bytes(tails[i]) == pages[i].tobytes()
            if not shared:
                client.close()
        assert c.shared_memory, c.shm_error
        with pytest.raises(kvcache.InvalidArgumentError, match="caller-keyed"):
            c.lookup(ns, [1, 2, 3])
        with pytest.raises(kvcache.InvalidArgumentError, match="caller-keyed"):
            c.store(ns, list(range(16)), pages[0])
        with pytest.raises(kvcache.InvalidArgumentError, match="1 to 64 bytes"):
            c.caller_keys(ns, [b"x" * 65])
        with pytest.raises(kvcache.InvalidArgumentError, match="destination 0 is"):
            c.fetch_scattered(ns, keys[:1], [[np.zeros(3, np.uint8)]])


def test_the_async_client_stores_and_fetches_caller_keyed_pages(daemon, seed):
    rng = np.random.default_rng(seed)

    async def main():
        async with kvcache.AsyncClient(daemon.address) as c:
            ns = await c.register_keyed_namespace("sglang:m", 256)
            keys = c.caller_keys(ns, [rng.bytes(32).hex() for _ in range(3)])
            pages = rng.integers(0, 256, 3 * 256, dtype=np.uint8)
            assert (await c.store_keys(ns, keys, pages)).stored == 3
            assert (await c.lookup_keys(ns, keys)).matched_chunks == 3
            got = await c.fetch(ns, keys)
            assert bytes(got.buffer) == pages.tobytes()
    asyncio.run(main())


def test_prefix_round_trips_byte_exact_into_any_buffer(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        assert ns.vocab_size == 512 and ns.chunk_tokens == 64 and len(ns.root_key) == 16
        tokens, payloads = random_prefix(rng, ns, 5)
        r = c.store(ns, tokens, payloads)
        assert (r.stored, r.already_present) == (5, 0)
        assert r.keys == c.chunk_keys(ns, tokens)
        m = c.lookup(ns, tokens)
        assert m.matched_chunks == 5 and m.keys == r.keys and m.matched_tokens == 320
        assert set(m.tiers) <= {"ram", "ssd"}
        want = payloads.tobytes()
        got = c.fetch(ns, m.keys)  # a new bytearray
        assert got.chunks == 5 and bytes(got.buffer) == want
        for out in (bytearray(len(want)), np.zeros(len(want), np.uint8),
                    np.zeros((5, ns.chunk_bytes), np.uint8), memoryview(bytearray(len(want) + 7))):
            got = c.fetch(ns, m.keys, out=out)
            assert got.buffer is out and got.chunks == 5
            assert bytes(memoryview(out).cast("B")[:len(want)]) == want
        streamed = [(i, k, bytes(p)) for i, k, p in c.fetch_iter(ns, m.keys)]
        assert [s[1] for s in streamed] == m.keys
        assert b"".join(s[2] for s in streamed) == want
        # Stored again: already present, nothing changes.
        assert c.store(ns, tokens, payloads).already_present == 5
        # A chunk missing in the middle ends the fetch after the leading ones.
        assert c.delete(ns, m.keys[2:3]) == 1
        assert c.fetch(ns, m.keys).chunks == 2
        assert c.lookup(ns, tokens).matched_chunks == 2


def test_lookup_by_keys_and_by_tokens_agree(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 4)
        c.store(ns, tokens[:3 * 64], payloads[:3 * ns.chunk_bytes])
        # Knowing the vocabulary, the client hashes and sends 16 bytes a chunk, no tokens.
        req, keys = c.lookup_request(ns, tokens)
        assert keys == c.chunk_keys(ns, tokens) and req.packed_chunk_keys == b"".join(keys)
        assert len(req.tokens) == 0
        by_keys = c.lookup(ns, tokens)
        # Without it (an older daemon did not say), the daemon hashes the tokens.
        blind = kvcache.Namespace(ns.id, ns.root_key, ns.chunk_bytes, ns.chunk_tokens,
                                  ns.kv_layout_version)
        assert c.lookup_request(blind, tokens)[1] is None
        by_tokens = c.lookup(blind, tokens)
        assert by_keys.matched_chunks == by_tokens.matched_chunks == 3
        assert by_keys.keys == by_tokens.keys == keys
        assert by_keys.tiers == by_tokens.tiers
        # A worker that holds the keys already (an earlier turn's) asks by them directly.
        held = c.lookup_keys(ns, keys)
        assert (held.matched_chunks, held.keys, held.tiers) == (3, keys, by_keys.tiers)
        with pytest.raises(kvcache.InvalidArgumentError, match="vocabulary"):
            c.lookup(ns, [ns.vocab_size] * 64)


def test_store_keeps_the_whole_chunks_and_says_how_many_tokens_they_cover(daemon, seed,
                                                                          mini_config):
    # A worker's prompt almost always ends mid-chunk: store() takes it as it is.
    rng = np.random.default_rng(seed)
    with kvcache.connect(daemon.address) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens = rng.integers(0, ns.vocab_size, 64 * 2 + 37, dtype=np.uint32)
        payload = rng.integers(0, 256, 2 * ns.chunk_bytes, dtype=np.uint8)
        got = c.store(ns, tokens, payload)
        assert (got.stored, got.tokens, len(got.keys)) == (2, 128, 2)
        assert got.keys == c.chunk_keys(ns, tokens)
        # The tail, once whole, continues the prefix from the last stored key.
        rest = np.concatenate([tokens[128:], rng.integers(0, ns.vocab_size, 27, dtype=np.uint32)])
        more = c.store(ns, rest, rng.integers(0, 256, ns.chunk_bytes, dtype=np.uint8),
                       parent=got.keys[-1])
        assert (more.stored, more.tokens) == (1, 64)
        everything = np.concatenate([tokens[:128], rest])
        assert c.lookup(ns, everything).matched_chunks == 3


def test_lookup_asks_an_older_daemon_with_one_string_per_key(seed):
    # A daemon from before packed keys: it reads chunk_keys only and never sets keys_seen.
    from concurrent import futures

    import grpc
    from kvcache.v1 import kvcache_pb2 as pb
    from kvcache.v1 import kvcache_pb2_grpc as pb_grpc

    calls = []

    class OldDaemon(pb_grpc.KVCacheServicer):
        def Lookup(self, request, context):
            calls.append(request)
            return pb.LookupResponse(tiers=[pb.TIER_RAM if k[0] % 2 == 0 else pb.TIER_NONE
                                            for k in request.chunk_keys])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_KVCacheServicer_to_server(OldDaemon(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        rng = np.random.default_rng(seed)
        keys = [bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in range(9)]
        ns = kvcache.Namespace(1, bytes(16), 1024, 64, 1)
        with kvcache.Client(f"127.0.0.1:{port}") as c:
            tiers = c.tiers_of(ns, keys)
        assert len(calls) == 2, "packed first, then one string per key"
        assert calls[0].packed_chunk_keys == b"".join(keys) and not calls[0].chunk_keys
        assert list(calls[1].chunk_keys) == keys and calls[1].every_chunk
        assert tiers == ["ram" if k[0] % 2 == 0 else "none" for k in keys]
    finally:
        server.stop(None)


def test_keys_and_answers_equal_kvctl(daemon, seed, mini_config, tmp_path):
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 3)
        c.store(ns, tokens[:128], payloads[:2 * ns.chunk_bytes])
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text(" ".join(map(str, tokens)) + " 7")  # and a partial chunk
    common = ["--config", MINI_CONFIG, "--model-id", "mini", "--chunk-tokens", "64",
              "--tokens-file", str(tokens_file)]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    for cmd in (["hash"] + common, ["lookup"] + common, ["stats"]):
        ours = run([sys.executable, "-m", "kvcache", "--server", daemon.address] + cmd, env=env)
        theirs = run([os.path.join(BIN_DIR, "kvctl"), "--server", daemon.address] + cmd)
        assert ours.returncode == 0, ours.stderr
        assert theirs.returncode == 0, theirs.stderr
        # The background RAM scrub runs between the two calls: its line moves.
        def steady(out):
            return [l for l in out.splitlines() if not l.startswith("ram scrub:")]
        assert steady(ours.stdout) == steady(theirs.stdout), cmd[0]
        if cmd[0] == "stats":
            assert "ram scrub:" in ours.stdout and "ram scrub:" in theirs.stdout
    lines = ours.stdout  # stats
    assert "ram " in lines
    hashed = run([sys.executable, "-m", "kvcache", "--server", daemon.address, "hash"] + common,
                 env=env).stdout.split("\n")
    assert [line.split()[1] for line in hashed if line] == [k.hex() for k in
                                                           kvcache.chunk_keys(ns.root_key, tokens, 64)]
    assert hashed[0].endswith((" ram", " ssd")) and hashed[2].endswith(" -")


def test_tenants_are_isolated(make_daemon, seed, mini_config, tmp_path):
    rng = np.random.default_rng(seed)
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("tok-a acme\ntok-b globex\n")
    d = make_daemon(["--auth-tokens", str(tokens_file)])
    with kvcache.Client(d.address, token="tok-a") as a, \
            kvcache.Client(d.address, token="tok-b") as b:
        ns_a = a.register_namespace(mini_config, "mini", 64)
        ns_b = b.register_namespace(mini_config, "mini", 64)
        assert ns_a.root_key != ns_b.root_key
        tokens, payloads = random_prefix(rng, ns_a, 2)
        a.store(ns_a, tokens, payloads)
        assert b.lookup(ns_b, tokens).matched_chunks == 0
        assert b.fetch(ns_b, a.chunk_keys(ns_a, tokens)).chunks == 0
        if ns_a.id != ns_b.id:  # another tenant's namespace id is as good as missing
            with pytest.raises(kvcache.NotFoundError):
                b.lookup(ns_a, tokens)
        with pytest.raises(kvcache.PermissionDeniedError) as e:
            kvcache.Client(d.address, token="wrong").stats()
        assert "unknown bearer token" in e.value.message


def test_each_failure_has_its_class(make_daemon, mini_config, tmp_path):
    d = make_daemon(["--ssd-bytes", "0", "--max-calls-per-tenant", "1"])
    with kvcache.Client(d.address, timeout_s=20) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        with pytest.raises(kvcache.InvalidArgumentError) as e:
            c.register_namespace(mini_config, "mini", 3)  # not a multiple of the ratios
        assert "chunk" in e.value.message
        with pytest.raises(kvcache.NotFoundError):
            c.lookup(kvcache.Namespace(999, ns.root_key, ns.chunk_bytes, 64, 1), [1] * 64)
        payload = np.ones(ns.chunk_bytes, np.uint8)
        with pytest.raises(kvcache.FailedPreconditionError):  # durable, and no SSD tier
            c.store(ns, [1] * 64, payload, durable=True)
        assert c.store(ns, [1] * 64, payload, durable=False).stored == 1
        # One call in flight per tenant: a second call while a store stream is open.
        first = c.store_requests(ns, [2] * 64, payload, False, 0, None)[0]
        go_on = threading.Event()

        def held_open():
            yield first
            go_on.wait(20)

        call = c._store.future(held_open(), timeout=20)
        time.sleep(0.3)
        with pytest.raises(kvcache.ResourceExhaustedError) as e:
            c.stats()
        assert "in flight" in e.value.message
        go_on.set()
        assert call.result().stored == 1
    with pytest.raises(kvcache.UnavailableError):
        kvcache.Client(f"127.0.0.1:{d.port + 1 if d.port < 65535 else 1}", timeout_s=0.5).stats()
    with pytest.raises(kvcache.DataLossError):
        _wire.split_fetch_response(b"\x0a\x10" + b"k" * 4)  # a key field past the end


def test_bad_arguments_are_refused_before_any_call(mini_config):
    # Nobody listens there: a call would be UnavailableError, not InvalidArgumentError.
    c = kvcache.Client("127.0.0.1:1", timeout_s=0.5)
    ns = kvcache.Namespace(1, bytes(16), 100, 4, 1, vocab_size=512)
    with pytest.raises(kvcache.InvalidArgumentError, match="payloads are 99 bytes"):
        c.store(ns, [1, 2, 3, 4], bytes(99))
    with pytest.raises(kvcache.InvalidArgumentError, match=r"tokens\[2\] is 512"):
        c.store(ns, [1, 2, 512, 4], bytes(100))
    # Fewer tokens than a chunk: nothing to store, no call made (nobody listens).
    assert c.store(ns, [1, 2, 3], b"") == kvcache.StoreResult(0, 0, [], 0)
    with pytest.raises(kvcache.InvalidArgumentError, match="payloads are 100 bytes; 0 chunks"):
        c.store(ns, [1, 2, 3], bytes(100))  # payloads are the whole chunks' only
    with pytest.raises(kvcache.InvalidArgumentError, match=r"tokens\[0\] is -1"):
        c.lookup(ns, [-1, 2, 3, 4])
    with pytest.raises(kvcache.InvalidArgumentError, match="16 bytes"):
        c.fetch(ns, [b"short"])
    with pytest.raises(kvcache.InvalidArgumentError, match=r"payloads\[0\] must be C-contiguous"):
        c.store(ns, [1, 2, 3, 4], [np.zeros(200, np.uint8)[::2]])
    with pytest.raises(kvcache.InvalidArgumentError, match="has no buffer protocol"):
        c.fetch(ns, [bytes(16)], out=[0] * 100)
    with pytest.raises(kvcache.InvalidArgumentError, match="read-only"):
        c.fetch(ns, [bytes(16)], out=bytes(100))
    with pytest.raises(kvcache.InvalidArgumentError, match="need 200"):
        c.fetch(ns, [bytes(16), bytes(16)], out=bytearray(100))
    with pytest.raises(kvcache.InvalidArgumentError, match="destination 0 is 99 bytes; a chunk of this namespace is 100"):
        c.fetch_scattered(ns, [bytes(16)], [memoryview(bytearray(99))])
    with pytest.raises(kvcache.InvalidArgumentError, match="etcd endpoint 'h' is not HOST:PORT"):
        kvcache.connect("etcd://h")
    with pytest.raises(kvcache.UnavailableError, match="etcd at 127.0.0.1:1"):
        kvcache.connect("etcd://127.0.0.1:1", timeout_s=1)
    # A Client is one daemon, always: a cluster address says where to go instead.
    with pytest.raises(kvcache.InvalidArgumentError, match=r"kvcache.connect\(target\)"):
        kvcache.Client("etcd://127.0.0.1:1")
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        c.pin(ns, [bytes(16)], 0)
    for bad in (-1, 2**32, 1.5, True, "64"):
        with pytest.raises(kvcache.InvalidArgumentError, match="chunk_tokens is"):
            c.register_namespace(mini_config, "mini", bad)
    for bad in ("a" * 16, 16, None):
        with pytest.raises(kvcache.InvalidArgumentError, match=r"keys\[0\] is a"):
            c.fetch(ns, [bad])
    with pytest.raises(kvcache.InvalidArgumentError, match="parent is a str"):
        c.store(ns, [1, 2, 3, 4], bytes(100), parent="k" * 16)
    c.close()


def test_shared_memory_path_is_taken_and_equals_grpc(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address, shm_socket=daemon.socket) as local, \
            kvcache.Client(daemon.address, shm_socket="") as remote:
        assert local.shared_memory, local.shm_error
        assert not remote.shared_memory
        ns = local.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 4)
        local.store(ns, tokens, payloads)
        keys = local.chunk_keys(ns, tokens)
        hits = remote.stats()["ram_hits"]
        via_shm = local.fetch(ns, keys)
        assert via_shm.chunks == 4 and via_shm.shm_chunks == 4
        assert remote.stats()["ram_hits"] == hits + 4  # leased by the server, not streamed
        # Fetched again within the lease: a copy from held leases, no call to the server.
        again = local.fetch(ns, keys, out=bytearray(len(via_shm.buffer)))
        assert again.shm_chunks == 4 and again.buffer == via_shm.buffer
        assert remote.stats()["ram_hits"] == hits + 4
        # Deleted by this client: gone from its held leases at once.
        assert local.delete(ns, keys[3:]) == 1
        assert local.fetch(ns, keys).chunks == 3
        local.store(ns, tokens, payloads)
        via_grpc = remote.fetch(ns, keys)
        assert via_grpc.shm_chunks == 0
        assert bytes(via_shm.buffer) == bytes(via_grpc.buffer) == payloads.tobytes()


def flip_bit_in_daemon_ram(pid, arena_offset, bit):
    """One bit of the daemon's RAM arena (pool 0), written as a DRAM fault would be:
    through /proc/PID/mem (the test started the daemon)."""
    with open(f"/proc/{pid}/maps") as maps:
        line = next(l for l in maps if "kvcache-ram-pool-0" in l and " rw-s " in l)
    base = int(line.split("-", 1)[0], 16)
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(base + arena_offset)
        b = mem.read(1)[0]
        mem.seek(base + arena_offset)
        mem.write(bytes([b ^ (1 << bit)]))


def test_a_held_lease_never_hands_out_a_chunk_the_scrub_found_corrupt(make_daemon, seed,
                                                                       mini_config):
    """Fetching again within a lease copies from shared memory with no call; a chunk the
    daemon's RAM scrub has since found corrupt fails the copy's checksum, so the client
    asks again and gets the SSD copy."""
    rng = np.random.default_rng(seed)
    d = make_daemon(["--ram-scrub-mbps", "200"])
    with kvcache.Client(d.address, shm_socket=d.socket, lease_ms=60000) as c:
        assert c.shared_memory, c.shm_error
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 4)
        c.store(ns, tokens, payloads)  # durable: on SSD too
        keys = c.chunk_keys(ns, tokens)
        assert c.fetch(ns, keys).shm_chunks == 4  # leases held from here on
        refs = c._call(c._stub.FetchRefs, pb.FetchRefsRequest(
            namespace_id=ns.id, chunk_keys=keys))
        victim = seed % 4
        assert refs.refs[victim].checksum != 0
        at = refs.refs[victim].arena_offset + (seed >> 8) % ns.chunk_bytes
        flip_bit_in_daemon_ram(d.proc.pid, at, (seed >> 4) % 8)
        print(f"flipped a bit of chunk {victim} at arena offset {at}")
        deadline = time.monotonic() + 30
        while c.stats()["ram_checksum_failures"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.stats()["ram_checksum_failures"] == 1, "the scrub never found the flipped bit"
        got = c.fetch(ns, keys)
        assert got.chunks == 4
        assert bytes(got.buffer) == payloads.tobytes(), "a held lease handed out the corrupt chunk"


def test_a_refused_tenant_falls_back_to_grpc(make_daemon, seed, mini_config, tmp_path):
    rng = np.random.default_rng(seed)
    (tmp_path / "tokens").write_text("tok-a acme\ntok-b globex\n")
    d = make_daemon(["--auth-tokens", str(tmp_path / "tokens"), "--shm-tenants", "acme"])
    with kvcache.Client(d.address, token="tok-b", shm_socket=d.socket) as b:
        assert not b.shared_memory and "may not" in b.shm_error
        ns = b.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 2)
        b.store(ns, tokens, payloads)
        got = b.fetch(ns, b.chunk_keys(ns, tokens))
        assert got.chunks == 2 and got.shm_chunks == 0 and bytes(got.buffer) == payloads.tobytes()


def test_a_client_outlives_a_daemon_restart(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)
    with kvcache.Client(daemon.address, shm_socket=daemon.socket, lease_ms=300) as c:
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens, payloads = random_prefix(rng, ns, 3)
        c.store(ns, tokens, payloads)  # durable: survives the restart
        keys = c.chunk_keys(ns, tokens)
        assert c.fetch(ns, keys).shm_chunks == 3
        arena = c._arena.id
        daemon.restart(signal.SIGKILL)
        time.sleep(0.4)  # the leases this client holds in the old arena end
        assert c.lookup(ns, tokens).matched_chunks == 3
        got = c.fetch(ns, keys)  # SSD → RAM over gRPC, then a new arena for next time
        assert got.chunks == 3 and bytes(got.buffer) == payloads.tobytes()
        got = c.fetch(ns, keys)
        assert got.chunks == 3 and bytes(got.buffer) == payloads.tobytes()
        assert c.shared_memory and c._arena.id != arena and got.shm_chunks == 3


def test_async_client_does_what_the_blocking_one_does(daemon, seed, mini_config):
    rng = np.random.default_rng(seed)

    async def session():
        async with kvcache.AsyncClient(daemon.address, shm_socket=daemon.socket) as c:
            assert c.shared_memory, c.shm_error
            ns = await c.register_namespace(mini_config, "mini", 64)
            tokens, payloads = random_prefix(rng, ns, 4)
            r = await c.store(ns, tokens, payloads, durable=False, ttl_s=3600)
            assert r.stored == 4
            m = await c.lookup(ns, tokens)
            assert m.matched_chunks == 4
            assert (await c.lookup_keys(ns, m.keys)).matched_chunks == 4
            out = np.zeros(payloads.size, np.uint8)
            got = await c.fetch(ns, m.keys, out=out)
            assert got.chunks == 4 and got.shm_chunks == 4 and np.array_equal(out, payloads)
            streamed = b"".join([bytes(p) async for _, _, p in c.fetch_iter(ns, m.keys)])
            assert streamed == payloads.tobytes()
            assert await c.pin(ns, m.keys, 60) == 4
            assert await c.unpin(ns, m.keys) == 4
            assert await c.delete(ns, m.keys[3:]) == 1
            assert (await c.fetch(ns, m.keys)).chunks == 3
            assert (await c.stats())["ram_chunks"] >= 3
            with pytest.raises(kvcache.NotFoundError):
                await c.lookup(kvcache.Namespace(999, ns.root_key, ns.chunk_bytes, 64, 1), [1] * 64)

    asyncio.run(session())


def test_the_worker_example_reuses_its_prefix(daemon, seed):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    r = run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                          "examples", "worker.py"),
             "--server", daemon.address, "--shm-socket", daemon.socket, "--config", MINI_CONFIG,
             "--model-id", "mini", "--chunk-tokens", "64", "--turns", "3", "--seed",
             str(seed % 2**32)], env=env)
    assert r.returncode == 0, r.stderr
    turns = [line for line in r.stdout.splitlines() if line.startswith("turn")]
    assert len(turns) == 3
    assert "reused 0 " in turns[0]
    assert "reused 640 (10 chunks from shared memory)" in turns[1], turns[1]


def test_a_call_past_the_tenant_limit_is_refused_at_once(make_daemon, mini_config):
    # More calls held open than one HTTP/2 connection used to allow (256): the next call
    # must reach the daemon and be refused, not wait in the transport for its deadline.
    d = make_daemon(["--max-calls-per-tenant", "300"])
    with kvcache.Client(d.address, timeout_s=30) as c:
        c.register_namespace(mini_config, "mini", 64)
        go_on = threading.Event()

        def held_open():
            go_on.wait(60)
            return
            yield  # a request stream that sends nothing until released

        calls = [c._store.future(held_open(), timeout=90) for _ in range(300)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until all 300 hold their slot
            time.sleep(0.2)
            try:
                c.stats()
            except kvcache.ResourceExhaustedError:
                break
        started = time.monotonic()
        with pytest.raises(kvcache.ResourceExhaustedError) as e:
            c.stats()
        assert time.monotonic() - started < 5
        assert "300" in e.value.message
        go_on.set()
        for call in calls:
            assert call.result().stored == 0

