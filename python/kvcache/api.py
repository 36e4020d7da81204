"""One way to reach the cache: `connect(target, token)` gives a client for one kvcached
("HOST:PORT", "unix:PATH") or for a cluster ("etcd://H:P[,H:P…]"), both behind the
`CacheClient` protocol, so a worker's code does not change with the deployment.

    import kvcache
    with kvcache.connect("etcd://10.0.0.5:2379", token="...") as cache:
        ns = cache.register_namespace(config_json, "my-model", chunk_tokens=256)
        match = cache.lookup(ns, prompt_tokens)
"""
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence, runtime_checkable

from ._common import Fetched, Match, StoreResult
from .hashing import Namespace, Tokens


@runtime_checkable
class CacheClient(Protocol):
    """What a worker asks of the cache. Client (one daemon) and ClusterClient (a cluster)
    both are one; kvcache.connect picks by the target."""

    def register_namespace(self, model_config_json: str, model_id: str,
                           chunk_tokens: int = 0) -> Namespace: ...

    def register_keyed_namespace(self, model_id: str, page_bytes: int,
                                 page_tokens: int = 0) -> Namespace: ...

    def chunk_keys(self, ns: Namespace, tokens: Tokens) -> List[bytes]: ...

    def caller_keys(self, ns: Namespace, keys: Sequence[Any]) -> List[bytes]: ...

    def lookup(self, ns: Namespace, tokens: Tokens) -> Match: ...

    def lookup_keys(self, ns: Namespace, keys: Sequence[bytes]) -> Match: ...

    def fetch(self, ns: Namespace, keys: Sequence[bytes], out: Optional[Any] = None) -> Fetched: ...

    def fetch_scattered(self, ns: Namespace, keys: Sequence[bytes], dsts: Any) -> int: ...

    def tiers_of(self, ns: Namespace, keys: Sequence[bytes]) -> List[str]: ...

    def store(self, ns: Namespace, tokens: Tokens, payloads: Any, durable: bool = True,
              ttl_s: int = 0, parent: Optional[bytes] = None) -> StoreResult: ...

    def store_keys(self, ns: Namespace, keys: Sequence[bytes], payloads: Any, durable: bool = True,
                   ttl_s: int = 0, chain: bool = True) -> StoreResult: ...

    def pin(self, ns: Namespace, keys: Sequence[bytes], ttl_s: int) -> int: ...

    def unpin(self, ns: Namespace, keys: Sequence[bytes]) -> int: ...

    def delete(self, ns: Namespace, keys: Sequence[bytes]) -> int: ...

    def stats(self) -> Dict[str, Any]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def connect(target: str, token: Optional[str] = None, **options: Any) -> CacheClient:
    """A client for `target`: "etcd://H:P[,H:P…]" a cluster (ClusterClient), anything else
    one daemon (Client). `options` go to that class (timeout_s, shm_socket, replicas,
    etcd security …)."""
    from .client import Client
    from .cluster import ClusterClient
    if target.startswith("etcd://"):
        return ClusterClient(target, token, **options)
    return Client(target, token, **options)


if TYPE_CHECKING:  # mypy holds both clients to the protocol
    from .client import Client as _Client
    from .cluster import ClusterClient as _ClusterClient

    def _daemon(c: _Client) -> CacheClient:
        return c

    def _cluster(c: _ClusterClient) -> CacheClient:
        return c
