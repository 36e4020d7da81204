"""The serving-engine adapters against real kvcached processes, driven through the calls the
engines make. Neither engine can be installed here (no PyPI), so the call sequences are
written from their source, cited per test, and the host pools are torch tensors laid out
as the engines lay them out.
"""
import hashlib
import os
import signal
import sys
import types
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, List, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcache.integrations.sglang import KvcacheHiCacheStorage  # noqa: E402
from kvcache.integrations.vllm import KvcacheSecondaryTier  # noqa: E402

from conftest import free_port  # noqa: E402

STORAGE_BATCH_SIZE = 128  # sglang/srt/mem_cache/hicache_storage.py


def sglang_page_hashes(token_ids, page_size):
    """SGLang's page keys (hicache_storage.py get_hash_str): SHA-256 over the prior page's
    digest and the page's token ids as little-endian u32, as 64 hex characters."""
    keys, prior = [], None
    for at in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in token_ids[at:at + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        keys.append(prior)
    return keys


def storage_config(target, token=None, **extra):
    """HiCacheStorageConfig's fields (hicache_storage.py), extra_config from the launch line."""
    return SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                           attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                           is_page_first_layout=True, model_name="deepseek-ai/DeepSeek-V4.1-Flash",
                           extra_config=dict(target=target, token=token, timeout_s=2, **extra))


class PageFirstHostPool:
    """An MHA host pool in SGLang's page_first layout (memory_pool_host.py
    MHATokenToKVPoolHost): kv_buffer [2, size, layers, heads, dim]; get_page_buffer_meta
    gives each page's K then V address, page_size tokens each."""

    def __init__(self, rng, size=64, page_size=4, layers=2, heads=2, dim=8, dtype=torch.bfloat16):
        self.page_size, self.size, self.dtype = page_size, size, dtype
        self.layout = "page_first"
        self.kv_buffer = torch.empty((2, size, layers, heads, dim), dtype=dtype)
        self.kv_buffer.view(torch.uint8).copy_(torch.from_numpy(
            rng.integers(0, 256, self.kv_buffer.numel() * self.kv_buffer.element_size(),
                         dtype=np.uint8).reshape(self.kv_buffer.view(torch.uint8).shape)))
        self.per_token = layers * heads * dim * self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        base = self.kv_buffer.data_ptr()
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            k = base + idx[i] * self.per_token
            ptrs += [k, k + self.size * self.per_token]
        return ptrs, [self.page_size * self.per_token] * len(ptrs)

    def page(self, slot):
        """(K bytes, V bytes) of the page whose first token is at `slot`."""
        flat = self.kv_buffer.view(torch.uint8).reshape(2, -1)
        n = self.page_size * self.per_token
        return bytes(flat[0, slot * self.per_token:slot * self.per_token + n].numpy()), \
            bytes(flat[1, slot * self.per_token:slot * self.per_token + n].numpy())

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.page_size * self.per_token // self.kv_buffer.element_size(),
                           dtype=self.dtype)

    def get_data_page(self, index, flat=True):
        k, v = self.page(index)
        return torch.frombuffer(bytearray(k + v), dtype=torch.uint8).view(self.dtype)


