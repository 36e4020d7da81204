"""The cache as many kvcached nodes whose membership is in etcd (docs/cluster.md).

    import kvcache
    with kvcache.connect("etcd://127.0.0.1:2379", token="...") as c:   # a ClusterClient
        ns = c.register_namespace(config, "my-model", chunk_tokens=256)
        match = c.lookup(ns, prompt_tokens)
        got = c.fetch(ns, match.matched_keys, out=page_buffer)

Each chunk lives on its R best-ranked nodes by rendezvous hashing (rank_nodes, the rule
"kvcache-rendezvous-v1" shared with the C++ client). lookup asks every node and merges;
fetch pulls each chunk from a node that holds it, every node's share in parallel, and
asks the next node in the ranking when one fails; store writes each chunk to its R owners
and returns once all R hold it. The membership is read from etcd's v3 gRPC API and
watched (membership.py: the etcd access; this module routes); when etcd cannot be
reached the last membership seen is kept and `membership.stale` says so. Not thread-safe;
use one per thread. `kvcache.connect("etcd://…")` gives one.
"""
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set,
                    Tuple, TypeVar)

import xxhash

from ._common import (ChunkSink, Common, Fetched, Match, StoreResult, check_keys,
                      refuse_caller_keyed, sink_for, writable_view)
from .errors import InvalidArgumentError, KvcacheError, UnavailableError
from .hashing import Namespace, Tokens, as_tokens, chunk_keys
from .membership import (NODES_PREFIX, EtcdSecurity, Membership, MembershipWatch,  # noqa: F401
                         Node, parse_etcd_url)

if TYPE_CHECKING:  # the node clients; client.py imports this module lazily
    from .client import Client

PLACEMENT_RULE = "kvcache-rendezvous-v1"

T = TypeVar("T")


def rendezvous_weight(key: bytes, node_id: str) -> int:
    """XXH3-64 (seed 0) of the 16 key bytes followed by the node id's UTF-8 bytes."""
    return int(xxhash.xxh3_64_intdigest(bytes(key) + node_id.encode()))


def rank_nodes(key: bytes, node_ids: Iterable[str]) -> List[str]:
    """node_ids ordered best owner first: highest weight, then the smaller id."""
    return sorted(node_ids, key=lambda n: (-rendezvous_weight(key, n), n))


def first_holder(key: bytes, reader_salt: str, holders: int) -> int:
    """Which of a chunk's `holders` copies a reader asks first: rendezvous_weight(key,
    reader_salt) mod holders (0 when none). Each reader has its own salt, so the readers of
    a hot chunk share its copies instead of all asking its best-ranked holder (the C++
    client's cluster::FirstHolder)."""
    return rendezvous_weight(key, reader_salt) % holders if holders else 0


def fetch_order(key: bytes, node_ids: Sequence[str], holders: Sequence[str], replicas: int,
                reader_salt: str) -> List[str]:
    """The nodes a fetch asks for `key`, in order: the holders a lookup saw (in its order),
    then every other member by rank; the first `copies` of them (the holders, or the first
    `replicas` ranked nodes when no lookup saw any) rotated to start at this reader's pick
    (first_holder). The client then moves nodes it is skipping to the end. Held to
    tests/cluster/lookup_plan_vectors.json ("fetch_orders") with the C++ client's planner."""
    present = set(node_ids)
    order = [h for h in holders if h in present]
    known = len(order)
    order += [n for n in rank_nodes(key, node_ids) if n not in order]
    copies = known or min(replicas, len(order))
    first = first_holder(key, reader_salt, copies)
    order[:copies] = order[first:copies] + order[:first]
    return order


def plan_lookup(keys: Sequence[bytes], node_ids: Sequence[str], ask: int) -> List[List[int]]:
    """Lookup by ranking (docs/cluster.md): each key is asked of its first `ask` ranked
    nodes (its R owners and the next few), not of every member. Per node (in node_ids'
    order), the indices of the keys to ask it; ask >= len(node_ids): every node, every key.
    Held to tests/cluster/lookup_plan_vectors.json with the C++ client's planner."""
    index = {n: i for i, n in enumerate(node_ids)}
    plan: List[List[int]] = [[] for _ in node_ids]
    if ask >= len(node_ids):
        return [list(range(len(keys))) for _ in node_ids]
    for c, key in enumerate(keys):
        for n in rank_nodes(key, node_ids)[:ask]:
            plan[index[n]].append(c)
    return plan


@dataclass
class _NodeClient:
    node: Node
    client: "Client"
    namespaces: Set[int] = field(default_factory=set)
    skip_until: float = 0.0


