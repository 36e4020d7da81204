"""kvcache as a secondary tier of vLLM's offloading connector.

vLLM's offloading connector keeps a CPU (primary) tier of KV blocks and cascades them to
secondary tiers (vllm/v1/kv_offload/tiering/base.py, SecondaryTierManager): blocks are
stored from, and loaded into, the primary tier's host memory by block id, in jobs that run
in the background and are polled with get_finished(). KvcacheSecondaryTier keeps those
blocks in a caller-keyed namespace of kvcached under vLLM's own block keys, so blocks
outlive the engine and are shared by every vLLM instance of the same model on the same
cache (and tenant).

Enable it (docs/integrations.md) in kv_transfer_config; the package's vllm.general_plugins
entry point (register() below) makes the type "kvcache" known to vLLM:

    PYTHONHASHSEED=0 vllm serve MODEL --kv-transfer-config '{"kv_connector":
      "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 34359738368,
        "secondary_tiers": [{"type": "kvcache", "target": "127.0.0.1:50051"}]}}'

Options: target (default $KVCACHE_TARGET), token / token_env (default $KVCACHE_TOKEN),
shm_socket, model_id (default: from the configured model), block_bytes (when the primary
view is flat bytes), io_threads (default 4), timeout_s (default 5), durable, miss_ttl_s
(default 2: how long a miss is answered from memory before the daemon is asked again).

API generations, told apart by what the objects have, never by version strings: jobs name
their primary-tier slots `chunk_ids` (current) or `block_ids` (older); lookup() answers
vLLM's LookupResult (HIT / MISS / RETRY) where the tiering base defines it, else True /
False / None. lookup() never does I/O on the scheduler thread: an unseen key is answered
RETRY and looked up, batched with the others, on a background thread (as vLLM's own
AsyncLookupManager does), so a hung or partitioned daemon costs the scheduler no wait —
its keys turn into misses once timeout_s has passed.

The seed of vLLM's block-hash chain is random per process unless PYTHONHASHSEED is set: set
the same value on every instance, and keep it across restarts, or no block is found again.
A request's cache_salt is already folded into vLLM's block hashes (two salts never share a
block); kvcached's tenant (the bearer token) is the boundary the cache enforces — quotas,
no probing of another tenant's blocks — so give each isolation domain its own token.
"""
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Optional, Set, Tuple

from .._common import ChunkSink
from ..api import CacheClient
from ..hashing import Namespace
from ._pages import PageStore, caller_key, guarded, identity, settings

log = logging.getLogger("kvcache.integrations")

try:
    from vllm.v1.kv_offload.tiering.base import JobResult
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager as _Base
except ImportError:  # vLLM not installed: the same interface, for tests and tools
    @dataclass
    class JobResult:  # type: ignore[no-redef]
        job_id: int
        success: bool

    class _Base:  # type: ignore[no-redef]
        """SecondaryTierManager's constructor (vllm/v1/kv_offload/tiering/base.py)."""

        def __init__(self, offloading_spec: Any, primary_kv_view: memoryview,
                     tier_type: str) -> None:
            self._offloading_spec = offloading_spec
            self._primary_kv_view = primary_kv_view
            self.tier_type = tier_type

POOL = "blocks"
TIER_TYPE = "kvcache"


def register() -> None:
    """Registers the tier with vLLM's SecondaryTierFactory as type "kvcache". vLLM runs it in
    each of its processes as a general plugin (the package's entry point
    `vllm.general_plugins: kvcache`); harmless when vLLM is absent or it already ran."""
    try:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    except ImportError:
        return
    try:
        SecondaryTierFactory.register_tier(TIER_TYPE, __name__, "KvcacheSecondaryTier")
    except ValueError:
        pass  # registered before in this process
_KNOWN = 1 << 16  # keys remembered (lookups answered without a call)
_BATCH = 4096     # keys per background Lookup call