class StatePool:
    """A side pool of a hybrid model (one buffer, one row of `width` bytes per page), as
    DeepSeek V4's compressed-state and indexer pools are registered for the v2 calls."""

    def __init__(self, rng, pages=16, width=48, page_size=4):
        self.page_size = page_size
        self.buffer = torch.from_numpy(rng.integers(0, 256, (pages, width), dtype=np.uint8))

    def get_page_buffer_meta(self, indices):
        rows = [i // self.page_size for i in indices.tolist()[::self.page_size]]
        return [self.buffer[r].data_ptr() for r in rows], [self.buffer.shape[1]] * len(rows)


@dataclass
class PoolTransfer:  # hicache_storage.py PoolTransfer
    name: str
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[List[str]] = None
    hit_policy: str = "all_pages"
    nodes_to_load: Any = None
    indices_from_pool: Any = None


def slots(first_page, pages, page_size):
    return torch.arange(first_page * page_size, (first_page + pages) * page_size)


def two_tenant_daemon(make_daemon, tmp_path):
    """A daemon with two tenants: token tok-a is acme, tok-b is globex."""
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("tok-a acme\ntok-b globex\n")
    return make_daemon(["--auth-tokens", str(tokens_file)])


def prefetch(storage, keys):
    """cache_controller.py _storage_hit_query: batch_exists per STORAGE_BATCH_SIZE keys,
    stopping at the first batch that is not all hits; the hit count."""
    hit = 0
    for at in range(0, len(keys), STORAGE_BATCH_SIZE):
        batch = keys[at:at + STORAGE_BATCH_SIZE]
        n = storage.batch_exists(batch, None)
        hit += n
        if n < len(batch):
            break
    return hit


def leading(results):
    """cache_controller.py _page_get_zero_copy: pages count up to the first False."""
    n = 0
    for ok in results:
        if not ok:
            break
        n += 1
    return n


def test_sglang_zero_copy_backup_and_prefetch_survive_a_restart_and_stop_at_a_miss(make_daemon, seed):
    rng = np.random.default_rng(seed)
    d = make_daemon()
    pool = PageFirstHostPool(rng)
    storage = KvcacheHiCacheStorage(storage_config(d.address), {})
    storage.register_mem_pool_host(pool)
    tokens = rng.integers(0, 129280, 6 * pool.page_size).tolist()
    keys = sglang_page_hashes(tokens, pool.page_size)
    want = [pool.page(p * pool.page_size) for p in range(6)]
    # cache_controller.py _page_backup -> _page_set_zero_copy: all(batch_set_v1(...)).
    assert all(storage.batch_set_v1(keys[:4], slots(0, 4, pool.page_size), None))
    storage.close()
    d.restart()  # SIGTERM then start on the same folder and port: stores were durable
    storage = KvcacheHiCacheStorage(storage_config(d.address), {})
    storage.register_mem_pool_host(pool)
    assert prefetch(storage, keys) == 4, "a prefix of 6 pages with the last 2 never stored"
    # Tokens by tier: after the restart the 4 pages are on SSD, the 2 others not found.
    (counts,) = storage.tokens_by_tier().values()
    assert counts == {"hbm": 0, "ram": 0, "ssd": 4 * pool.page_size, "none": 2 * pool.page_size}
    # _page_get_zero_copy: batch_get_v1 into free slots of the host pool, in place.
    results = storage.batch_get_v1(keys, slots(8, 6, pool.page_size), None)
    assert results == [True] * 4 + [False] * 2
    assert leading(results) == 4
    for p in range(4):
        assert pool.page((8 + p) * pool.page_size) == want[p], f"page {p}"
    assert storage.exists(keys[0]) and not storage.exists(keys[5])
    assert storage.stats["failed_calls"] == 0
    storage.close()


def test_sglang_pages_move_through_shared_memory_when_co_located(make_daemon, seed):
    rng = np.random.default_rng(seed)
    d = make_daemon()
    pool = PageFirstHostPool(rng)
    storage = KvcacheHiCacheStorage(storage_config(d.address, shm_socket=d.socket), {})
    storage.register_mem_pool_host(pool)
    keys = sglang_page_hashes(rng.integers(0, 1000, 3 * pool.page_size).tolist(), pool.page_size)
    want = [pool.page(p * pool.page_size) for p in range(3)]
    assert storage.batch_set_v1(keys, slots(0, 3, pool.page_size)) == [True] * 3
    assert storage.batch_get_v1(keys, slots(4, 3, pool.page_size)) == [True] * 3
    client = storage._store.client()
    assert client.shared_memory, client.shm_error
    for p in range(3):
        assert pool.page((4 + p) * pool.page_size) == want[p]
    storage.close()


def test_sglang_generic_get_and_set_of_flat_pages(daemon, seed):
    """The older path (cache_controller.py _generic_page_get: batch_get into
    get_dummy_flat_data_page() tensors, None from the first miss; backup: batch_set of
    get_data_page tensors)."""
    rng = np.random.default_rng(seed)
    pool = PageFirstHostPool(rng)
    storage = KvcacheHiCacheStorage(storage_config(daemon.address), {})
    storage.register_mem_pool_host(pool)
    keys = sglang_page_hashes(rng.integers(0, 1000, 3 * pool.page_size).tolist(), pool.page_size)
    pages = [pool.get_data_page(p * pool.page_size) for p in range(3)]
    assert storage.batch_set(keys[:2], pages[:2])
    assert storage.set(keys[2], pages[2])
    dst = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = storage.batch_get(keys + ["f" * 64], dst)
    assert got[3] is None
    for p in range(3):
        assert got[p] is dst[p] and bytes(got[p].view(torch.uint8).numpy()) == \
            bytes(pages[p].view(torch.uint8).numpy())
    assert storage.get("0" * 64, pool.get_dummy_flat_data_page()) is None
    storage.close()


def test_sglang_a_second_tenant_neither_sees_nor_overwrites_the_first_ones_pages(make_daemon, tmp_path, seed):
    rng = np.random.default_rng(seed)
    d = two_tenant_daemon(make_daemon, tmp_path)
    pool = PageFirstHostPool(rng)
    a = KvcacheHiCacheStorage(storage_config(d.address, "tok-a"), {})
    b = KvcacheHiCacheStorage(storage_config(d.address, "tok-b"), {})
    for s in (a, b):
        s.register_mem_pool_host(pool)
    keys = sglang_page_hashes(rng.integers(0, 1000, 2 * pool.page_size).tolist(), pool.page_size)
    want = [pool.page(p * pool.page_size) for p in range(2)]
    assert all(a.batch_set_v1(keys, slots(0, 2, pool.page_size)))
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, slots(4, 2, pool.page_size)) == [False, False]
    # globex stores other bytes under the same keys: acme still reads its own.
    assert all(b.batch_set_v1(keys, slots(8, 2, pool.page_size)))
    assert all(a.batch_get_v1(keys, slots(12, 2, pool.page_size)))
    for p in range(2):
        assert pool.page((12 + p) * pool.page_size) == want[p]
    a.close()
    b.close()


