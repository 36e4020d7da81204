"""bench/train/step_bench.py runs the real trainer per variant and reports each variant's
tokens/s and its ratio to the first: a short run on configs/mini.json checks the table is
there and the numbers are positive and consistent (ratio = tokens/s ÷ the baseline's), and
that the `commit` variant runs a commit's own trainer (HEAD's here)."""
import os
import re
import subprocess
import sys

from test_workers import manifest  # a manifest of this repository's docs

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))


def test_step_bench_reports_each_variant_against_the_first(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "train", "step_bench.py"),
                        "--config", os.path.join(SOURCE, "configs", "mini.json"), "--steps", "3",
                        "--rounds", "1", "--batch", "1", "--seq", "160", "--manifest", manifest(tmp_path),
                        "--variants", "glibc,kept,commit", "--commit", "HEAD"],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = dict(re.findall(r"^(glibc|kept|commit)\s+(\d+)\s+[\d.]+x$", r.stdout, re.M))
    ratios = dict(re.findall(r"^(glibc|kept|commit)\s+\d+\s+([\d.]+)x$", r.stdout, re.M))
    assert set(rows) == {"glibc", "kept", "commit"}, r.stdout  # commit: HEAD's own trainer
    assert all(int(v) > 0 for v in rows.values())
    assert float(ratios["glibc"]) == 1.0
    kept, base = int(rows["kept"]), int(rows["glibc"])
    want = kept / base
    # the printed tokens/s are rounded to units, the ratio to hundredths
    assert abs(float(ratios["kept"]) - want) <= want * (1 / kept + 1 / base) + 0.006


def test_step_bench_names_an_unknown_variant():
    r = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "train", "step_bench.py"),
                        "--variants", "kept,fastest"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "fastest" in r.stderr