def _lookup_answers() -> Tuple[Any, Any, Any]:
    """(hit, miss, retry) as the installed vLLM's lookup() returns them: its LookupResult
    where the tiering base defines one, else True / False / None (the older contract)."""
    try:
        from vllm.v1.kv_offload.tiering.base import LookupResult
    except ImportError:
        return True, False, None
    names = {m.name.upper(): m for m in LookupResult}
    hit = names.get("HIT") or names.get("FOUND")
    miss = names.get("MISS") or names.get("NOT_FOUND")
    retry = names.get("RETRY") or names.get("PENDING")
    if hit is None or miss is None or retry is None:
        log.warning("vLLM's LookupResult has %s; answering True/False/None", sorted(names))
        return True, False, None
    return hit, miss, retry


def _slots_of(job: Any) -> Any:
    """A job's primary-tier slots: `chunk_ids` (current vLLM) or `block_ids` (older)."""
    ids = getattr(job, "chunk_ids", None)
    return job.block_ids if ids is None else ids


def _find(spec: Any, *paths: str) -> Any:
    """The first attribute path (dotted) that the spec or its vllm_config has."""
    for path in paths:
        for root in (getattr(spec, "vllm_config", None), spec):
            obj = root
            for attr in path.split("."):
                obj = getattr(obj, attr, None) if obj is not None else None
            if obj not in (None, ""):
                return obj
    return None


def _spec_identity(spec: Any, options: Dict[str, Any]) -> str:
    """Everything that decides a block's bytes beside its key and size (docs/integrations.md,
    "Never another engine's KV"): the model and its revision, the KV cache dtype, the block
    size, and the tensor-, pipeline- and decode-context-parallel sizes (the primary tier's
    block holds what its workers' layouts put there). model_id overrides the model's name;
    without it and without a configured model the tier refuses to start rather than share
    one name ("model") with every other model."""
    model = options.get("model_id") or _find(spec, "model_config.model", "model")
    if not isinstance(model, str) or not model:
        raise ValueError("no model identity: give the tier a model_id option (the vLLM config "
                         "names no model), or blocks of different models would be shared")
    revision = options.get("model_revision") or _find(spec, "model_config.revision")
    return "vllm:" + ":".join(p for p in (
        model + (f"@{revision}" if revision else ""),
        identity(("dtype", _find(spec, "cache_config.cache_dtype")),
                 ("block", _find(spec, "cache_config.block_size", "block_size")),
                 ("tp", _find(spec, "parallel_config.tensor_parallel_size")),
                 ("pp", _find(spec, "parallel_config.pipeline_parallel_size")),
                 ("dcp", _find(spec, "parallel_config.decode_context_parallel_size")))) if p)