def test_sglang_a_daemon_that_is_down_gives_misses_not_exceptions(seed):
    rng = np.random.default_rng(seed)
    pool = PageFirstHostPool(rng)
    storage = KvcacheHiCacheStorage(storage_config(f"127.0.0.1:{free_port()}"), {})
    storage.register_mem_pool_host(pool)
    storage.register_mem_host_pool_v2(pool, "kv")
    keys = sglang_page_hashes(rng.integers(0, 1000, 2 * pool.page_size).tolist(), pool.page_size)
    started = time.monotonic()
    assert storage.batch_exists(keys) == 0
    assert storage.batch_get_v1(keys, slots(0, 2, pool.page_size)) == [False, False]
    assert storage.batch_set_v1(keys, slots(0, 2, pool.page_size)) == [False, False]
    assert storage.batch_set(keys, [pool.get_data_page(0)] * 2) is False
    assert storage.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert storage.batch_exists_v2(keys, []).kv_hit_pages == 0
    assert storage.batch_get_v2([PoolTransfer("kv", slots(0, 2, pool.page_size), keys=keys)]) == \
        {"kv": [False, False]}
    print(f"7 calls to a daemon that is down: {time.monotonic() - started:.2f} s")
    assert time.monotonic() - started < 5, "calls to a down daemon wait for its retries, never a timeout"
    assert storage.stats["failed_calls"] >= 6


