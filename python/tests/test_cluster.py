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
    def __init__(self, data_dir):
        self.data_dir = str(data_dir)
        self.port, self.peer = free_port(), free_port()
        while self.peer == self.port:
            self.peer = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"etcd://127.0.0.1:{self.port}"

    def start(self):
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name=t", f"--data-dir={self.data_dir}",
             f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=t={peer}", "--log-level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                kvcache.cluster._MembershipWatch([f"127.0.0.1:{self.port}"], 0.5).close()
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


def test_prefix_on_its_owners_and_routed_around_a_dead_node(cluster, seed, mini_config):
    etcd, nodes = cluster
    rng = np.random.default_rng(seed)
    c = kvcache.Client(etcd.url, timeout_s=5)
    assert isinstance(c, kvcache.ClusterClient)
    assert wait_for(lambda: len(c.membership.nodes) == 3, 10)
    ns = c.register_namespace(mini_config, "mini", 64)
    tokens = rng.integers(0, 512, 48 * 64, dtype=np.uint32)
    payloads = rng.integers(1, 256, 48 * ns.chunk_bytes, dtype=np.uint8)
    st = c.store(ns, tokens, payloads)
    assert st.stored == 48 * 2

    other = kvcache.Client(etcd.url, timeout_s=5)
    ns2 = other.register_namespace(mini_config, "mini", 64)
    assert ns2.id == ns.id
    m = other.lookup(ns, tokens)
    assert m.matched_chunks == 48
    got = other.fetch(ns, m.matched_keys)
    assert got.chunks == 48 and bytes(got.buffer) == payloads.tobytes()
    assert len(other.fetched_from) == 3, "a long prefix streams from every node"

    # Node by node: chunk c is on node i exactly when i is one of its ranked owners.
    misplaced = 0
    for i, node in enumerate(nodes):
        direct = kvcache.Client(node.address, shm_socket="")
        tiers = direct._lookup_every(ns, m.keys)
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
