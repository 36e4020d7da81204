"""What both engine adapters share: one client per thread (engines call from their
scheduler and I/O threads; a Client is not thread-safe), a caller-keyed namespace per page
geometry, engine keys as caller keys, and views over the engines' host memory."""
import ctypes
import hashlib
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar, cast

from .. import api
from ..errors import KvcacheError, NotFoundError, UnavailableError
from ..hashing import MAX_CALLER_KEY_BYTES, Namespace

log = logging.getLogger("kvcache.integrations")
T = TypeVar("T")


# kvcached bounds a namespace's model_id (--max-name-bytes, 256 by default): a longer
# identity keeps a readable head and the SHA-256 of the whole, so it stays unique.
MAX_NAME_BYTES = 200


def bounded_name(name: str) -> str:
    raw = name.encode("utf-8")
    if len(raw) <= MAX_NAME_BYTES:
        return name
    head = raw[:MAX_NAME_BYTES - 65].decode("utf-8", "ignore")
    return f"{head}#{hashlib.sha256(raw).hexdigest()}"


def identity(*fields: Tuple[str, Any]) -> str:
    """`name=value` parts of a namespace's identity, in order, the empty ones left out."""
    return ":".join(f"{k}={v}" for k, v in fields if v not in (None, ""))


def caller_key(key: Any) -> bytes:
    """An engine's page key as a caller key: bytes or str as they are (str as UTF-8) when
    they fit in 64 bytes, anything longer — or of another type (a tuple of hash and group
    id) — by the SHA-256 of its bytes (of its repr for other types)."""
    if isinstance(key, str):
        b = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        b = repr(key).encode("utf-8")
    return b if 0 < len(b) <= MAX_CALLER_KEY_BYTES else hashlib.sha256(b).digest()


class RawViews:
    """Writable byte views of this process's memory at given addresses (an engine's pinned
    host pool pages, from its own buffer metadata): pages go in and out with no staging
    copy. A pool's pages stay where they are, so views are kept (up to `keep`) and made
    once per page, not once per call."""

    def __init__(self, keep: int = 1 << 17) -> None:
        self.known: Dict[Tuple[int, int], memoryview] = {}  # (address, bytes) -> its view
        self._keep = keep

    def __call__(self, address: int, nbytes: int) -> memoryview:
        view = self.known.get((address, nbytes))
        if view is None:
            if address <= 0 or nbytes <= 0:
                raise ValueError(f"no memory at address {address:#x} ({nbytes} bytes)")
            view = memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")
            if len(self.known) >= self._keep:
                self.known.clear()
            self.known[(address, nbytes)] = view
        return view


class CallerKeys:
    """An engine's page keys as chunk keys of one namespace, remembered (up to `keep`):
    the pages of a prefix are asked for again and again, and hashing each key each time
    costs as much as the call's other work."""

    def __init__(self, keep: int = 1 << 16) -> None:
        self._keys: Dict[Tuple[bytes, bytes], bytes] = {}
        self._keep = keep

    def __call__(self, client: api.CacheClient, ns: Namespace, keys: Any) -> List[bytes]:
        names = [caller_key(k) for k in keys]
        out = [self._keys.get((ns.root_key, n)) for n in names]
        todo = [i for i, ck in enumerate(out) if ck is None]
        if todo:
            mapped = client.caller_keys(ns, [names[i] for i in todo])
            if len(self._keys) + len(todo) > self._keep:
                self._keys.clear()
            for i, ck in zip(todo, mapped):
                out[i] = ck
                self._keys[(ns.root_key, names[i])] = ck
        return cast(List[bytes], out)  # every entry filled above


TIERS = ("hbm", "ram", "ssd", "none")  # "none": looked up and not found


