"""The Python client on a real cluster: etcd (Debian's) and three kvcached nodes with
--cluster. The placement rule matches the published vectors; a prefix stored through one
cluster client sits on exactly its ranked owners and another fetches it byte-exact; a
node killed with SIGKILL is routed around; with etcd stopped the membership is stale."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import kvcache
from conftest import SOURCE_DIR, Daemon, free_port


class Etcd:
    """Debian's etcd; with tls=(cert, key, ca, client EtcdSecurity) it serves https (and
    with client_certs asks for client certificates signed by ca)."""

    def __init__(self, data_dir, tls=None, client_certs=False):
        self.data_dir = str(data_dir)
        self.tls = tls
        self.client_certs = client_certs
        self.port, self.peer = free_port(), free_port()
        while self.peer == self.port:
            self.peer = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"etcd://127.0.0.1:{self.port}"

    def start(self):
        scheme = "https" if self.tls else "http"
        client, peer = f"{scheme}://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
        tls = [] if not self.tls else [f"--cert-file={self.tls[0]}", f"--key-file={self.tls[1]}"]
        if self.client_certs:
            tls += ["--client-cert-auth", f"--trusted-ca-file={self.tls[2]}"]
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name=t", f"--data-dir={self.data_dir}",
             f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=t={peer}", "--log-level=error"] + tls,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                kvcache.membership.MembershipWatch([f"127.0.0.1:{self.port}"], 0.5,
                                                 self.tls[3] if self.tls else None).close()
                return
            except kvcache.KvcacheError:
                assert time.monotonic() < deadline, "etcd did not start"
                time.sleep(0.1)

    def stop(self):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
            self.proc = None


def wait_for(cond, seconds):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def cluster(tmp_path):
    etcd = Etcd(tmp_path / "etcd")
    nodes = [Daemon(tmp_path / f"n{i}", ["--cluster", etcd.url, "--node-id", f"n{i}",
                                         "--cluster-lease-seconds", "2"]) for i in range(3)]
    yield etcd, nodes
    for n in nodes:
        n.stop(signal.SIGKILL)
    etcd.stop()


def test_ranking_matches_the_published_vectors():
    with open(os.path.join(SOURCE_DIR, "tests", "cluster", "placement_vectors.json")) as f:
        doc = json.load(f)
    assert doc["rule"] == kvcache.cluster.PLACEMENT_RULE
    for v in doc["vectors"]:
        key = bytes.fromhex(v["key"])
        assert kvcache.rank_nodes(key, doc["nodes"]) == v["ranking"]
        for n in doc["nodes"]:
            assert format(kvcache.cluster.rendezvous_weight(key, n), "016x") == v["weights"][n]


def test_the_routing_vectors_are_the_independent_scripts():
    """tests/cluster/lookup_plan_vectors.json is what scripts/lookup_plan_vectors.py writes —
    an implementation of the rules of its own, importing neither client — so each client's
    planner is held to vectors it did not write."""
    import sys
    script = os.path.join(SOURCE_DIR, "scripts", "lookup_plan_vectors.py")
    with open(script) as f:
        assert "kvcache" not in "".join(l for l in f if l.startswith(("import", "from")))
    written = subprocess.run([sys.executable, script], check=True, capture_output=True,
                             text=True).stdout
    with open(os.path.join(SOURCE_DIR, "tests", "cluster", "lookup_plan_vectors.json")) as f:
        assert f.read() == written


def test_lookup_plans_match_the_published_vectors():
    """The same vectors the C++ planner is held to (scripts/lookup_plan_vectors.py)."""
    with open(os.path.join(SOURCE_DIR, "tests", "cluster", "lookup_plan_vectors.json")) as f:
        doc = json.load(f)
    keys = [bytes.fromhex(k) for k in doc["keys"]]
    assert len(doc["cases"]) >= 6
    for case in doc["cases"]:
        plan = kvcache.cluster.plan_lookup(keys, case["nodes"], case["ask"])
        assert {n: p for n, p in zip(case["nodes"], plan)} == case["plan"]
    # The order a fetch asks nodes in: holders first, rotated to the reader's pick.
    assert len(doc["fetch_orders"]) >= 100
    rotated = 0
    for case in doc["fetch_orders"]:
        nodes = doc["memberships"][case["membership"]]
        order = kvcache.cluster.fetch_order(keys[case["key"]], nodes, case["holders"],
                                            case["replicas"], case["salt"])
        assert order == case["order"]
        rotated += order[0] != kvcache.rank_nodes(keys[case["key"]], nodes)[0]
    assert rotated > 0, "some readers start at another copy than the best-ranked"


def test_a_settled_cluster_is_asked_only_by_each_chunks_ranked_nodes(cluster, seed, mini_config):
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)
    with kvcache.connect(etcd.url, timeout_s=5) as writer:
        assert wait_for(lambda: len(writer.membership.nodes) == 3, 10)
        ns = writer.register_namespace(mini_config, "mini", 64)
        tokens = rng.integers(0, 512, 16 * 64, dtype=np.uint32)
        payloads = rng.integers(1, 256, 16 * ns.chunk_bytes, dtype=np.uint8)
        writer.store(ns, tokens, payloads)  # R = 2
    with kvcache.connect(etcd.url, timeout_s=5, replicas=1, lookup_extra_nodes=0,
                         settle_s=0) as narrow:
        assert wait_for(lambda: len(narrow.membership.nodes) == 3, 10)
        ns = narrow.register_namespace(mini_config, "mini", 64)
        m = narrow.lookup(ns, tokens)
        assert m.matched_chunks == 16
        assert narrow.lookup_fanout == {"lookups": 1, "wide": 0,
                                        "nodes": narrow.lookup_fanout["nodes"], "keys": 16}
        got = narrow.fetch(ns, m.matched_keys)
        assert bytes(got.buffer) == payloads.tobytes()
    with kvcache.connect(etcd.url, timeout_s=5, replicas=1, lookup_extra_nodes=0) as unsettled:
        assert wait_for(lambda: len(unsettled.membership.nodes) == 3, 10)
        ns = unsettled.register_namespace(mini_config, "mini", 64)
        assert unsettled.lookup(ns, tokens).matched_chunks == 16
        assert unsettled.lookup_fanout["wide"] == 1 and unsettled.lookup_fanout["keys"] == 48


def test_prefix_on_its_owners_and_routed_around_a_dead_node(cluster, seed, mini_config):
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)
    c = kvcache.connect(etcd.url, timeout_s=5)
    assert isinstance(c, kvcache.ClusterClient)
    assert wait_for(lambda: len(c.membership.nodes) == 3, 10)
    ns = c.register_namespace(mini_config, "mini", 64)
    tokens = rng.integers(0, 512, 48 * 64, dtype=np.uint32)
    payloads = rng.integers(1, 256, 48 * ns.chunk_bytes, dtype=np.uint8)
    st = c.store(ns, tokens, payloads)
    assert st.stored == 48 * 2

    other = kvcache.connect(etcd.url, timeout_s=5)
    ns2 = other.register_namespace(mini_config, "mini", 64)
    assert ns2.id == ns.id
    m = other.lookup(ns, tokens)
    assert m.matched_chunks == 48
    assert other.lookup_keys(ns, m.keys).matched_chunks == 48  # the keys a worker holds
    got = other.fetch(ns, m.matched_keys)
    assert got.chunks == 48 and bytes(got.buffer) == payloads.tobytes()
    assert len(other.fetched_from) == 3, "a long prefix streams from every node"

    # Node by node: chunk c is on node i exactly when i is one of its ranked owners.
    misplaced = 0
    for i, node in enumerate(nodes):
        direct = kvcache.Client(node.address, shm_socket="")
        tiers = direct.tiers_of(ns, m.keys)
        direct.close()
        for key, tier in zip(m.keys, tiers):
            misplaced += (f"n{i}" in c.owners(key)) != (tier != "none")
    assert misplaced == 0

    nodes[1].stop(signal.SIGKILL)
    got = other.fetch(ns, m.matched_keys)
    assert got.chunks == 48 and bytes(got.buffer) == payloads.tobytes()
    assert wait_for(lambda: len(other.membership.nodes) == 2, 10)
    etcd.stop()
    assert wait_for(lambda: other.membership.stale, 10)
    assert len(other.membership.nodes) == 2
    got = other.fetch(ns, m.matched_keys)
    assert got.chunks == 48 and bytes(got.buffer) == payloads.tobytes()
    stats = other.stats()
    assert stats["membership"]["stale"] and set(stats["nodes"]) == {"n0", "n2"}
    other.close()
    c.close()


def test_a_caller_keyed_namespace_places_pages_on_their_owners(cluster, seed):
    """Engine-keyed pages (kvcache.integrations) through etcd://: each page on its R ranked
    owners, found and fetched byte-exact by another cluster client, also after one of its
    owners is SIGKILLed."""
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)
    with kvcache.connect(etcd.url, timeout_s=5) as c:
        assert wait_for(lambda: len(c.membership.nodes) == 3, 10)
        ns = c.register_keyed_namespace("sglang:m", 3000, 16)
        keys = c.caller_keys(ns, [rng.bytes(32).hex() for _ in range(12)])
        pages = rng.integers(0, 256, 12 * 3000, dtype=np.uint8)
        assert c.store_keys(ns, keys, pages).stored == 12 * 2
        for i, node in enumerate(nodes):
            direct = kvcache.Client(node.address, shm_socket="")
            tiers = direct.tiers_of(direct.register_keyed_namespace("sglang:m", 3000, 16), keys)
            direct.close()
            assert [f"n{i}" in c.owners(k) for k in keys] == [t != "none" for t in tiers]
    nodes[0].stop(signal.SIGKILL)
    with kvcache.connect(etcd.url, timeout_s=5) as other:
        assert wait_for(lambda: len(other.membership.nodes) == 2, 10)
        ns2 = other.register_keyed_namespace("sglang:m", 3000, 16)
        assert ns2.id == ns.id
        assert other.lookup_keys(ns2, keys).matched_chunks == 12
        got = other.fetch(ns2, keys)
        assert got.chunks == 12 and bytes(got.buffer) == pages.tobytes()
        tiers = other.tiers_of(ns2, keys[:3] + other.caller_keys(ns2, ["absent"]) + keys[3:5])
        assert [t != "none" for t in tiers] == [True] * 3 + [False] + [True] * 2
        halves = [[bytearray(1000), bytearray(2000)] for _ in keys]
        assert other.fetch_scattered(ns2, keys, halves) == 12
        assert b"".join(bytes(a) + bytes(b) for a, b in halves) == pages.tobytes()

    # SGLang's backend on the same cluster (extra_config target "etcd://…").
    torch = pytest.importorskip("torch")
    from kvcache.integrations.sglang import KvcacheHiCacheStorage
    from test_integrations import PageFirstHostPool, sglang_page_hashes, slots, storage_config
    pool = PageFirstHostPool(rng)
    storage = KvcacheHiCacheStorage(storage_config(etcd.url), {})
    storage.register_mem_pool_host(pool)
    page_keys = sglang_page_hashes(rng.integers(0, 1000, 5 * pool.page_size).tolist(), pool.page_size)
    want = [pool.page(p * pool.page_size) for p in range(5)]
    assert storage.batch_set_v1(page_keys, slots(0, 5, pool.page_size)) == [True] * 5
    assert storage.batch_exists(page_keys) == 5
    assert storage.batch_get_v1(page_keys, slots(8, 5, pool.page_size)) == [True] * 5
    assert [pool.page((8 + p) * pool.page_size) for p in range(5)] == want
    assert storage.stats["failed_calls"] == 0
    storage.close()


def make_certificates(d):
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed."""
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    steps = [
        "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key -out ca.pem",
        "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr",
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile server.ext -out server.pem",
        "req -newkey rsa:2048 -nodes -subj /CN=kvcache-node -keyout client.key -out client.csr",
        "x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out client.pem",
    ]
    for step in steps:
        subprocess.run(["openssl"] + step.split(), cwd=d, check=True, capture_output=True)


