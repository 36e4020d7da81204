"""kvcache as SGLang's HiCache storage backend (the L3 below GPU and host memory).

SGLang keys each page itself (`get_hash_str`: a SHA-256 chain over the page's token ids,
64 hex characters) and hands a backend keys and host-pool pages. KvcacheHiCacheStorage
stores those pages in caller-keyed namespaces of kvcached — one per pool (the KV pool, and
for hybrid models such as DeepSeek V4 the compressed, indexer and state pools) and page
size — under SGLang's keys, so any SGLang worker that reaches the same cache (and tenant)
finds a prefix another one computed, across restarts of either.

Launch (docs/integrations.md):

    python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4.1-Flash \\
      --enable-hierarchical-cache --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvcache",
        "module_path": "kvcache.integrations.sglang", "class_name": "KvcacheHiCacheStorage",
        "interface_v1": 1, "target": "127.0.0.1:50051",
        "shm_socket": "/var/lib/kvcache/kvcached.sock"}'

("interface_v1": 1 is SGLang's switch to the zero-copy batch_get_v1/batch_set_v1 for a
dynamic backend.) extra_config keys: target ("HOST:PORT", "unix:PATH" or "etcd://H:P" for a cluster;
default $KVCACHE_TARGET), token or token_env (default $KVCACHE_TOKEN: the tenant),
shm_socket (co-located: pages are copied out of the daemon's shared arena straight into the
host pool), timeout_s (default 5), durable (default true: acknowledged after the SSD sync),
ttl_s (default 0). Every call that the cache fails returns SGLang's miss (False, None, 0),
counted and logged (once per kind of failure), never an exception on a HiCache thread.

Every upstream name is imported on its own, so each hicache_storage generation the adapter
supports (with or without PoolTransferResult; StorageMetrics or not) still finds the real
HiCacheStorage base that SGLang's loader checks with issubclass.
"""
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from .._common import ChunkSink
from ..api import CacheClient
from ..hashing import Namespace
from ._pages import PageStore, RawViews, guarded, identity, settings

T = TypeVar("T")

try:  # SGLang loads a dynamic backend only if it subclasses its HiCacheStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # SGLang not installed: the same interface, for tests and tools
    class _Base:  # type: ignore[no-redef]
        """SGLang's HiCacheStorage's non-abstract part (hicache_storage.py)."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

try:  # newer hicache_storage only (batch_exists_v2); an older one lacks it
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except ImportError:
    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int] = field(default_factory=dict)

try:  # what get_stats() must return where SGLang collects storage metrics
    from sglang.srt.metrics.collector import StorageMetrics as _StorageMetrics
except ImportError:
    _StorageMetrics = None

KV_POOL = "kv"  # PoolName.KV: the pool of the generic and v1 calls
# clear()'s generation n is kept in the cache as the pinned pages "epoch-1" … "epoch-n" of
# one namespace (a stored page never changes, so a counter is a run of keys): read back as
# the leading run a Lookup finds.
_EPOCH_POOL, _MAX_EPOCHS = "epoch", 4096
_PIN_FOREVER_S = (1 << 32) - 1


def _epoch_keys(first: int, last: int) -> List[bytes]:
    return [f"epoch-{n}".encode() for n in range(first, last + 1)]


def _pool_name(name: Any) -> str:
    return str(getattr(name, "value", name))


def _tensor_bytes(t: Any) -> memoryview:
    """A CPU tensor's bytes, in place (any dtype; it must be contiguous)."""
    import torch
    return memoryview(t.view(-1).view(torch.uint8).numpy())


def _is_trailing(policy: Any) -> bool:
    return _pool_name(policy) == "trailing_pages"


