"""kvtrain.score, the outside check: bits per byte by language with intervals over files,
the compressors beside them, and an exit status that holds a target."""
import hashlib
import json
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvtrain import score  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
WEIGHTS = os.path.join(SOURCE, "train", "weights", "small-v2-plain.safetensors")

# This repository's files stand in for outside text (the model never trained on them).
FILES = [("docs/storage.md", "text"), ("docs/model.md", "text"), ("docs/service.md", "text"),
         ("train/kvtrain/score.py", "python"), ("train/kvtrain/corpus.py", "python")]


def manifest(tmp_path, files=FILES) -> str:
    entries = []
    for path, language in files:
        full = os.path.join(SOURCE, path)
        raw = open(full, "rb").read()
        entries.append({"path": full, "bytes": len(raw), "language": language,
                        "sha256": hashlib.sha256(raw).hexdigest(), "split": "outside"})
    out = os.path.join(str(tmp_path), "outside.json")
    with open(out, "w") as f:
        json.dump({"files": entries, "corpus_sha256": "test"}, f)
    return out


def run(tmp_path, capsys, *extra) -> tuple:
    rc = score.main(["--weights", WEIGHTS, "--manifest", manifest(tmp_path), "--files", "3",
                     "--seq", "200", "--bootstrap", "300", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_trained_weights_beat_the_compressors_and_intervals_hold_the_estimate(tmp_path, capsys):
    rc, r = run(tmp_path, capsys)
    assert rc == 0
    assert set(r["languages"]) == {"text", "python"}
    assert r["languages"]["text"]["files"] == 3 and r["languages"]["python"]["files"] == 2
    assert r["overall"]["bytes"] == 5 * 199  # every byte after a window's first is scored
    for s in list(r["languages"].values()) + [r["overall"]]:
        lo, hi = s["ci95"]
        assert 0 < lo <= s["bits_per_byte"] <= hi
    # a trained byte model reads English and Python far better than uniform bytes (8 bits)
    # and better than gzip on the same 200-byte windows
    assert r["overall"]["bits_per_byte"] < 5.0
    assert r["overall"]["bits_per_byte"] < r["compressors"]["gzip-9"]


def test_target_sets_the_exit_status(tmp_path, capsys):
    assert run(tmp_path, capsys, "--target", "100")[0] == 0
    rc, r = run(tmp_path, capsys, "--target", "0.01")
    assert rc == 1 and r["overall"]["bits_per_byte"] > 0.01


def test_a_changed_file_is_refused(tmp_path, capsys):
    changed = tmp_path / "changed.py"
    changed.write_text("x = 1\n" * 300)
    m = manifest(tmp_path, [(str(changed), "python")])
    changed.write_text("y = 2\n" * 300)
    with pytest.raises(ValueError, match="changed since the manifest"):
        score.main(["--weights", WEIGHTS, "--manifest", m, "--files", "1", "--seq", "64"])


def test_ratio_interval_covers_the_ratio_of_sums():
    seed = time.time_ns() % 2**32
    print("seed", seed)
    rng = np.random.default_rng(seed)
    n = rng.integers(100, 1000, size=40).astype(float)
    rows = np.stack([n * rng.uniform(1.5, 3.5, size=40), n], 1)
    lo, hi = score.ratio_interval(rows, 2000, seed)
    est = rows[:, 0].sum() / rows[:, 1].sum()
    assert lo < est < hi and 1.5 < lo and hi < 3.5
    # one file's bits repeated: no spread
    same = np.tile([[300.0, 100.0]], (10, 1))
    assert score.ratio_interval(same, 100, seed) == pytest.approx((3.0, 3.0))