def test_client_certificates_reach_an_etcd_that_asks_for_them(tmp_path):
    make_certificates(tmp_path)
    f = lambda name: str(tmp_path / name)
    cert = kvcache.EtcdSecurity(ca_file=f("ca.pem"), cert_file=f("client.pem"),
                                key_file=f("client.key"))
    etcd = Etcd(tmp_path / "etcd", tls=(f("server.pem"), f("server.key"), f("ca.pem"), cert),
                client_certs=True)
    try:
        with kvcache.connect(etcd.url, timeout_s=2, etcd_security=cert) as c:
            assert c.membership.nodes == [] and not c.membership.stale
        with pytest.raises(kvcache.UnavailableError):  # the CA alone: no certificate
            kvcache.connect(etcd.url, timeout_s=2,
                           etcd_security=kvcache.EtcdSecurity(ca_file=f("ca.pem")))
        with pytest.raises(kvcache.InvalidArgumentError, match="go together"):
            kvcache.connect(etcd.url, etcd_security=kvcache.EtcdSecurity(
                ca_file=f("ca.pem"), cert_file=f("client.pem")))
    finally:
        etcd.stop()


def enable_etcd_users(port, security, root_password):
    """A root user, then authentication on (etcd's recipe), over etcd's gRPC API."""
    import etcd3
    from etcd3 import etcdrpc
    c = etcd3.client(host="127.0.0.1", port=port, ca_cert=security.ca_file or None,
                     cert_key=security.key_file or None, cert_cert=security.cert_file or None,
                     timeout=5)
    auth = etcdrpc.AuthStub(c.channel)
    auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=root_password), 5)
    auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
    auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
    c.close()