class KvcacheHiCacheStorage(_Base):  # type: ignore[misc]  # (Any where SGLang is installed)
    """SGLang's HiCacheStorage over kvcached. Constructed by SGLang's dynamic backend
    loader as cls(storage_config, kwargs); see the module docstring for extra_config."""

    def __init__(self, storage_config: Any, kwargs: Optional[Dict[str, Any]] = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        target, token, shm, timeout_s = settings(extra)
        self._durable = bool(extra.get("durable", True))
        self._ttl_s = int(extra.get("ttl_s", 0))
        self._cfg = storage_config
        self._revision = str(extra.get("model_revision") or "")
        self._epoch: Optional[int] = None  # clear()'s generation, read from the cache
        self._store = PageStore(target, token, self._model_id(storage_config, self._revision),
                                timeout_s, shm, namer=self._namespace_name)
        self._page_bytes: Dict[str, int] = {}  # pool -> bytes of a page, once seen
        self._raw = RawViews()
        # Running counts (this adapter's own), and the samples get_stats() hands SGLang:
        # pages per prefetch / backup call and their bandwidth (GB/s), since its last call.
        self.stats: Dict[str, int] = {"pages_stored": 0, "pages_loaded": 0, "pages_missed": 0,
                                      "failed_calls": 0}
        self._samples: Dict[str, List[float]] = {"prefetch_pgs": [], "backup_pgs": [],
                                                 "prefetch_bandwidth": [], "backup_bandwidth": []}

    @staticmethod
    def _model_id(cfg: Any, revision: str = "") -> str:
        """What the pages depend on beside the pool (docs/integrations.md, "Never another
        engine's KV"): the model and its revision (extra_config model_revision: the weights'
        hash or the operator's revision string), and — unless every rank holds the same page
        (MLA) — the tensor-parallel rank and size and how heads are split across ranks; the
        pipeline and context-parallel ranks when used."""
        name = (getattr(cfg, "model_name", None) or "model").replace("/", "-")
        out = f"sglang:{name}" + (f"@{revision}" if revision else "")
        if not getattr(cfg, "is_mla_model", False):
            out += f":tp{getattr(cfg, 'tp_rank', 0)}of{getattr(cfg, 'tp_size', 1)}"
            lcm = getattr(cfg, "tp_lcm_size", None)
            if lcm or getattr(cfg, "should_split_heads", False):
                out += f":lcm{lcm}split{int(bool(getattr(cfg, 'should_split_heads', False)))}"
        if getattr(cfg, "pp_size", 1) > 1:
            out += f":pp{cfg.pp_rank}of{cfg.pp_size}"
        if getattr(cfg, "attn_cp_size", 1) > 1:
            out += f":cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
        return out

    def _namespace_name(self, pool_name: str) -> str:
        """A pool's namespace: the model's identity, the pool, its host layout and KV dtype
        (a page_first page and a page_first_direct one, or fp8 e4m3 and e5m2 pages, have the
        same size and different bytes), and clear()'s epoch."""
        base = self._store.model_id
        if pool_name == _EPOCH_POOL:
            return f"{base}:{_EPOCH_POOL}"
        pool = self._pool(pool_name)
        layout = getattr(pool, "layout", None) or (
            "page_first" if getattr(self._cfg, "is_page_first_layout", False) else "")
        dtype = getattr(pool, "dtype", None)
        epoch = self._current_epoch()
        return ":".join(p for p in (base, identity(
            ("pool", pool_name), ("layout", _pool_name(layout) if layout else ""),
            ("dtype", str(dtype).replace("torch.", "") if dtype is not None else ""),
            ("epoch", epoch if epoch else ""))) if p)

    def _current_epoch(self) -> int:
        """clear()'s generation, kept in the cache so that every worker of the tenant, and
        this one after a restart, reads the same; read once."""
        if self._epoch is None:
            self._epoch = int(self._store.run(_EPOCH_POOL, 8, 0, lambda c, ns: c.lookup_keys(
                ns, self._store.keys(c, ns, _epoch_keys(1, _MAX_EPOCHS))).matched_chunks))
        return self._epoch

    # ---- geometry ----
    def _pool(self, name: str) -> Any:
        if name == KV_POOL and getattr(self, "mem_pool_host", None) is not None:
            return self.mem_pool_host
        return getattr(self, "registered_pools", {}).get(name) or (
            getattr(self, "registered_pools", {}).get(KV_POOL) if name == KV_POOL else None)

    def _pages(self, pool_name: str, host_indices: Any,
               n_pages: int) -> Tuple[List[List[memoryview]], int, int]:
        """Per page, writable views of its parts in the host pool (from the pool's own
        get_page_buffer_meta), and the page's bytes."""
        pool = self._pool(pool_name)
        if pool is None:
            raise ValueError(f"no host pool registered for {pool_name!r}")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        ptrs = list(ptrs)
        sizes = [int(sizes)] * len(ptrs) if isinstance(sizes, int) else list(map(int, sizes))
        if n_pages == 0 or len(ptrs) % n_pages or len(sizes) != len(ptrs):
            raise ValueError(f"the {pool_name} pool gives {len(ptrs)} buffers for {n_pages} pages")
        per = len(ptrs) // n_pages
        known = self._raw.known  # views made before: the same pages come back
        views = [known.get((a, n)) or self._raw(a, n) for a, n in zip(ptrs, sizes)]
        parts = [views[p * per:(p + 1) * per] for p in range(n_pages)]
        page_bytes = sum(sizes[:per])
        if len(set(sizes)) > 1 and any(sum(sizes[p * per:(p + 1) * per]) != page_bytes
                                       for p in range(1, n_pages)):
            raise ValueError(f"the {pool_name} pool's pages differ in size")
        self._page_bytes[pool_name] = page_bytes
        return parts, page_bytes, int(getattr(pool, "page_size", 0) or 0)

    def _flat_page_bytes(self) -> Optional[int]:
        """The bytes of one KV page: as seen, else from the pool — its flat dummy page, or,
        for a pool without one (asymmetric K/V: head_dim != v_head_dim raises there), one
        page's buffers from its own get_page_buffer_meta, as the zero-copy calls read them."""
        if KV_POOL in self._page_bytes:
            return self._page_bytes[KV_POOL]
        pool = self._pool(KV_POOL)
        if pool is None:
            return None
        try:
            page = pool.get_dummy_flat_data_page()
            self._page_bytes[KV_POOL] = page.numel() * page.element_size()
        except (AttributeError, NotImplementedError):
            import torch  # the engine's host indices are torch tensors
            size = int(getattr(pool, "page_size", 1) or 1)
            self._pages(KV_POOL, torch.arange(size), 1)  # records the page's bytes
        return self._page_bytes.get(KV_POOL)

    def _sample(self, op: str, pages: int, nbytes: int, start: float) -> None:
        elapsed = time.perf_counter() - start
        self._samples[f"{op}_pgs"].append(pages)
        if elapsed > 0 and nbytes:
            self._samples[f"{op}_bandwidth"].append(nbytes / elapsed / 1e9)

    def _page_tokens(self) -> int:
        pool = self._pool(KV_POOL)
        return int(getattr(pool, "page_size", 0) or 0) if pool is not None else 0

    def _failed(self, value: T) -> T:
        """The miss a failed call answers (guarded), counted."""
        self.stats["failed_calls"] += 1
        return value

    # ---- existence ----
    def _leading(self, pool: str, page_bytes: int, page_tokens: int, keys: List[Any]) -> int:
        m = self._store.run(pool, page_bytes, page_tokens, lambda c, ns: c.lookup_keys(
            ns, self._store.keys(c, ns, keys)))
        # Tokens by tier: the leading run's pages by their tiers, the rest not found (what
        # SGLang then prefetches, and what kvcached counts for the same call).
        self._store.tokens.add(self._store.name_of(pool),
                               list(m.tiers[:m.matched_chunks]) +
                               ["none"] * (len(keys) - m.matched_chunks), page_tokens)
        return int(m.matched_chunks)

    def tokens_by_tier(self) -> Dict[str, Dict[str, int]]:
        """Prompt tokens each tier (hbm, ram, ssd; none: not found) answered for this
        backend's existence checks, per namespace: a page's tokens once per check. For a
        pool checked whole (batch_exists_v2's extra pools) every page counts by its tier."""
        return self._store.tokens.snapshot()

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading keys are stored (SGLang stops its prefetch at the first miss)."""
        if not keys:
            return 0

        def work() -> int:
            page_bytes = self._flat_page_bytes()
            if page_bytes is None:
                return 0  # no page seen or registered yet: nothing can be stored
            return self._leading(KV_POOL, page_bytes, self._page_tokens(), keys)
        return guarded("batch_exists", lambda: self._failed(0), work)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> Any:
        """The usable prefix across pools: the KV pool's leading run, shortened by each extra
        pool's hit policy ("all_pages": every page of the prefix; "trailing_pages": only the
        last len(transfer.keys) pages before the prefix's end)."""
        def work() -> object:  # SGLang's PoolTransferResult
            kv = self.batch_exists(keys)
            hits: Dict[str, int] = {KV_POOL: kv} if kv else {}
            final = kv
            for t in pool_transfers or []:
                if final == 0:
                    break
                name = _pool_name(t.name)
                present = self._present(name, keys[:kv])
                if _is_trailing(t.hit_policy):
                    trailing = max(1, len(t.keys) if t.keys else 1)
                    boundary = next((n for n in range(kv, 0, -1)
                                     if all(present[max(0, n - trailing):n])), 0)
                else:
                    boundary = next((i for i, p in enumerate(present) if not p), kv)
                if boundary:
                    hits[name] = boundary
                final = min(final, boundary)
            return PoolTransferResult(final, hits)
        nothing: object = PoolTransferResult(0, {})
        return guarded("batch_exists_v2", lambda: self._failed(nothing), work)

    def _present(self, pool_name: str, keys: List[str]) -> List[bool]:
        """Whether each key's page of an extra pool is stored (not only the leading run)."""
        page_bytes = self._page_bytes.get(pool_name)
        pool = self._pool(pool_name)
        if page_bytes is None and pool is not None and keys:
            # One page's geometry, from the pool's own metadata of its first slot.
            import torch  # the engine's host indices are torch tensors
            size = int(getattr(pool, "page_size", 1) or 1)
            _, page_bytes, _ = self._pages(pool_name, torch.arange(size), 1)
        if page_bytes is None or not keys:
            return [False] * len(keys)
        tokens = int(getattr(pool, "page_size", 0) or 0)

        def every(c: CacheClient, ns: Namespace) -> List[bool]:  # each page, not only the leading run
            tiers = c.tiers_of(ns, self._store.keys(c, ns, keys))
            self._store.tokens.add(self._store.name_of(pool_name), tiers, tokens)
            return [t != "none" for t in tiers]
        return self._store.run(pool_name, page_bytes, tokens, every)

    # ---- zero-copy page I/O (host pool pages in place) ----
    def _get_pages(self, pool: str, keys: List[Any], host_indices: Any) -> List[bool]:
        start = time.perf_counter()
        parts, page_bytes, tokens = self._pages(pool, host_indices, len(keys))
        # The pool's own views, sized by its metadata: no second check per part.
        sink = ChunkSink(page_bytes, parts=parts)
        got = self._store.run(pool, page_bytes, tokens, lambda c, ns: c.fetch_scattered(
            ns, self._store.keys(c, ns, keys), sink))
        self.stats["pages_loaded"] += got
        self.stats["pages_missed"] += len(keys) - got
        self._sample("prefetch", got, got * page_bytes, start)
        return [i < got for i in range(len(keys))]

    def _set_pages(self, pool: str, keys: List[Any], host_indices: Any) -> List[bool]:
        start = time.perf_counter()
        parts, page_bytes, tokens = self._pages(pool, host_indices, len(keys))
        self._store.run(pool, page_bytes, tokens, lambda c, ns: c.store_keys(
            ns, self._store.keys(c, ns, keys), parts, durable=self._durable,
            ttl_s=self._ttl_s))
        self.stats["pages_stored"] += len(keys)
        self._sample("backup", len(keys), len(keys) * page_bytes, start)
        return [True] * len(keys)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Pages of `keys` into the host pool at host_indices (page_size slots per key), in
        place; per key whether it arrived (a prefix: True up to the first miss)."""
        if not keys:
            return []
        return guarded("batch_get_v1", lambda: self._failed([False] * len(keys)),
                       lambda: self._get_pages(KV_POOL, keys, host_indices))

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """The host pool's pages at host_indices stored under `keys`; per key whether it is."""
        if not keys:
            return []
        return guarded("batch_set_v1", lambda: self._failed([False] * len(keys)),
                       lambda: self._set_pages(KV_POOL, keys, host_indices))

    def _batch_v2(self, transfers: List[Any],
                  op: Callable[[str, List[Any], Any], List[bool]]) -> Dict[str, List[bool]]:
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            name, keys = _pool_name(t.name), list(t.keys or [])
            out[name] = (guarded(f"{op.__name__} {name}", lambda: self._failed([False] * len(keys)),
                                 lambda: op(name, keys, t.host_indices))
                         if keys and t.host_indices is not None else [False] * len(keys))
        return out

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        """Each transfer's pages into its own pool (register_mem_host_pool_v2), in place."""
        return self._batch_v2(transfers, self._get_pages)

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._batch_v2(transfers, self._set_pages)

    # ---- the older calls: one flat page tensor per key ----
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        got = self.batch_get([key], [target_location])
        return got[0] if got else None

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> List[Any]:
        """Each page into its target tensor; the tensor, or None from the first miss on."""
        if not keys or target_locations is None:
            return [None] * len(keys)

        def work() -> List[Any]:
            views = [_tensor_bytes(t) for t in target_locations]
            page_bytes = views[0].nbytes
            self._page_bytes.setdefault(KV_POOL, page_bytes)
            got = self._store.run(KV_POOL, page_bytes, self._page_tokens(), lambda c, ns:
                                  c.fetch_scattered(ns, self._store.keys(c, ns, keys), views))
            self.stats["pages_loaded"] += got
            return [t if i < got else None for i, t in enumerate(target_locations)]
        return guarded("batch_get", lambda: self._failed([None] * len(keys)), work)

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Each flat page tensor stored under its key; True when all are."""
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            return False

        def work() -> bool:
            views = [_tensor_bytes(v.contiguous()) for v in values]
            page_bytes = views[0].nbytes
            self._page_bytes.setdefault(KV_POOL, page_bytes)
            self._store.run(KV_POOL, page_bytes, self._page_tokens(), lambda c, ns: c.store_keys(
                ns, self._store.keys(c, ns, keys), views,
                durable=self._durable, ttl_s=self._ttl_s))
            self.stats["pages_stored"] += len(keys)
            return True
        return guarded("batch_set", lambda: self._failed(False), work)

    def clear(self) -> None:
        """SGLang's flush (also after an in-place weight update under the same served name):
        every page stored so far becomes unreachable — the namespace's epoch goes up, kept in
        the cache for every worker of the tenant, and the old pages leave by eviction. A
        worker already running picks the new epoch up when it clears or restarts."""
        def work() -> None:
            new = self._current_epoch() + 1
            if new > _MAX_EPOCHS:
                raise ValueError(f"{_MAX_EPOCHS} clears of one model: give it a new "
                                 "model_revision instead")
            page = memoryview(bytearray(new.to_bytes(8, "little")))

            def put(c: Any, ns: Any) -> None:
                keys = self._store.keys(c, ns, _epoch_keys(new, new))
                c.store_keys(ns, keys, [page], durable=True)
                c.pin(ns, keys, _PIN_FOREVER_S)  # the epoch must outlive every page
            self._store.run(_EPOCH_POOL, 8, 0, put)
            self._epoch = new
        guarded("clear", lambda: self._failed(None), work)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics (pages per prefetch and backup call, and their GB/s, since
        the last call), as its scheduler asserts when storage metrics are on; None where
        SGLang has no StorageMetrics. The running counts are in `stats`."""
        samples = self._samples
        self._samples = {k: [] for k in samples}
        if _StorageMetrics is None:
            return None
        metrics = _StorageMetrics()
        for name, values in samples.items():
            getattr(metrics, name).extend(values)
        return metrics

    def close(self) -> None:
        self._store.close()