def test_sglang_hybrid_pools_load_the_prefix_every_pool_holds(daemon, seed):
    """The v2 calls for a hybrid model (hicache_storage.py batch_exists_v2 / batch_get_v2 /
    batch_set_v2; PoolHitPolicy): an indexer pool needed for every page (all_pages), a state
    pool needed only for the prefix's last page (trailing_pages)."""
    rng = np.random.default_rng(seed)
    kv, indexer, state = PageFirstHostPool(rng), StatePool(rng, width=40), StatePool(rng, width=24)
    storage = KvcacheHiCacheStorage(storage_config(daemon.address), {})
    for name, pool in (("kv", kv), ("deepseek_v4_c4_indexer", indexer),
                       ("deepseek_v4_c4_state", state)):
        storage.register_mem_host_pool_v2(pool, name)
    ps = kv.page_size
    keys = sglang_page_hashes(rng.integers(0, 1000, 6 * ps).tolist(), ps)
    stored = storage.batch_set_v2([
        PoolTransfer("kv", slots(0, 6, ps), keys=keys),
        PoolTransfer("deepseek_v4_c4_indexer", slots(0, 5, ps), keys=keys[:5]),
        PoolTransfer("deepseek_v4_c4_state", slots(3, 1, ps), keys=[keys[3]],
                     hit_policy="trailing_pages"),
    ])
    assert stored == {"kv": [True] * 6, "deepseek_v4_c4_indexer": [True] * 5,
                      "deepseek_v4_c4_state": [True]}
    result = storage.batch_exists_v2(keys, [
        PoolTransfer("deepseek_v4_c4_indexer", keys=keys),
        PoolTransfer("deepseek_v4_c4_state", keys=[keys[-1]], hit_policy="trailing_pages"),
    ])
    # kv: 6 pages; indexer: 5; state: only page 3's, so the usable prefix ends after it.
    assert result.kv_hit_pages == 4
    assert result.extra_pool_hit_pages == {"kv": 6, "deepseek_v4_c4_indexer": 5,
                                           "deepseek_v4_c4_state": 4}
    want_kv = [kv.page(p * ps) for p in range(4)]
    want_idx = bytes(indexer.buffer[:4].numpy())
    want_state = bytes(state.buffer[3].numpy())
    loaded = storage.batch_get_v2([
        PoolTransfer("kv", slots(8, 4, ps), keys=keys[:4]),
        PoolTransfer("deepseek_v4_c4_indexer", slots(8, 4, ps), keys=keys[:4]),
        PoolTransfer("deepseek_v4_c4_state", slots(15, 1, ps), keys=[keys[3]]),
    ])
    assert loaded == {"kv": [True] * 4, "deepseek_v4_c4_indexer": [True] * 4,
                      "deepseek_v4_c4_state": [True]}
    for p in range(4):
        assert kv.page((8 + p) * ps) == want_kv[p]
    assert bytes(indexer.buffer[8:12].numpy()) == want_idx
    assert bytes(state.buffer[15].numpy()) == want_state
    storage.close()


class AsymmetricHostPool(PageFirstHostPool):
    """A host pool whose K and V heads differ in size (head_dim != v_head_dim): SGLang's
    get_dummy_flat_data_page raises NotImplementedError for it."""

    def get_dummy_flat_data_page(self):
        raise NotImplementedError("asymmetric K/V: no flat data page")


def test_sglang_an_asymmetric_pool_gets_counts_not_exceptions(daemon, seed):
    """batch_exists on a fresh process with an asymmetric K/V pool (which once raised
    NotImplementedError into the engine and turned L3 off for the process's life)."""
    rng = np.random.default_rng(seed)
    pool = AsymmetricHostPool(rng)
    keys = sglang_page_hashes(rng.integers(0, 1000, 4 * pool.page_size), pool.page_size)
    writer = KvcacheHiCacheStorage(storage_config(daemon.address), {})
    writer.register_mem_pool_host(pool)
    assert writer.batch_set_v1(keys, slots(0, 4, pool.page_size)) == [True] * 4
    writer.close()
    fresh = KvcacheHiCacheStorage(storage_config(daemon.address), {})
    fresh.register_mem_pool_host(AsymmetricHostPool(rng))
    assert prefetch(fresh, keys) == 4
    assert fresh.stats["failed_calls"] == 0
    fresh.close()