def test_a_cluster_on_an_etcd_with_client_certificates_and_users(tmp_path, seed, mini_config):
    # TLS, a client certificate and a password at once: over etcd's gRPC API the pair
    # combines (its JSON gateway refuses it, CVE-2018-16886).
    make_certificates(tmp_path)
    f = lambda name: str(tmp_path / name)
    cert = kvcache.EtcdSecurity(ca_file=f("ca.pem"), cert_file=f("client.pem"),
                                key_file=f("client.key"))
    etcd = Etcd(tmp_path / "etcd", tls=(f("server.pem"), f("server.key"), f("ca.pem"), cert),
                client_certs=True)
    node = None
    try:
        enable_etcd_users(etcd.port, cert, "pw-root")
        root = kvcache.EtcdSecurity(ca_file=f("ca.pem"), cert_file=f("client.pem"),
                                    key_file=f("client.key"), user="root", password="pw-root")
        (tmp_path / "password").write_text("pw-root\n")
        node = Daemon(tmp_path / "n0", ["--cluster", etcd.url, "--node-id", "n0",
                                        "--etcd-ca", f("ca.pem"), "--etcd-cert", f("client.pem"),
                                        "--etcd-key", f("client.key"), "--etcd-user", "root",
                                        "--etcd-password-file", f("password")])
        with kvcache.connect(etcd.url, timeout_s=5, etcd_security=root) as c:
            assert wait_for(lambda: len(c.membership.nodes) == 1, 10), c.membership
            rng = np.random.default_rng(seed)
            ns = c.register_namespace(mini_config, "mini", 64)
            tokens = rng.integers(0, 512, 4 * 64, dtype=np.uint32)
            payloads = rng.integers(1, 256, 4 * ns.chunk_bytes, dtype=np.uint8)
            assert c.store(ns, tokens, payloads).stored == 4
            got = c.fetch(ns, c.lookup(ns, tokens).matched_keys)
            assert bytes(got.buffer) == payloads.tobytes()
        # A wrong password is refused naming the user; the certificate alone (its CN is no
        # etcd user) reads nothing; no CA at all reaches nothing; a password without a user
        # is a mistake.
        wrong = kvcache.EtcdSecurity(ca_file=f("ca.pem"), cert_file=f("client.pem"),
                                     key_file=f("client.key"), user="root", password="no")
        with pytest.raises(kvcache.PermissionDeniedError, match="user 'root'"):
            kvcache.connect(etcd.url, timeout_s=2, etcd_security=wrong)
        with pytest.raises(kvcache.PermissionDeniedError, match="etcd runs with users"):
            kvcache.connect(etcd.url, timeout_s=2, etcd_security=cert)
        with pytest.raises(kvcache.UnavailableError):
            kvcache.connect(etcd.url, timeout_s=2)
        with pytest.raises(kvcache.InvalidArgumentError, match="without an etcd user"):
            kvcache.connect(etcd.url, etcd_security=kvcache.EtcdSecurity(password="x"))
    finally:
        if node is not None:
            node.stop(signal.SIGKILL)
        etcd.stop()