class TierTokens:
    """Prompt tokens by the tier that served them, per namespace: what an adapter's
    counts of its own calls say (docs/integrations.md, "Tokens by tier"). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: Dict[str, Dict[str, int]] = {}

    def add(self, namespace: str, tiers: Any, page_tokens: int) -> None:
        """One page of page_tokens for each tier named (one of TIERS)."""
        with self._lock:
            counts = self._by.setdefault(namespace, dict.fromkeys(TIERS, 0))
            for t in tiers:
                counts[t if t in counts else "none"] += page_tokens

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        with self._lock:
            return {ns: dict(c) for ns, c in self._by.items()}


class PageStore:
    """Clients (one per thread) of one cache target, and each thread's caller-keyed
    namespaces by (pool name, page bytes, page tokens)."""

    def __init__(self, target: str, token: Optional[str], model_id: str, timeout_s: float,
                 shm_socket: Optional[str], backoff_s: float = 1.0,
                 namer: Optional[Callable[[str], str]] = None) -> None:
        if not target:
            raise ValueError("no kvcache target: give target (HOST:PORT, unix:PATH or "
                             "etcd://H:P) or set $KVCACHE_TARGET")
        self.target, self.model_id = target, model_id
        # pool -> the namespace's full name (what decides a page's bytes beside the model);
        # asked at each registration, so a name that changes (a new epoch) is followed.
        self._namer = namer or (lambda pool: f"{self.model_id}:{pool}")
        self._token, self._timeout_s, self._shm = token, timeout_s, shm_socket
        self._local = threading.local()
        self.keys = CallerKeys()  # keys(client, ns, engine keys) -> chunk keys
        self.tokens = TierTokens()  # prompt tokens by tier, per namespace name
        self._all_lock = threading.Lock()
        self._all: List[Any] = []
        # After a call finds the cache unreachable, calls fail at once for backoff_s (the
        # engine gets its miss without waiting on a connection attempt every time).
        self._backoff_s = backoff_s
        self._down_until = 0.0

    def client(self) -> api.CacheClient:
        c = getattr(self._local, "client", None)
        if c is None:
            options: Dict[str, Any] = {"timeout_s": self._timeout_s}
            if not self.target.startswith("etcd://"):
                # A daemon that is down fails the call at once (the engine gets a miss)
                # instead of holding a scheduler thread until the timeout.
                options["wait_for_ready"] = False
                if self._shm:
                    options["shm_socket"] = self._shm
            c = api.connect(self.target, self._token, **options)
            self._local.client, self._local.namespaces = c, {}
            with self._all_lock:
                self._all.append(c)
        return c

    def name_of(self, pool: str) -> str:
        """The pool's namespace name (as registered in kvcached)."""
        return bounded_name(self._namer(pool))

    def namespace(self, pool: str, page_bytes: int, page_tokens: int) -> Namespace:
        self.client()
        spaces = self._local.namespaces
        name = self.name_of(pool)
        ns = spaces.get((name, page_bytes, page_tokens))
        if ns is None:
            ns = self._local.client.register_keyed_namespace(name, page_bytes, page_tokens)
            spaces[(name, page_bytes, page_tokens)] = ns
        return cast(Namespace, ns)

    def run(self, pool: str, page_bytes: int, page_tokens: int,
            work: Callable[[api.CacheClient, Namespace], T]) -> T:
        """work(client, namespace), once more after registering again when the daemon no
        longer knows the namespace (it was started on a fresh data folder)."""
        if time.monotonic() < self._down_until:
            raise UnavailableError(f"{self.target} was unreachable moments ago; retrying after "
                                   f"{self._backoff_s} s")
        try:
            for attempt in range(2):
                ns = self.namespace(pool, page_bytes, page_tokens)
                try:
                    return work(self._local.client, ns)
                except NotFoundError as e:
                    if attempt or "namespace" not in e.message:
                        raise
                    self._local.namespaces.clear()
        except KvcacheError as e:
            if e.code is not None and e.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                self._down_until = time.monotonic() + self._backoff_s
            raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._all_lock:
            clients, self._all = self._all, []
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def guarded(what: str, miss: Callable[..., T], work: Callable[[], T], *args: Any) -> T:
    """work(), or miss(*args) when the cache fails it: an engine's scheduler or I/O thread
    must get its documented miss, never an exception it does not expect."""
    try:
        return work()
    except KvcacheError as e:
        code = e.code.name if e.code else "?"
        _log_once((what, code), "kvcache %s failed (%s): %s", what, code, e.message)
    except Exception as e:  # noqa: BLE001 - an adapter must not kill an engine thread
        _log_once((what, type(e).__name__), "kvcache %s failed: %r", what, e, exc_info=True)
    return miss(*args)


_LOGGED: Set[Tuple[str, str]] = set()


def _log_once(kind: Tuple[str, str], msg: str, *args: Any, exc_info: bool = False) -> None:
    """The first failure of each kind (call, error) as a warning; the rest at debug, so a
    cache that is down does not flood an engine's log at every call."""
    if kind in _LOGGED:
        log.debug(msg, *args, exc_info=exc_info)
        return
    _LOGGED.add(kind)
    log.warning(msg + " (later failures of this kind are logged at debug level)", *args,
                exc_info=exc_info)


def settings(given: Dict[str, Any]) -> Tuple[str, Optional[str], Optional[str], float]:
    """(target, token, shm socket, timeout) from an adapter's options, falling back to
    $KVCACHE_TARGET, the variable named by token_env (default $KVCACHE_TOKEN) and
    $KVCACHE_SHM_SOCKET."""
    target = str(given.get("target") or os.environ.get("KVCACHE_TARGET", ""))
    token = given.get("token") or os.environ.get(given.get("token_env") or "KVCACHE_TOKEN")
    shm = given.get("shm_socket") or os.environ.get("KVCACHE_SHM_SOCKET")
    return (target, str(token) if token else None, str(shm) if shm else None,
            float(given.get("timeout_s", 5.0)))