def test_sglang_engines_that_differ_in_anything_that_decides_a_pages_bytes_never_share(daemon, seed):
    """Never another engine's KV: the host layout, the KV dtype (same page size, other
    bytes), the model revision and the TP rank each make another namespace; clear() (after
    an in-place weight update under the same served name) makes every page stored before
    unreachable, for this worker and for a new one."""
    rng = np.random.default_rng(seed)
    pool = PageFirstHostPool(rng)
    keys = sglang_page_hashes(rng.integers(0, 1000, 3 * pool.page_size), pool.page_size)

    def storage(pool, **cfg):
        extra = {k: cfg.pop(k) for k in list(cfg) if k == "model_revision"}
        c = storage_config(daemon.address, **extra)
        for k, v in cfg.items():
            setattr(c, k, v)
        s = KvcacheHiCacheStorage(c, {})
        s.register_mem_pool_host(pool)
        return s
    writer = storage(pool)
    assert writer.batch_set_v1(keys, slots(0, 3, pool.page_size)) == [True] * 3
    assert prefetch(storage(PageFirstHostPool(rng)), keys) == 3, "the same engine finds them"
    direct = PageFirstHostPool(rng)
    direct.layout = "page_first_direct"
    half = PageFirstHostPool(rng, dtype=torch.float16)  # the same page size as bfloat16
    others = {"layout": storage(direct), "dtype": storage(half),
              "revision": storage(PageFirstHostPool(rng), model_revision="weights-2"),
              "tp rank": storage(PageFirstHostPool(rng), tp_rank=1, tp_size=2)}
    for field_name, other in others.items():
        assert prefetch(other, keys) == 0, f"an engine that differs in {field_name} found the pages"
        other.close()
    writer.clear()
    assert prefetch(writer, keys) == 0, "cleared pages are still found"
    fresh = storage(PageFirstHostPool(rng))
    assert prefetch(fresh, keys) == 0, "a new worker finds the pages cleared before it started"
    assert fresh.batch_set_v1(keys, slots(0, 3, pool.page_size)) == [True] * 3
    assert prefetch(writer, keys) == 3, "pages stored after the clear are shared again"
    assert writer.stats["failed_calls"] == 0
    writer.close()
    fresh.close()


def _reload_sglang_adapter(monkeypatch, modules):
    """The adapter module imported again with these stand-ins for SGLang's modules."""
    import importlib
    import kvcache.integrations.sglang as adapter
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.metrics"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return importlib.reload(adapter)


def test_sglang_every_hicache_storage_generation_finds_the_real_base(monkeypatch, daemon, seed):
    """An older hicache_storage (HiCacheStorage without PoolTransferResult, e.g. Sep 2025):
    the backend still subclasses the real base (SGLang's loader checks issubclass); and
    where SGLang collects storage metrics, get_stats() is its StorageMetrics."""
    import importlib
    import kvcache.integrations.sglang as adapter
    old = types.ModuleType("sglang.srt.mem_cache.hicache_storage")

    class HiCacheStorage:
        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host
    old.HiCacheStorage = HiCacheStorage
    collector = types.ModuleType("sglang.srt.metrics.collector")

    @dataclass
    class StorageMetrics:  # sglang/srt/metrics/collector.py
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
    collector.StorageMetrics = StorageMetrics
    try:
        mod = _reload_sglang_adapter(monkeypatch, {
            "sglang.srt.mem_cache.hicache_storage": old,
            "sglang.srt.metrics.collector": collector})
        assert issubclass(mod.KvcacheHiCacheStorage, HiCacheStorage)
        rng = np.random.default_rng(seed)
        pool = PageFirstHostPool(rng)
        keys = sglang_page_hashes(rng.integers(0, 1000, 3 * pool.page_size), pool.page_size)
        storage = mod.KvcacheHiCacheStorage(storage_config(daemon.address), {})
        storage.register_mem_pool_host(pool)
        assert storage.batch_set_v1(keys, slots(0, 3, pool.page_size)) == [True] * 3
        assert storage.batch_get_v1(keys, slots(4, 3, pool.page_size)) == [True] * 3
        m = storage.get_stats()
        assert isinstance(m, StorageMetrics)
        assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
        assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
        assert storage.get_stats() == StorageMetrics(), "samples are handed over once"
        storage.close()
    finally:
        monkeypatch.undo()
        importlib.reload(adapter)


