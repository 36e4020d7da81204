"""The cluster's membership as etcd holds it (docs/cluster.md): each kvcached node puts
NODES_PREFIX + its id under a lease; a client reads the prefix through etcd's v3 JSON
gateway and watches it, keeping the last membership it saw (marked stale) while etcd
cannot be reached. Only etcd access lives here; routing is cluster.py's.
"""
import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, List

from .errors import InvalidArgumentError, KvcacheError, PermissionDeniedError, UnavailableError

NODES_PREFIX = b"/kvcache/v1/nodes/"


def parse_etcd_url(url):
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

    def check(self):
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


def _b64(b):
    return base64.b64encode(b).decode()


def _prefix_end(prefix):
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _node_from(value):
    try:
        d = json.loads(base64.b64decode(value))
        return Node(d["id"], d["address"], int(d.get("generation", 0)),
                    int(d.get("ram_bytes", 0)), int(d.get("ssd_bytes", 0)))
    except (ValueError, KeyError, TypeError):
        return None  # a record that is not a node


class _MembershipWatch:
    """Reads the node records from etcd's JSON gateway, then watches them on a thread."""

    def __init__(self, endpoints, timeout_s, security=None):
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        self._security = security or EtcdSecurity()
        self._security.check()
        self._ssl = None
        if self._security.ca_file:
            try:
                self._ssl = ssl.create_default_context(cafile=self._security.ca_file)
                if self._security.cert_file:
                    self._ssl.load_cert_chain(self._security.cert_file, self._security.key_file)
            except (OSError, ssl.SSLError) as e:
                raise InvalidArgumentError(f"etcd TLS files: {e}") from None
        self._auth_token = None
        self._stop = False
        self._lock = threading.Lock()
        self._nodes: Dict[str, Node] = {}
        self.current = self._reload()  # raises UnavailableError if etcd does not answer
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _open(self, path, body, timeout):
        scheme = "https" if self._ssl else "http"
        last = None
        for ep in self._endpoints:
            req = urllib.request.Request(f"{scheme}://{ep}{path}", data=json.dumps(body).encode(),
                                         method="POST")
            if self._auth_token:
                req.add_header("Authorization", self._auth_token)
            try:
                return urllib.request.urlopen(req, timeout=timeout, context=self._ssl)
            except urllib.error.HTTPError as e:
                raise e  # etcd answered: not an endpoint to fail over from
            except (urllib.error.URLError, OSError) as e:
                last = e
        raise UnavailableError(f"etcd at {','.join(self._endpoints)}: {last}")

    def _authenticate(self, timeout):
        s = self._security
        try:
            with self._open("/v3/auth/authenticate", {"name": s.user, "password": s.password},
                            timeout) as r:
                self._auth_token = json.load(r)["token"]
        except urllib.error.HTTPError as e:
            raise PermissionDeniedError(
                f"etcd Authenticate as user {s.user!r}: {e.read().decode(errors='replace')}") from None

    def _post(self, path, body, timeout):
        # With a user: a token first, and a fresh one when etcd no longer takes it (simple
        # tokens expire after 5 minutes and die with an etcd restart).
        if self._security.user and not self._auth_token:
            self._authenticate(timeout)
        try:
            return self._open(path, body, timeout)
        except urllib.error.HTTPError as e:
            if e.code == 401 and self._security.user:
                self._authenticate(timeout)
                try:
                    return self._open(path, body, timeout)
                except urllib.error.HTTPError as again:
                    e = again
            text = e.read().decode(errors="replace")
            # No token where etcd wants one: 401, or 400 "user name is empty" (etcd 3.4).
            if e.code in (401, 403) or "user name is empty" in text:
                raise PermissionDeniedError(
                    f"etcd {path} refused (HTTP {e.code}: {text}); etcd runs with users: "
                    "give EtcdSecurity(user=..., password=...)" if not self._security.user
                    else f"etcd {path} refused user {self._security.user!r}: {text}") from None
            raise UnavailableError(f"etcd {path}: HTTP {e.code} {text}") from None

    def _reload(self):
        body = {"key": _b64(NODES_PREFIX), "range_end": _b64(_prefix_end(NODES_PREFIX))}
        with self._post("/v3/kv/range", body, self._timeout_s) as r:
            resp = json.load(r)
        nodes = {}
        for kv in resp.get("kvs", []):
            # A node's id is its key's: a record naming another id is ignored (as _watch does).
            key_id = base64.b64decode(kv.get("key", ""))[len(NODES_PREFIX):].decode(
                errors="replace")
            n = _node_from(kv.get("value", ""))
            if n is not None and n.id == key_id:
                nodes[n.id] = n
        with self._lock:
            self._nodes = nodes
            self.current = Membership(sorted(nodes.values(), key=lambda n: n.id), False, "",
                                      int(resp["header"]["revision"]))
        return self.current

    def _watch(self):
        start = self.current.revision + 1
        body = {"create_request": {"key": _b64(NODES_PREFIX),
                                   "range_end": _b64(_prefix_end(NODES_PREFIX)),
                                   "start_revision": str(start)}}
        # A read timeout only means nothing changed: the watch is then opened again.
        with self._post("/v3/watch", body, 5.0) as r:
            for line in r:
                if self._stop:
                    return
                result = json.loads(line).get("result", {})
                if result.get("compact_revision") or result.get("canceled"):
                    raise UnavailableError("etcd ended the watch")
                for ev in result.get("events", []):
                    kv = ev["kv"]
                    node_id = base64.b64decode(kv["key"])[len(NODES_PREFIX):].decode()
                    with self._lock:
                        self._nodes.pop(node_id, None)
                        if ev.get("type", "PUT") == "PUT":
                            n = _node_from(kv.get("value", ""))
                            if n is not None and n.id == node_id:
                                self._nodes[node_id] = n
                        self.current = Membership(sorted(self._nodes.values(), key=lambda n: n.id),
                                                  False, "", int(kv.get("mod_revision", 0)))

    def _loop(self):
        while not self._stop:
            try:
                self._watch()
            except TimeoutError:
                continue
            except (KvcacheError, OSError, ValueError) as e:
                if "timed out" in str(e):
                    continue
                with self._lock:
                    c = self.current
                    self.current = Membership(c.nodes, True, str(e), c.revision)
                while not self._stop:
                    time.sleep(0.5)
                    try:
                        self._reload()
                        break
                    except (KvcacheError, OSError, ValueError):
                        pass

    def close(self) -> None:
        self._stop = True