def test_a_record_under_another_key_does_not_rename_a_node(cluster):
    """A client's first read takes a node's id from its key, as the watch does: a record
    under any other key that names n1 (with an address of its own) is not n1."""
    import base64
    import urllib.request
    etcd, nodes = cluster
    rogue = {"id": "n1", "address": "127.0.0.1:1", "generation": 1}
    body = {"key": base64.b64encode(b"/kvcache/v1/nodes/rogue").decode(),
            "value": base64.b64encode(json.dumps(rogue).encode()).decode()}
    req = urllib.request.Request(f"http://127.0.0.1:{etcd.port}/v3/kv/put",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()
    c = kvcache.connect(etcd.url, timeout_s=5)
    try:
        got = {n.id: n.address for n in c.membership.nodes}
        assert got == {f"n{i}": nodes[i].address for i in range(3)}, got
    finally:
        c.close()


def test_readers_of_a_chunk_share_its_copies(seed):
    """first_holder: each reader's salt picks one of a chunk's copies; over many readers
    each copy gets about its share (the C++ client's cluster::FirstHolder, same rule)."""
    rng = np.random.default_rng(seed)
    key = rng.bytes(16)
    assert kvcache.cluster.first_holder(key, "r", 0) == 0
    for holders in (2, 3):
        picks = [kvcache.cluster.first_holder(key, rng.bytes(8).hex(), holders) for _ in range(3000)]
        for i in range(holders):
            assert abs(picks.count(i) / 3000 - 1 / holders) < 0.05, (i, holders)
    # The same rule as the C++ client: the rendezvous weight of the key and the salt.
    assert kvcache.cluster.first_holder(key, "s", 3) == kvcache.cluster.rendezvous_weight(key, "s") % 3


def test_the_asyncio_cluster_client_stores_and_fetches_a_prefix(cluster, seed, mini_config):
    """kvcache.connect_async("etcd://…"): the cluster client's calls as coroutines, the
    event loop free meanwhile (a ticker keeps running while a fetch is under way)."""
    import asyncio
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)

    async def main():
        async with kvcache.connect_async(etcd.url, timeout_s=5) as c:
            assert isinstance(c, kvcache.AsyncClusterClient)
            assert wait_for(lambda: len(c.cluster.membership.nodes) == 3, 10)
            ns = await c.register_namespace(mini_config, "mini", 64)
            tokens = rng.integers(0, 512, 24 * 64, dtype=np.uint32)
            payloads = rng.integers(0, 256, 24 * ns.chunk_bytes, dtype=np.uint8)
            assert (await c.store(ns, tokens, payloads)).stored == 24 * 2
            m = await c.lookup(ns, tokens)
            assert m.matched_chunks == 24
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)
            t = asyncio.ensure_future(ticker())
            got = await c.fetch(ns, m.matched_keys)
            t.cancel()
            assert got.chunks == 24 and bytes(got.buffer) == payloads.tobytes()
            assert ticks > 1, "the loop ran while the fetch was on its worker thread"
            keyed = await c.register_keyed_namespace("sglang:m", 512)
            keys = c.caller_keys(keyed, ["a", "b"])
            assert (await c.store_keys(keyed, keys, bytes(1024))).stored == 4
            assert (await c.lookup_keys(keyed, keys)).matched_chunks == 2
    asyncio.run(main())