# ---- vLLM ----

@dataclass
class JobMetadata:  # vllm/v1/kv_offload/tiering/base.py JobMetadata
    job_id: int
    keys: Any
    block_ids: np.ndarray
    is_promotion: bool = False
    req_context: Any = field(default=None)


def vllm_spec():
    return SimpleNamespace(vllm_config=SimpleNamespace(
        model_config=SimpleNamespace(model="deepseek-ai/DeepSeek-V4.1-Flash")), block_size=16)


def primary(rng, blocks=16, elements=96):
    """The CPU (primary) tier's blocks, one row each, as vLLM hands a tier its view."""
    return torch.from_numpy(rng.standard_normal((blocks, elements)).astype(np.float32))


_FINISHED = {}  # (tier, job id) -> success, as polled


def finish(tier, job_id, timeout_s=30):
    """Polls get_finished() as vLLM's scheduler does each step, until job_id reports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in tier.get_finished():
            _FINISHED[(id(tier), r.job_id)] = r.success
        if (id(tier), job_id) in _FINISHED:
            return _FINISHED.pop((id(tier), job_id))
        time.sleep(0.005)
    raise AssertionError(f"job {job_id} never finished")


def settle(tier, key, timeout_s=30):
    """lookup() as vLLM's scheduler calls it, once a step: RETRY (None) until the background
    lookup has answered, then the answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = tier.lookup(key, None)
        if got is not None:
            return got
        time.sleep(0.005)
    raise AssertionError("lookup kept answering RETRY")


def block_keys(rng, n):
    """vLLM block hashes (bytes; sha256 -> 32 bytes), and one longer key."""
    keys = [rng.bytes(32) for _ in range(n - 1)]
    return keys + [rng.bytes(80)]


def test_vllm_tier_stores_and_loads_blocks_across_restarts(make_daemon, seed):
    """The cascade and the promotion (tiering/base.py: stores GPU -> CPU -> secondary,
    loads secondary -> CPU -> GPU; submit_* return at once, get_finished polls)."""
    rng = np.random.default_rng(seed)
    d = make_daemon()
    cpu = primary(rng)
    tier = KvcacheSecondaryTier(vllm_spec(), memoryview(cpu.numpy()), "kvcache", target=d.address)
    keys = block_keys(rng, 4)
    assert [settle(tier, k) for k in keys] == [False] * 4
    tier.submit_store(JobMetadata(1, keys, np.array([2, 3, 4, 5])))
    assert finish(tier, 1)
    assert [tier.lookup(k, None) for k in keys] == [True] * 4
    tier.shutdown()

    d.restart()
    # As tiering/factory.py constructs a tier: keywords, the vllm_config, the config's options.
    config = SimpleNamespace(model_config=SimpleNamespace(model="deepseek-ai/DeepSeek-V4.1-Flash"),
                             cache_config=SimpleNamespace(block_size=16))
    tier = KvcacheSecondaryTier(vllm_config=config, primary_kv_view=memoryview(cpu.numpy()),
                                tier_type="kvcache", target=d.address)
    assert tier.lookup(keys[0], None) is None, "an unseen key is looked up in the background"
    assert settle(tier, keys[0]) is True, "found by asking the daemon, not from memory"
    tier.submit_load(JobMetadata(2, keys, np.array([10, 11, 12, 13]), True))
    assert finish(tier, 2)
    assert torch.equal(cpu[10:14], cpu[2:6])
    # Tokens by tier: the 4 blocks came from SSD after the restart (the first as its lookup
    # said, the others asked by the job).
    (counts,) = tier.tokens_by_tier().values()
    assert counts == {"hbm": 0, "ram": 0, "ssd": 4 * 16, "none": 0}
    # A job with a block never stored fails as a whole (vLLM then recomputes).
    tier.submit_load(JobMetadata(3, [keys[0], rng.bytes(32)], np.array([14, 15]), True))
    assert finish(tier, 3) is False
    (counts,) = tier.tokens_by_tier().values()
    assert counts["none"] == 16 and sum(counts.values()) == 6 * 16, "every block of a job counts"
    tier.drain_jobs()
    tier.shutdown()


