"""kvcache: the Python client of kvcached, the tiered KV-cache service.

    import kvcache
    with kvcache.connect("127.0.0.1:50051", token="...") as c:   # or "etcd://H:P" (a cluster)
        ns = c.register_namespace(open("config.json").read(), "my-model", chunk_tokens=256)
        match = c.lookup(ns, prompt_tokens)
        got = c.fetch(ns, match.matched_keys, out=page_buffer)

See python/README.md.
"""
from ._common import Fetched, Match, StoreResult
from .api import CacheClient, connect
from .aio import AsyncClient, AsyncClusterClient, connect_async
from .client import Client
from .cluster import ClusterClient, rank_nodes
from .membership import EtcdSecurity
from .errors import (AlreadyExistsError, DataLossError, FailedPreconditionError, InternalError,
                     InvalidArgumentError, KvcacheError, NotFoundError, PermissionDeniedError,
                     ResourceExhaustedError, UnavailableError)
from .hashing import Namespace, chunk_keys

__all__ = [
    "AsyncClient", "AsyncClusterClient", "CacheClient", "connect_async", "Client", "ClusterClient", "connect", "EtcdSecurity", "Fetched", "Match", "Namespace", "StoreResult", "chunk_keys", "rank_nodes",
    "AlreadyExistsError", "DataLossError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "KvcacheError", "NotFoundError", "PermissionDeniedError",
    "ResourceExhaustedError", "UnavailableError",
]
