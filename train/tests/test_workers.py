"""--workers 2: two processes train data-parallel and end with the same weights (the
trainer checks), rank 0 keeps the 1-worker run's batches (its first step's loss is the
1-worker run's), and only rank 0 writes the run's files."""
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..")
SOURCE = os.path.join(TRAIN, "..")


def manifest(tmp_path) -> str:
    files = []
    for path, split in [("docs/storage.md", "train"), ("docs/model.md", "train"),
                        ("docs/service.md", "held_out")]:
        full = os.path.abspath(os.path.join(SOURCE, path))
        raw = open(full, "rb").read()
        files.append({"path": full, "split": split, "bytes": len(raw),
                      "sha256": hashlib.sha256(raw).hexdigest()})
    m = {"files": files, "corpus_sha256": "test"}
    out = os.path.join(str(tmp_path), "manifest.json")
    with open(out, "w") as f:
        json.dump(m, f)
    return out


def train(tmp_path, name: str, workers: int) -> list:
    out = os.path.join(str(tmp_path), name)
    r = subprocess.run([sys.executable, "-m", "kvtrain.train", "--config",
                        os.path.join(SOURCE, "configs", "small.json"), "--out", out,
                        "--manifest", manifest(tmp_path), "--steps", "3", "--seq", "160",
                        "--batch", "1", "--eval-every", "1000", "--checkpoint-every", "1000",
                        "--workers", str(workers)],
                       cwd=TRAIN, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    recipe = json.load(open(os.path.join(out, "recipe.json")))
    assert recipe["workers"] == workers
    assert recipe["tokens"] == recipe["tokens_total"] == 3 * 1 * 160 * workers
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    return [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]


def test_two_workers_share_rank_zeros_batches_and_end_equal(tmp_path):
    one = train(tmp_path, "one", 1)
    two = train(tmp_path, "two", 2)
    assert [r["step"] for r in two] == [1, 2, 3]  # rank 0 alone logs
    assert two[0]["loss"] == one[0]["loss"]  # the same first batch and weights
    assert two[1]["loss"] != one[1]["loss"]  # the second step saw both workers' gradients
