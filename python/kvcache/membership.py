"""The cluster's membership as etcd holds it (docs/cluster.md): each kvcached node puts
NODES_PREFIX + its id under a lease; a client reads the prefix through etcd's v3 gRPC API
(Debian's python3-etcd3) and watches it, keeping the last membership it saw (marked stale)
while etcd cannot be reached. Only etcd access lives here; routing is cluster.py's.
"""
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import grpc

try:  # only a cluster client needs it; one daemon works without
    import etcd3
    import etcd3.exceptions
    from etcd3 import etcdrpc
    from etcd3.etcdrpc import kv_pb2
    _ETCD3_MISSING = ""
except ImportError as e:  # pragma: no cover - exercised where python3-etcd3 is absent
    _ETCD3_MISSING = str(e)

from .errors import InvalidArgumentError, KvcacheError, PermissionDeniedError, UnavailableError

NODES_PREFIX = b"/kvcache/v1/nodes/"


def parse_etcd_url(url: str) -> List[str]:
    """"etcd://H:P[,H:P...]" -> ["H:P", ...]; InvalidArgumentError naming what is wrong."""
    if not url.startswith("etcd://"):
        raise InvalidArgumentError(f"cluster address {url!r} does not start with etcd://")
    eps = [e for e in url[len("etcd://"):].split(",") if e]
    if not eps:
        raise InvalidArgumentError("etcd:// names no endpoint")
    for e in eps:
        host, _, port = e.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgumentError(f"etcd endpoint {e!r} is not HOST:PORT (in {url})")
    return eps


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach an etcd that runs with TLS and/or authentication (as kvcached's
    --etcd-ca, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file)."""
    ca_file: str = ""    # set: https, trusting this CA bundle for etcd's certificate
    cert_file: str = ""  # with key_file: the client certificate (etcd --client-cert-auth)
    key_file: str = ""
    user: str = ""       # set: etcd authentication as this user
    password: str = ""

    def check(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgumentError("an etcd client certificate and its key go together")
        if self.cert_file and not self.ca_file:
            raise InvalidArgumentError("an etcd client certificate needs TLS: give the etcd CA too")
        if self.password and not self.user:
            raise InvalidArgumentError("an etcd password without an etcd user")
        if self.user and not self.password:
            raise InvalidArgumentError(f"etcd user {self.user!r} without a password")


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    generation: int = 0
    ram_bytes: int = 0
    ssd_bytes: int = 0


@dataclass(frozen=True)
class Membership:
    nodes: List[Node]  # by id
    stale: bool = False
    stale_reason: str = ""
    revision: int = 0


def _node_from(value: bytes) -> Optional[Node]:
    try:
        d = json.loads(value)
        return Node(d["id"], d["address"], int(d.get("generation", 0)),
                    int(d.get("ram_bytes", 0)), int(d.get("ssd_bytes", 0)))
    except (ValueError, KeyError, TypeError):
        return None  # a record that is not a node


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _node_id(key: bytes) -> str:
    return key[len(NODES_PREFIX):].decode(errors="replace")


class MembershipWatch:
    """Reads the node records from etcd, then watches them on a thread. Over gRPC, so a
    client certificate and a user combine (etcd's JSON gateway refuses that pair)."""

    def __init__(self, endpoints: List[str], timeout_s: float,
                 security: Optional[EtcdSecurity] = None) -> None:
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        if _ETCD3_MISSING:
            raise UnavailableError(f"a cluster client needs python3-etcd3 (apt-get install "
                                   f"python3-etcd3): {_ETCD3_MISSING}")
        self._security = security or EtcdSecurity()
        self._security.check()
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self._security, name)
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as e:
                    raise InvalidArgumentError(f"etcd TLS files: {e}") from None
        self._stop = False
        self._lock = threading.Lock()
        self._nodes: Dict[str, Node] = {}
        self._client: Any = None
        self._cancel_watch: Any = None
        self.current = self._reload()  # raises UnavailableError if etcd does not answer
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _error(self, e: BaseException, what: str) -> KvcacheError:
        """An etcd failure as the package's error: refused credentials are
        PermissionDenied (naming the user), anything else Unavailable."""
        code = e.code() if isinstance(e, grpc.RpcError) and hasattr(e, "code") else None
        details = e.details() if isinstance(e, grpc.RpcError) and hasattr(e, "details") else str(e)
        user = self._security.user
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
                code == grpc.StatusCode.INVALID_ARGUMENT and "user" in (details or "")):
            if not user:
                return PermissionDeniedError(
                    f"etcd {what} refused ({details}); etcd runs with users: "
                    "give EtcdSecurity(user=..., password=...)")
            return PermissionDeniedError(f"etcd {what} refused user {user!r}: {details}")
        return UnavailableError(f"etcd at {','.join(self._endpoints)}: {what}: {details or e}")

    def _connect(self) -> Any:
        """A client of the first endpoint that answers (authenticated when a user is set:
        etcd3 takes a token once, so a fresh client is a fresh token)."""
        s = self._security
        last: Optional[KvcacheError] = None
        for ep in self._endpoints:
            host, _, port = ep.rpartition(":")
            c = None
            try:
                c = etcd3.client(host=host, port=int(port), timeout=self._timeout_s,
                                 ca_cert=s.ca_file or None, cert_key=s.key_file or None,
                                 cert_cert=s.cert_file or None, user=s.user or None,
                                 password=s.password or None)
                c.get_response(NODES_PREFIX)  # proves the channel and the credentials
                return c
            except (grpc.RpcError, etcd3.exceptions.Etcd3Exception) as e:
                if c is not None:
                    c.close()
                last = self._error(e, f"Authenticate as user {s.user!r}" if s.user else "Range")
                if isinstance(last, PermissionDeniedError):
                    raise last from None  # etcd answered: not an endpoint to fail over from
        assert last is not None
        raise last

    def _reload(self) -> Membership:
        if self._client is None:
            self._client = self._connect()
        try:
            resp = self._client.get_prefix_response(NODES_PREFIX)
        except (grpc.RpcError, etcd3.exceptions.Etcd3Exception) as e:
            self._drop_client()
            raise self._error(e, "Range") from None
        nodes = {}
        for kv in resp.kvs:
            # A node's id is its key's: a record naming another id is ignored (as the watch does).
            n = _node_from(kv.value)
            if n is not None and n.id == _node_id(kv.key):
                nodes[n.id] = n
        with self._lock:
            self._nodes = nodes
            self.current = Membership(sorted(nodes.values(), key=lambda n: n.id), False, "",
                                      int(resp.header.revision))
        return self.current

    def _drop_client(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a dead channel may fail to close; it is gone
                pass

    def _watch(self) -> None:
        """Follows the node records from the revision after the last read. The stream is
        ours, not etcd3's Watcher (0.12): that one's thread retries forever without pause
        while etcd is down and never ends; this one fails once and _loop decides."""
        sending = threading.Event()  # set: the request side ends (close)

        def requests() -> Any:
            yield etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
                key=NODES_PREFIX, range_end=_prefix_end(NODES_PREFIX),
                start_revision=self.current.revision + 1))
            sending.wait()

        client = self._client
        call = etcdrpc.WatchStub(client.channel).Watch(requests(), metadata=client.metadata)

        def cancel() -> None:
            sending.set()
            call.cancel()

        self._cancel_watch = cancel
        try:
            for resp in call:
                if self._stop:
                    return
                if resp.compact_revision or resp.canceled:
                    raise UnavailableError(f"etcd ended the watch ({resp.cancel_reason or 'compacted'})")
                for ev in resp.events:
                    node_id = _node_id(ev.kv.key)
                    with self._lock:
                        self._nodes.pop(node_id, None)
                        if ev.type == kv_pb2.Event.PUT:
                            n = _node_from(ev.kv.value)
                            if n is not None and n.id == node_id:
                                self._nodes[node_id] = n
                        self.current = Membership(sorted(self._nodes.values(), key=lambda n: n.id),
                                                  False, "", int(ev.kv.mod_revision))
        except grpc.RpcError as e:
            if self._stop:
                return
            raise self._error(e, "Watch") from None
        finally:
            sending.set()
            self._cancel_watch = None
        if not self._stop:
            raise UnavailableError("etcd ended the watch")

    def _loop(self) -> None:
        while not self._stop:
            try:
                self._watch()
            except (KvcacheError, OSError, ValueError) as e:
                if self._stop:
                    return
                with self._lock:
                    c = self.current
                    self.current = Membership(c.nodes, True, str(e), c.revision)
                self._drop_client()
                while not self._stop:
                    time.sleep(0.5)
                    try:
                        self._reload()
                        break
                    except (KvcacheError, OSError, ValueError):
                        pass

    def close(self) -> None:
        self._stop = True
        cancel = self._cancel_watch
        if cancel is not None:
            try:
                cancel()
            except Exception:  # noqa: BLE001 - the watch may already be gone with etcd
                pass
        self._drop_client()