class KvcacheSecondaryTier(_Base):  # type: ignore[misc]  # (Any where vLLM is installed)
    """vLLM's SecondaryTierManager over kvcached (see the module docstring)."""

    def __init__(self, offloading_spec: Any = None, primary_kv_view: Any = None,
                 tier_type: str = "kvcache", vllm_config: Any = None, **options: Any) -> None:
        # vLLM versions construct tiers with the offloading spec or with the vllm_config
        # (tiering/factory.py: cls(vllm_config=…, primary_kv_view=…, tier_type=…, **config)).
        spec = offloading_spec if offloading_spec is not None else vllm_config
        if primary_kv_view is None:
            raise ValueError("no primary_kv_view: the CPU tier's blocks are where pages go")
        try:
            super().__init__(spec, primary_kv_view, tier_type)
        except TypeError:  # a base whose constructor takes other arguments
            self._primary_kv_view, self.tier_type = primary_kv_view, tier_type
        view = memoryview(primary_kv_view)
        if view.ndim >= 2 and view.shape:  # one row per block (the primary tier's layout)
            blocks = view.shape[0]
            block_bytes = view.nbytes // blocks
        else:
            block_bytes = int(options.get("block_bytes", 0))
            if block_bytes <= 0 or view.nbytes % block_bytes:
                raise ValueError(f"the primary view is {view.nbytes} flat bytes: give block_bytes "
                                 "(the bytes of one block)")
        self._flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._block_bytes = block_bytes
        self._blocks = self._flat.nbytes // block_bytes
        target, token, shm, timeout_s = settings(options)
        model = _spec_identity(spec, options)
        self._tokens = int(getattr(spec, "block_size", 0) or
                           getattr(getattr(spec, "cache_config", None), "block_size", 0) or 0)
        self._durable = bool(options.get("durable", True))
        self._store = PageStore(target, token, model, timeout_s, shm)
        self._pool = ThreadPoolExecutor(int(options.get("io_threads", 4)),
                                        thread_name_prefix="kvcache-tier")
        self._lock = threading.Lock()
        self._finished: List[Any] = []
        self._jobs: Set["Future[None]"] = set()
        self._storing: Dict[Any, int] = {}  # key -> store jobs in flight
        # Known stored (bounded), with the tier the daemon last named (RAM for a block this
        # tier stored: kvcached answers RAM before SSD).
        self._stored: "OrderedDict[bytes, str]" = OrderedDict()
        # Background lookups: keys asked and not yet answered, and recent misses (when).
        self._hit, self._miss, self._retry = _lookup_answers()
        self._miss_ttl_s = float(options.get("miss_ttl_s", 2.0))
        self._asked: "OrderedDict[bytes, None]" = OrderedDict()  # queued or in flight
        self._missed: "OrderedDict[bytes, float]" = OrderedDict()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._looker = threading.Thread(target=self._lookup_loop, name="kvcache-tier-lookup",
                                        daemon=True)
        self._looker.start()

    # ---- helpers ----
    def _blocks_of(self, block_ids: Any) -> List[memoryview]:
        out = []
        for b in (int(x) for x in block_ids):
            if not 0 <= b < self._blocks:
                raise ValueError(f"block id {b} outside the primary tier's {self._blocks} blocks")
            out.append(self._flat[b * self._block_bytes:(b + 1) * self._block_bytes])
        return out

    def _remember(self, keys: List[bytes]) -> None:
        with self._lock:
            for k in keys:
                self._stored[k] = "ram"
                self._stored.move_to_end(k)
                self._missed.pop(k, None)
            while len(self._stored) > _KNOWN:
                self._stored.popitem(last=False)

    def _lookup_loop(self) -> None:
        """The background half of lookup(): every key asked since the last round, in one
        Lookup call per _BATCH keys; a failure (a daemon down or hung past timeout_s)
        answers them all as misses."""
        while True:
            with self._lock:
                while not self._asked and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                batch = list(self._asked)[:_BATCH]
            found = guarded("lookup", lambda: None, lambda: self._store.run(
                POOL, self._block_bytes, self._tokens,
                lambda c, ns: c.tiers_of(ns, self._store.keys(c, ns, batch))))
            now = time.monotonic()
            with self._lock:
                for i, k in enumerate(batch):
                    self._asked.pop(k, None)
                    if found is not None and found[i] != "none":
                        self._stored[k] = found[i]
                        self._stored.move_to_end(k)
                    else:
                        self._missed[k] = now
                while len(self._stored) > _KNOWN:
                    self._stored.popitem(last=False)
                while len(self._missed) > _KNOWN:
                    self._missed.popitem(last=False)

    def _submit(self, job: Any, work: Any, keys: List[Any]) -> None:
        def run() -> None:
            ok = guarded("offload job", lambda: False, work)
            with self._lock:
                self._finished.append(JobResult(job_id=job.job_id, success=bool(ok)))
        future = self._pool.submit(run)
        with self._lock:
            self._jobs.add(future)
        future.add_done_callback(lambda f: self._discard(f))

    def _discard(self, future: "Future[None]") -> None:
        with self._lock:
            self._jobs.discard(future)

    # ---- SecondaryTierManager ----
    def lookup(self, key: Any, req_context: Any = None) -> Any:
        """HIT (True) if the block is stored, RETRY (None) while a store of it or the
        background lookup of it is under way, MISS (False) otherwise — also when the cache
        cannot be reached. Never waits on the daemon: an unseen key is queued for the
        background lookup and answered RETRY; a miss is remembered for miss_ttl_s."""
        ck = caller_key(key)
        with self._lock:
            if key in self._storing:
                return self._retry
            if ck in self._stored:
                return self._hit
            missed = self._missed.get(ck)
            if missed is not None and time.monotonic() - missed < self._miss_ttl_s:
                return self._miss
            if ck not in self._asked:
                self._missed.pop(ck, None)
                self._asked[ck] = None
                self._wake.notify()
            return self._retry

    def on_schedule_end(self) -> None:
        """vLLM's end-of-step hook: lookups are already under way (queued as asked)."""
        return None

    def submit_store(self, job_metadata: Any) -> None:
        """Stores the primary tier's blocks (pinned by vLLM until the job finishes) under
        the job's keys, in the background; get_finished() reports it."""
        keys = list(job_metadata.keys)
        with self._lock:
            for k in keys:
                self._storing[k] = self._storing.get(k, 0) + 1

        def work() -> bool:
            try:
                blocks = self._blocks_of(_slots_of(job_metadata))
                cks = [caller_key(k) for k in keys]
                self._store.run(POOL, self._block_bytes, self._tokens, lambda c, ns: c.store_keys(
                    ns, self._store.keys(c, ns, cks), blocks, durable=self._durable))
                self._remember(cks)
                return True
            finally:
                with self._lock:
                    for k in keys:
                        left = self._storing.get(k, 1) - 1
                        if left:
                            self._storing[k] = left
                        else:
                            self._storing.pop(k, None)
        self._submit(job_metadata, work, keys)

    def submit_load(self, job_metadata: Any) -> None:
        """Loads the job's blocks into the primary tier's slots, in the background; the job
        succeeds only if every block arrived."""
        keys = list(job_metadata.keys)

        def work() -> bool:
            blocks = self._blocks_of(_slots_of(job_metadata))
            if len(blocks) != len(keys):
                raise ValueError(f"{len(keys)} keys for {len(blocks)} block ids")
            cks = [caller_key(k) for k in keys]
            sink = ChunkSink(self._block_bytes, parts=[[b] for b in blocks])  # checked above
            with self._lock:  # the tier each block is in, as last named
                tiers = [self._stored.get(k) for k in cks]
            unknown = [i for i, t in enumerate(tiers) if t is None]

            def fetch(c: CacheClient, ns: Namespace) -> int:
                chunk_keys = self._store.keys(c, ns, cks)
                if unknown:  # blocks vLLM did not ask this tier about: asked now
                    asked = c.tiers_of(ns, [chunk_keys[i] for i in unknown])
                    for i, t in zip(unknown, asked):
                        tiers[i] = t
                return c.fetch_scattered(ns, chunk_keys, sink)
            got = self._store.run(POOL, self._block_bytes, self._tokens, fetch)
            # Tokens by tier: the blocks served, by their tiers; the rest of the job none.
            self._store.tokens.add(self._store.name_of(POOL),
                                   [str(t) for t in tiers[:got]] + ["none"] * (len(cks) - got),
                                   self._tokens)
            if got < len(keys):
                with self._lock:  # evicted since: answer misses, not hits, from memory
                    now = time.monotonic()
                    for k in cks[got:]:
                        self._stored.pop(k, None)
                        self._missed[k] = now
            return got == len(keys)
        self._submit(job_metadata, work, keys)

    def tokens_by_tier(self) -> Dict[str, Dict[str, int]]:
        """Prompt tokens this tier's load jobs served into the primary tier, by the kvcached
        tier that held each block (hbm, ram, ssd, as the last lookup named it; none: a block
        of the job that did not arrive), per namespace — what vLLM counts as cached by this
        tier in prompt_tokens_cached_by_source, once per loaded block."""
        return self._store.tokens.snapshot()

    def get_finished(self) -> List[Any]:
        """Jobs (loads and stores) finished since the last call."""
        with self._lock:
            done, self._finished = self._finished, []
        return done

    get_finished_jobs = get_finished  # the name in some vLLM versions

    def touch(self, keys: Collection[Any], req_context: Any = None) -> None:
        return None  # kvcached keeps its own recency

    def drain_jobs(self) -> None:
        """Waits for every job submitted so far."""
        with self._lock:
            jobs = list(self._jobs)
        for f in jobs:
            f.result()

    def request_finished(self, req_context: Any) -> None:
        return None

    def get_request_offloading_context(self, req_context: Any) -> Any:
        try:
            from vllm.v1.kv_offload.base import RequestOffloadingContext
        except ImportError:
            return None
        return RequestOffloadingContext()

    on_new_request = get_request_offloading_context

    def shutdown(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        self._looker.join()
        self._pool.shutdown(wait=True)
        self._store.close()