def test_vllm_tier_keeps_tenants_apart_and_survives_a_daemon_that_is_down(make_daemon, tmp_path, seed):
    rng = np.random.default_rng(seed)
    d = two_tenant_daemon(make_daemon, tmp_path)
    cpu = primary(rng)
    view = memoryview(cpu.numpy())
    a = KvcacheSecondaryTier(vllm_spec(), view, "kvcache", target=d.address, token="tok-a")
    b = KvcacheSecondaryTier(vllm_spec(), view, "kvcache", target=d.address, token="tok-b")
    keys = block_keys(rng, 2)
    a.submit_store(JobMetadata(1, keys, np.array([0, 1])))
    assert finish(a, 1)
    assert [settle(b, k) for k in keys] == [False, False]
    b.submit_load(JobMetadata(2, keys, np.array([6, 7]), True))
    assert finish(b, 2) is False
    a.shutdown()
    b.shutdown()
    d.stop()
    down = KvcacheSecondaryTier(vllm_spec(), view, "kvcache", target=d.address, token="tok-a",
                                timeout_s=2)
    assert settle(down, keys[0]) is False
    down.submit_store(JobMetadata(3, keys, np.array([0, 1])))
    down.submit_load(JobMetadata(4, keys, np.array([8, 9]), True))
    assert finish(down, 3) is False and finish(down, 4) is False
    down.shutdown()


@dataclass
class TransferJob:  # the current tiering API: chunk_ids, not block_ids (vllm PR #52615)
    job_id: int
    keys: Any
    chunk_ids: np.ndarray
    is_promotion: bool = False
    req_context: Any = field(default=None)


def test_vllm_current_api_chunk_ids_and_lookup_results(make_daemon, seed, monkeypatch):
    """The current tier API: jobs name chunk_ids, lookup answers the tiering base's
    LookupResult (HIT / MISS / RETRY), finished jobs are polled as get_finished_jobs()."""
    import enum
    base = types.ModuleType("vllm.v1.kv_offload.tiering.base")

    class LookupResult(enum.Enum):
        HIT = 1
        MISS = 2
        RETRY = 3
    base.LookupResult = LookupResult
    for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.tiering"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.kv_offload.tiering.base", base)
    rng = np.random.default_rng(seed)
    d = make_daemon()
    cpu = primary(rng)
    tier = KvcacheSecondaryTier(vllm_spec(), memoryview(cpu.numpy()), "kvcache", target=d.address)
    keys = block_keys(rng, 3)
    assert tier.lookup(keys[0], None) is LookupResult.RETRY
    answer = LookupResult.RETRY
    deadline = time.monotonic() + 30
    while answer is LookupResult.RETRY and time.monotonic() < deadline:
        time.sleep(0.005)
        answer = tier.lookup(keys[0], None)
    assert answer is LookupResult.MISS
    tier.submit_store(TransferJob(1, keys, np.array([1, 2, 3])))
    done = []
    while not done and time.monotonic() < deadline:
        done = [r for r in tier.get_finished_jobs() if r.job_id == 1]
        time.sleep(0.005)
    assert done and done[0].success
    assert tier.lookup(keys[0], None) is LookupResult.HIT, "a miss is forgotten once stored"
    tier.submit_load(TransferJob(2, keys, np.array([7, 8, 9]), True))
    done = []
    while not done and time.monotonic() < deadline:
        done = [r for r in tier.get_finished_jobs() if r.job_id == 2]
        time.sleep(0.005)
    assert done and done[0].success
    assert torch.equal(cpu[7:10], cpu[1:4])
    tier.shutdown()