class ClusterClient:
    """A cluster of kvcached nodes found through etcd; the API of Client.

    target: "etcd://H:P[,H:P...]". replicas: copies of each chunk (0: 2 when the cluster
    has at least 2 nodes). A node that fails a call is skipped for node_backoff_s.
    etcd_security: an EtcdSecurity when etcd runs with TLS and/or authentication.
    store's `stored` and `already_present` count copies (up to R per chunk). lookup asks
    each chunk's R owners and the next lookup_extra_nodes ranked nodes, every member for
    settle_s after the membership changes.
    """

    def __init__(self, target: str, token: Optional[str] = None, timeout_s: float = 30.0, *,
                 replicas: int = 0, node_backoff_s: float = 2.0,
                 etcd_security: Optional[EtcdSecurity] = None,
                 shm_socket: Optional[str] = None, lookup_extra_nodes: int = 2,
                 settle_s: float = 30.0) -> None:
        if shm_socket:
            raise InvalidArgumentError(
                "shared memory maps one daemon's arena; a cluster client uses gRPC to every node")
        self.target = target
        self.timeout_s = timeout_s
        self._token = token
        self._replicas = replicas
        self._backoff = node_backoff_s
        self._watch = MembershipWatch(parse_etcd_url(target), min(timeout_s, 5.0), etcd_security)
        self._nodes: Dict[str, _NodeClient] = {}
        # namespace id -> how to register it on a node (a node that joins later, a restart)
        self._registrations: Dict[int, Callable[["Client"], Namespace]] = {}
        self._holders: Dict[bytes, List[str]] = {}  # key -> node ids a recent lookup found it on
        self._read_salt = f"reader-{os.urandom(8).hex()}"  # this client's pick among copies
        self._pool = ThreadPoolExecutor(max_workers=16)
        # Lookup by ranking: each key goes to its R owners and lookup_extra_nodes more; to
        # every member for settle_s after the membership last changed (copies may sit
        # anywhere then). lookup_fanout counts what that cost.
        self._lookup_extra = lookup_extra_nodes
        self._repair_grace_s = settle_s
        self._seen_membership: Tuple[Tuple[str, str, int], ...] = ()
        self._membership_changed = 0.0
        self.lookup_fanout: Dict[str, int] = {"lookups": 0, "wide": 0, "nodes": 0, "keys": 0}
        self.fetched_from: Dict[str, int] = {}  # node id -> chunks it served

    def __enter__(self) -> "ClusterClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._watch.close()
        self._pool.shutdown(wait=True)
        for nc in self._nodes.values():
            nc.client.close()
        self._nodes.clear()

    @property
    def membership(self) -> Membership:
        return self._watch.current

    @property
    def replicas(self) -> int:
        n = len(self.membership.nodes)
        return min(self._replicas or (2 if n >= 2 else 1), n)

    def _replicas_for(self, n: int) -> int:
        return min(self._replicas or (2 if n >= 2 else 1), n)

    def owners(self, key: bytes) -> List[str]:
        """The node ids that hold `key` under the current membership."""
        return rank_nodes(key, [n.id for n in self.membership.nodes])[:self.replicas]

    def _members(self) -> List[_NodeClient]:
        from .client import Client
        out: List[_NodeClient] = []
        for n in self.membership.nodes:
            nc = self._nodes.get(n.id)
            if nc is None or nc.node.address != n.address or nc.node.generation != n.generation:
                if nc is not None:
                    nc.client.close()
                nc = _NodeClient(n, Client(n.address, token=self._token, timeout_s=self.timeout_s,
                                           shm_socket="", wait_for_ready=False))
                self._nodes[n.id] = nc
            out.append(nc)
        return out

    def _failed(self, nc: _NodeClient, error: KvcacheError) -> None:
        if isinstance(error, UnavailableError) or error.code is not None and error.code.name in (
                "UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL", "UNKNOWN"):
            nc.skip_until = time.monotonic() + self._backoff

    def _ensure_namespace(self, nc: _NodeClient, ns: Namespace) -> None:
        if ns.id in nc.namespaces:
            return
        reg = self._registrations.get(ns.id)
        if reg is None:
            raise InvalidArgumentError(
                f"namespace {ns.id} was not registered through this cluster client")
        got = reg(nc.client)
        if got.id != ns.id or got.root_key != ns.root_key:
            raise InvalidArgumentError(
                f"node {nc.node.id} gives the namespace id {got.id} (expected {ns.id}): is it "
                "running with --cluster?")
        nc.namespaces.add(ns.id)

    def _on_nodes(self, work: Sequence[Tuple[_NodeClient, Callable[[_NodeClient], T]]]
                  ) -> List[Tuple[T, Optional[KvcacheError]]]:
        """Runs fn(node_client) for each (node_client, fn) in parallel; (result or error).
        (Where the error is set the result is None: the callers look at the error first.)"""
        futures = [self._pool.submit(fn, nc) for nc, fn in work]
        out: List[Tuple[T, Optional[KvcacheError]]] = []
        for f in futures:
            try:
                out.append((f.result(), None))
            except KvcacheError as e:
                out.append((None, e))  # type: ignore[arg-type]
        return out

    def register_namespace(self, model_config_json: str, model_id: str,
                               chunk_tokens: int = 0) -> Namespace:
        return self._register(lambda client: client.register_namespace(
            model_config_json, model_id, chunk_tokens))

    def register_keyed_namespace(self, model_id: str, page_bytes: int,
                                 page_tokens: int = 0) -> Namespace:
        """Client.register_keyed_namespace on every node (see there)."""
        return self._register(lambda client: client.register_keyed_namespace(
            model_id, page_bytes, page_tokens))

    def _register(self, register: Callable[["Client"], Namespace]) -> Namespace:
        """`register(node client)` on every member; the namespace they agree on."""
        nodes = self._members()
        if not nodes:
            raise UnavailableError(f"the cluster at {self.target} has no nodes")
        results = self._on_nodes([(nc, lambda nc: register(nc.client)) for nc in nodes])
        ns: Optional[Namespace] = None
        first_error: Optional[KvcacheError] = None
        for nc, (got, err) in zip(nodes, results):
            if err is not None:
                first_error = first_error or err
                self._failed(nc, err)
                continue
            if ns is None:
                ns = got
            elif got.id != ns.id or got.root_key != ns.root_key:
                raise InvalidArgumentError(
                    f"nodes disagree on the namespace: node {nc.node.id} gives id {got.id}, "
                    f"another {ns.id} (is every node running with --cluster?)")
            nc.namespaces.add(got.id)
        if ns is None:
            assert first_error is not None
            raise first_error
        self._registrations[ns.id] = register
        return ns

    def chunk_keys(self, ns: Namespace, tokens: Tokens) -> List[bytes]:
        refuse_caller_keyed(ns, "chunk_keys(ns, tokens)")
        return chunk_keys(ns.root_key, as_tokens(tokens, ns.vocab_size), ns.chunk_tokens)

    caller_keys = staticmethod(Common.caller_keys)

    def lookup(self, ns: Namespace, tokens: Tokens) -> Match:
        return self.lookup_keys(ns, self.chunk_keys(ns, tokens))

    def lookup_keys(self, ns: Namespace, keys: Sequence[bytes]) -> Match:
        """lookup() by the chunk keys a worker already holds (nothing hashed). Each key is
        asked of its R owners and the next lookup_extra_nodes ranked nodes; of every node
        while the membership changed within the last repair_grace_s."""
        keys = check_keys(keys)
        every = self._tiers_everywhere(ns, keys)
        matched = 0
        while matched < len(keys) and every[matched] != "none":
            matched += 1
        return Match(matched, list(keys), every[:matched], ns.chunk_tokens)

    def tiers_of(self, ns: Namespace, keys: Sequence[bytes]) -> List[str]:
        """The tier of every chunk of `keys` in the cluster (its best-ranked holder's; "none"
        where no node answering has it), not only the leading run's: one lookup, for a
        caller that needs each chunk (an engine's side pools, docs/integrations.md)."""
        return self._tiers_everywhere(ns, check_keys(keys))

    def _tiers_everywhere(self, ns: Namespace, keys: Sequence[bytes]) -> List[str]:
        nodes = [nc for nc in self._members() if nc.skip_until <= time.monotonic()]
        ids = [nc.node.id for nc in nodes]
        version = tuple((n.id, n.address, n.generation) for n in self.membership.nodes)
        if version != self._seen_membership:
            self._seen_membership = version
            self._membership_changed = time.monotonic()
        wide = time.monotonic() - self._membership_changed < self._repair_grace_s
        plan = plan_lookup(keys, ids, len(ids) if wide else
                           self._replicas_for(len(ids)) + self._lookup_extra)
        self.lookup_fanout["lookups"] += 1
        self.lookup_fanout["wide"] += 1 if wide else 0
        self.lookup_fanout["nodes"] += sum(1 for p in plan if p)
        self.lookup_fanout["keys"] += sum(len(p) for p in plan)

        def ask(nc: _NodeClient, idx: List[int]) -> List[str]:  # by key: hashed once here
            self._ensure_namespace(nc, ns)
            tiers, deleted = nc.client.tiers_and_deleted_of(ns, [keys[c] for c in idx])
            every = ["none"] * len(keys)
            for c, t in zip(idx, tiers):
                every[c] = t
            for j in deleted:  # deleted there: missing everywhere (docs/cluster.md)
                every[idx[j]] = "deleted"
            return every
        asked = [(nc, idx) for nc, idx in zip(nodes, plan) if idx]
        results = self._on_nodes([(nc, functools.partial(ask, idx=idx)) for nc, idx in asked])
        answered: Dict[str, List[str]] = {}
        for (nc, _), (tiers, err) in zip(asked, results):
            if err is None and len(tiers) == len(keys):
                answered[nc.node.id] = tiers
            elif err is not None:
                self._failed(nc, err)
        if asked and not answered:
            raise UnavailableError(f"no node of the cluster answered lookup: {results[0][1]}")
        every: List[str] = []
        for c, key in enumerate(keys):
            if any(tiers[c] == "deleted" for tiers in answered.values()):
                self._holders.pop(key, None)
                every.append("none")
                continue
            holders = [n for n in rank_nodes(key, ids)
                       if n in answered and answered[n][c] != "none"]
            if holders:
                self._holders[key] = holders
                every.append(answered[holders[0]][c])
            else:
                self._holders.pop(key, None)
                every.append("none")
        if len(self._holders) > 65536:
            self._holders.clear()
        return every

    def fetch(self, ns: Namespace, keys: Sequence[bytes], out: Optional[Any] = None) -> Fetched:
        """The leading chunks of `keys` that some node holds, copied into `out` back to
        back (a new bytearray if None)."""
        keys = check_keys(keys)
        need = len(keys) * ns.chunk_bytes
        if out is None:
            out = bytearray(need)
        got = self._fetch_into(ns, keys, ChunkSink(ns.chunk_bytes, writable_view(out, need)))
        return Fetched(got, out, ns.chunk_bytes, 0)

    def fetch_scattered(self, ns: Namespace, keys: Sequence[bytes], dsts: Any) -> int:
        """Client.fetch_scattered across the cluster: chunk i straight into dsts[i] (a
        buffer of chunk_bytes, or a list of part buffers), from whichever node holds it."""
        keys = check_keys(keys)
        sink = sink_for(ns, dsts, len(keys))
        return self._fetch_into(ns, keys, sink)

    def _fetch_into(self, ns: Namespace, keys: Sequence[bytes], sink: ChunkSink) -> int:
        """How many leading chunks of keys reached sink, each from a node that holds it."""
        nodes = {nc.node.id: nc for nc in self._members()}
        ids = sorted(nodes)
        now = time.monotonic()
        cands: List[List[str]] = []
        for k in keys:
            order = fetch_order(k, ids, self._holders.get(k, []), self._replicas_for(len(ids)),
                                self._read_salt)
            order.sort(key=lambda n: nodes[n].skip_until > now)  # stable: skipped ones last
            cands.append(order)
        nxt = [0] * len(keys)
        done = [False] * len(keys)
        while True:
            limit = next((c for c in range(len(keys)) if not done[c] and nxt[c] >= len(cands[c])),
                         len(keys))
            share: Dict[str, List[int]] = {}
            for c in range(limit):
                if not done[c]:
                    share.setdefault(cands[c][nxt[c]], []).append(c)
            if not share:
                break

            def pull(nc: _NodeClient, idx: List[int]) -> int:
                self._ensure_namespace(nc, ns)
                # Each chunk straight to its place in the caller's buffer.
                return nc.client.fetch_scattered(ns, [keys[c] for c in idx],
                                                 [sink.dest(c) for c in idx])
            work = [(nodes[n], lambda nc, idx=idx: pull(nc, idx)) for n, idx in share.items()]
            for (n, idx), (got, err) in zip(share.items(), self._on_nodes(work)):
                if err is not None:
                    self._failed(nodes[n], err)
                    for c in idx:
                        nxt[c] += 1
                    continue
                for j in range(got):
                    done[idx[j]] = True
                self.fetched_from[n] = self.fetched_from.get(n, 0) + got
                if got < len(idx):
                    nxt[idx[got]] += 1  # not on this node; those after it not asked
        leading = 0
        while leading < len(keys) and done[leading]:
            leading += 1
        return leading

    def store(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool = True,
                  ttl_s: int = 0, parent: Optional[bytes] = None) -> StoreResult:
        """Stores the whole chunks of `tokens` on each chunk's R owners (a partial last chunk
        is left out; the result's `tokens` says how many were covered); returns once all R
        hold every chunk (UnavailableError naming the first chunk with fewer copies)."""
        requests, keys = Common.store_plan(ns, tokens, payloads, durable, ttl_s, parent)
        return self._store_on_owners(ns, requests, keys)

    def store_keys(self, ns: Namespace, keys: Sequence[bytes], payloads: Any, durable: bool = True,
                   ttl_s: int = 0, chain: bool = True) -> StoreResult:
        """Client.store_keys on each chunk's R owners; returns once all R hold every chunk."""
        requests, keys = Common.keyed_store_plan(ns, keys, payloads, durable, ttl_s, chain)
        return self._store_on_owners(ns, requests, keys)

    def _store_on_owners(self, ns: Namespace, requests: Sequence[Any],
                         keys: List[bytes]) -> StoreResult:
        chunks = len(requests)
        nodes = {nc.node.id: nc for nc in self._members()}
        if not nodes:
            raise UnavailableError(f"the cluster at {self.target} has no nodes")
        want = self.replicas
        now = time.monotonic()
        order: List[List[str]] = []
        for k in keys:
            o = rank_nodes(k, sorted(nodes))
            o.sort(key=lambda n: nodes[n].skip_until > now)
            order.append(o)
        copies, nxt = [0] * chunks, [0] * chunks
        stored = present = 0
        last_error: Optional[KvcacheError] = None
        while True:
            share: Dict[str, List[int]] = {}
            for c in range(chunks):
                asked = copies[c]
                while asked < want and nxt[c] < len(order[c]):
                    share.setdefault(order[c][nxt[c]], []).append(c)
                    nxt[c] += 1
                    asked += 1
            if not share:
                break

            def put(nc: _NodeClient, idx: List[int]) -> StoreResult:
                self._ensure_namespace(nc, ns)
                return nc.client.send_store(ns, [requests[c] for c in idx])
            work = [(nodes[n], lambda nc, idx=idx: put(nc, idx)) for n, idx in share.items()]
            for (n, idx), (got, err) in zip(share.items(), self._on_nodes(work)):
                if err is not None:
                    self._failed(nodes[n], err)
                    last_error = err
                    if err.code is not None and err.code.name in ("INVALID_ARGUMENT", "NOT_FOUND",
                                                                  "PERMISSION_DENIED"):
                        raise err
                    continue
                for c in idx:
                    copies[c] += 1
                stored += got.stored
                present += got.already_present
        for c in range(chunks):
            if copies[c] < want:
                raise UnavailableError(f"chunk {c} has {copies[c]} of {want} copies: {last_error}")
        return StoreResult(stored, present, keys, chunks * ns.chunk_tokens)

    def _everywhere(self, ns: Namespace, call: Callable[["Client"], int]) -> int:
        nodes = self._members()

        def run(nc: _NodeClient) -> int:
            self._ensure_namespace(nc, ns)
            return call(nc.client)
        total = 0
        for nc, (n, err) in zip(nodes, self._on_nodes([(nc, run) for nc in nodes])):
            if err is not None:
                raise type(err)(f"node {nc.node.id}: {err.message}", err.code)
            total += n
        return total

    def pin(self, ns: Namespace, keys: Sequence[bytes], ttl_s: int) -> int:
        """Pins every copy; returns the copies pinned."""
        return self._everywhere(ns, lambda c: c.pin(ns, keys, ttl_s))

    def unpin(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        return self._everywhere(ns, lambda c: c.unpin(ns, keys))

    def delete(self, ns: Namespace, keys: Sequence[bytes]) -> int:
        """Deletes every copy; returns the copies deleted."""
        for k in check_keys(keys):
            self._holders.pop(k, None)
        return self._everywhere(ns, lambda c: c.delete(ns, keys))

    def stats(self) -> Dict[str, Any]:
        """{"membership": ..., "nodes": {id: stats dict or {"error": message}}}."""
        nodes = self._members()
        per: Dict[str, Any] = {}
        for nc, (s, err) in zip(nodes, self._on_nodes([(nc, lambda nc: nc.client.stats())
                                                        for nc in nodes])):
            per[nc.node.id] = s if err is None else {"error": err.message}
        m = self.membership
        return {"membership": {"nodes": [n.__dict__ for n in m.nodes], "stale": m.stale,
                               "stale_reason": m.stale_reason, "replicas": self.replicas},
                "nodes": per, "fetched_from": dict(self.fetched_from)}