def test_a_chunk_deleted_while_a_node_was_away_is_missing_when_it_returns(cluster, seed,
                                                                          mini_config):
    """The node that missed the delete still holds its copies when it comes back; the
    others remember the delete (tombstones) and the client's lookup treats the chunks as
    missing everywhere (docs/cluster.md, "Deletes")."""
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)
    with kvcache.connect(etcd.url, timeout_s=5) as c:
        assert wait_for(lambda: len(c.membership.nodes) == 3, 10)
        ns = c.register_namespace(mini_config, "mini", 64)
        tokens = rng.integers(0, 512, 8 * 64, dtype=np.uint32)
        payloads = rng.integers(1, 256, 8 * ns.chunk_bytes, dtype=np.uint8)
        c.store(ns, tokens, payloads)  # R = 2: n2 holds about two thirds of the chunks
        keys = c.chunk_keys(ns, tokens)
        nodes[2].stop(signal.SIGKILL)
        assert wait_for(lambda: len(c.membership.nodes) == 2, 10)
        assert c.delete(ns, keys) > 0
        assert c.lookup(ns, tokens).matched_chunks == 0
        nodes[2].start()  # back with its copies
        assert wait_for(lambda: len(c.membership.nodes) == 3, 10)
    with kvcache.connect(nodes[2].address) as direct:
        ns2 = direct.register_namespace(mini_config, "mini", 64)
        still = sum(1 for t in direct.tiers_of(ns2, keys) if t != "none")
    assert still > 0, "the returning node should still hold the copies it had"
    with kvcache.connect(etcd.url, timeout_s=5) as reader:
        assert wait_for(lambda: len(reader.membership.nodes) == 3, 10)
        ns = reader.register_namespace(mini_config, "mini", 64)
        assert reader.lookup(ns, tokens).matched_chunks == 0
        assert reader.tiers_of(ns, keys) == ["none"] * len(keys)