def test_vllm_lookup_never_waits_on_a_hung_daemon(make_daemon, seed):
    """The scheduler thread calls lookup() for every unseen block: with the daemon stopped
    (SIGSTOP: connected, answering nothing) each call returns RETRY at once, and the keys
    turn into misses once timeout_s has passed (the old lookup blocked for timeout_s)."""
    rng = np.random.default_rng(seed)
    d = make_daemon()
    cpu = primary(rng)
    tier = KvcacheSecondaryTier(vllm_spec(), memoryview(cpu.numpy()), "kvcache", target=d.address,
                                timeout_s=1)
    warm = block_keys(rng, 1)[0]
    assert settle(tier, warm) is False  # connected and registered
    d.proc.send_signal(signal.SIGSTOP)
    try:
        slowest = 0.0
        keys = block_keys(rng, 200)
        for k in keys:
            t0 = time.monotonic()
            assert tier.lookup(k, None) is None
            slowest = max(slowest, time.monotonic() - t0)
        print(f"slowest lookup against a hung daemon: {slowest * 1e3:.3f} ms")
        assert slowest < 0.1, f"lookup waited {slowest:.3f} s on the daemon"
        assert settle(tier, keys[0], timeout_s=20) is False
    finally:
        d.proc.send_signal(signal.SIGCONT)
    tier.shutdown()


def test_vllm_tiers_that_differ_in_anything_that_decides_a_blocks_bytes_never_share(make_daemon, seed):
    """Never another engine's KV: the KV cache dtype, the TP size, the model revision each
    make another namespace; a config naming no model is refused, not shared as "model"."""
    rng = np.random.default_rng(seed)
    d = make_daemon()
    cpu = primary(rng)
    view = memoryview(cpu.numpy())

    def spec(dtype="auto", tp=1, revision=None):
        return SimpleNamespace(vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(model="deepseek-ai/DeepSeek-V4.1-Flash", revision=revision),
            cache_config=SimpleNamespace(block_size=16, cache_dtype=dtype),
            parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                            decode_context_parallel_size=1)))
    writer = KvcacheSecondaryTier(spec(), view, "kvcache", target=d.address)
    keys = block_keys(rng, 2)
    writer.submit_store(JobMetadata(1, keys, np.array([0, 1])))
    assert finish(writer, 1)
    same = KvcacheSecondaryTier(spec(), view, "kvcache", target=d.address)
    assert settle(same, keys[0]) is True
    for name, other_spec in {"dtype": spec(dtype="fp8_e5m2"), "tp size": spec(tp=2),
                             "revision": spec(revision="abc123")}.items():
        other = KvcacheSecondaryTier(other_spec, view, "kvcache", target=d.address)
        assert settle(other, keys[0]) is False, f"a tier that differs in {name} found the block"
        other.shutdown()
    with pytest.raises(ValueError, match="no model identity"):
        KvcacheSecondaryTier(SimpleNamespace(block_size=16), view, "kvcache", target=d.address)
    writer.shutdown()
    same.shutdown()


def test_vllm_finds_the_tier_through_its_plugin(monkeypatch):
    """The package's vllm.general_plugins entry point calls register(), which puts the tier
    in SecondaryTierFactory (tiering/factory.py register_tier) under "kvcache", once."""
    registered = {}

    class SecondaryTierFactory:
        @classmethod
        def register_tier(cls, tier_type, module_path, class_name):
            if tier_type in registered:
                raise ValueError(f"Tier '{tier_type}' is already registered.")
            registered[tier_type] = (module_path, class_name)
    factory = types.ModuleType("vllm.v1.kv_offload.tiering.factory")
    factory.SecondaryTierFactory = SecondaryTierFactory
    for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.tiering"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, factory.__name__, factory)
    from kvcache.integrations import vllm as adapter
    adapter.register()
    adapter.register()  # each vLLM process runs its plugins; a second call is harmless
    assert registered == {"kvcache": ("kvcache.integrations.vllm", "KvcacheSecondaryTier")}
