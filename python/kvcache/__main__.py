"""python -m kvcache: the questions a worker asks, answered as kvctl answers them.

    python -m kvcache [--server HOST:PORT] [--token T] stats
    python -m kvcache [--server …] hash   --config F --model-id M [--chunk-tokens C] --tokens-file F
    python -m kvcache [--server …] lookup --config F --model-id M [--chunk-tokens C] --tokens-file F

The output is byte for byte that of `kvctl` with the same arguments.
"""
import argparse
import sys
import time
from typing import List, Optional, Sequence

from .client import Client
from .errors import KvcacheError


def _tokens(path: str) -> List[int]:
    with open(path) as f:
        words = f.read().split()
    out: List[int] = []
    for i, w in enumerate(words):
        if not w.isdigit() or int(w) >= 2**32:
            raise KvcacheError(f'"{path}": token {i} is "{w}", not a token id')
        out.append(int(w))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvcache", description=__doc__.splitlines()[0])
    p.add_argument("--server", default="127.0.0.1:50051", help="kvcached address")
    p.add_argument("--token", default="", help="bearer token")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stats", help="service statistics")
    for name in ("hash", "lookup"):
        s = sub.add_parser(name, help=f"{name} the chunks of a token file")
        s.add_argument("--config", required=True, help="model config.json")
        s.add_argument("--model-id", required=True)
        s.add_argument("--chunk-tokens", type=int, default=0, help="0: the server default")
        s.add_argument("--tokens-file", required=True, help="whitespace-separated token ids")
    a = p.parse_args(argv)
    try:
        with Client(a.server, token=a.token or None, timeout_s=60.0, shm_socket="") as c:
            if a.cmd == "stats":
                st = c.stats()
                print(f"ram  {st['ram_chunks']} / {st['ram_capacity_chunks']} chunks\n"
                      f"ssd  {st['ssd_chunks']} / {st['ssd_capacity_chunks']} chunks\n"
                      f"hits ram {st['ram_hits']}, ssd {st['ssd_hits']}; misses {st['misses']}\n"
                      f"checksum failures {st['checksum_failures']}, evictions {st['evictions']}, "
                      f"io {st['io_backend']}\n"
                      f"ssd io errors: read {st['read_errors']}, write {st['write_errors']}; at the "
                      f"last start {st['recovered_chunks']} chunks were indexed from their slots"
                      + (" (the index was damaged and rebuilt)" if st['index_rebuilds'] > 0 else ""))
                last = st["ram_scrub_last_pass_unix_s"]
                since = f"{int(time.time()) - last} s ago" if last > 0 else "never"
                print(f"ram scrub: {st['ram_scrub_passes']} passes, "
                      f"{st['ram_scrub_bytes'] / 1e6:.1f} MB verified, last pass {since}, "
                      f"current pass {100 * st['ram_scrub_progress']:.0f}%; "
                      f"corrupt RAM copies dropped {st['ram_checksum_failures']}")
                t = st["shared_tier"]
                if t is not None:
                    print(f"shared tier {t['name']} "
                          f"({'write-behind' if t['write_behind'] else 'write-through'}): "
                          f"{'answering' if t['reachable'] else 'NOT ANSWERING'}; puts {t['puts']} "
                          f"(failed {t['put_errors']}), hits {t['hits']}, misses {t['misses']}, "
                          f"read errors {t['read_errors']}, backlog {t['backlog_chunks']} chunks"
                          + (f"; last error: {t['last_error']}" if t['last_error'] else ""))
                q = st["quota"]
                if q is not None:
                    def lim(x: int) -> str:
                        return str(x) if x else "none"
                    rados = ""
                    if t is not None:
                        held = q['rados_bytes'] if not q['rados_error'] else "?"
                        rados = f", rados {held} / {lim(q['rados_bytes_limit'])} bytes" + (
                            f" ({q['rados_error']})" if q['rados_error'] else "")
                    print(f"quota: ram {q['ram_bytes']} / {lim(q['ram_bytes_limit'])} bytes, "
                          f"ssd {q['ssd_bytes']} / {lim(q['ssd_bytes_limit'])} bytes, "
                          f"pins {q['pinned_chunks']} / {lim(q['pinned_chunks_limit'])}{rados}")
                return 0
            with open(a.config) as f:
                ns = c.register_namespace(f.read(), a.model_id, a.chunk_tokens)
            m = c.lookup(ns, _tokens(a.tokens_file))
            if a.cmd == "lookup":
                print(f"matched {m.matched_chunks} of {len(m.keys)} chunks ({m.matched_tokens} tokens)")
            else:
                for i, k in enumerate(m.keys):
                    print(f"{i} {k.hex()} {m.tiers[i] if i < m.matched_chunks else '-'}")
        return 0
    except (KvcacheError, OSError) as e:
        print(f"kvcache: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
