"""A client process keeps chunk-sized buffers in its heap (kvcache/_allocator.py): fetching
the reference model's chunks over gRPC does not fault in fresh memory for each one, unless
the process opted out (KVCACHE_TUNE_MALLOC=0) or chose glibc's thresholds itself."""
import os
import subprocess
import sys

from conftest import SOURCE_DIR

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(SOURCE_DIR, "configs", "deepseek-v4.1-flash.config.json")

# In a fresh process: a client stores 32 chunks of the reference model (random bytes of
# the given seed), fetches them 10 times to warm up and 40 times measured into one buffer and checks the bytes; prints
# whether the heap was kept and the minor page faults per chunk fetched.
CODE = """
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import kvcache
target, config, seed = sys.argv[2], open(sys.argv[3]).read(), int(sys.argv[4])
c = kvcache.Client(target)
ns = c.register_namespace(config, "allocator-test")
rng = np.random.default_rng(seed)
n = 32
tokens = rng.integers(0, 1000, ns.chunk_tokens * n).tolist()
payload = rng.integers(0, 256, ns.chunk_bytes * n, dtype=np.uint8)
keys = c.store(ns, tokens, payload, durable=False).keys
out = np.zeros(ns.chunk_bytes * n, dtype=np.uint8)
for _ in range(10):
    c.fetch(ns, keys, out)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    assert c.fetch(ns, keys, out).chunks == n
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
assert np.array_equal(out, payload)
print(c.heap_kept, faults / (40 * n))
"""


def fetch_faults(daemon, seed, **env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k != "KVCACHE_TUNE_MALLOC"}
    r = subprocess.run([sys.executable, "-c", CODE, PACKAGE_DIR, daemon.address, REFERENCE,
                        str(seed)], capture_output=True, text=True, env={**clean, **env},
                       timeout=120)
    assert r.returncode == 0, r.stderr
    kept, per_chunk = r.stdout.split()
    return kept == "True", float(per_chunk)


def test_fetched_chunks_reuse_warm_buffers_unless_the_process_says_otherwise(make_daemon, seed):
    d = make_daemon(["--ram-bytes", str(64 << 20), "--ssd-bytes", "0"])
    kept, faults = fetch_faults(d, seed)
    off, off_faults = fetch_faults(d, seed, KVCACHE_TUNE_MALLOC="0")
    chose, chose_faults = fetch_faults(d, seed, MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    # A reference chunk is 56 pages. glibc's defaults here: ~23 of them faulted afresh per
    # chunk fetched (gRPC's receive buffers and the message's bytes), each ~10 us on a VM.
    print(f"page faults per chunk fetched: kept {faults}, opted out {off_faults}, "
          f"own thresholds {chose_faults}")
    assert kept and not off and not chose
    assert faults < 5, faults
