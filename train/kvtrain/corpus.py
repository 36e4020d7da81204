"""The training corpus: text files every Debian 12 machine with g++ has (the headers of
libstdc++-12-dev and libc6-dev),
listed in a manifest with each file's SHA-256, so a corpus is reproducible and its hash
names it. Files whose hash puts them in the held-out split are never trained on."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Dict, List, Tuple

# The C and C++ standard libraries' headers: the same bytes on every Debian 12 machine with
# g++ (the packages' files, not whatever else a machine installed under /usr/include).
PACKAGES = ["libstdc++-12-dev", "libc6-dev"]
HELD_OUT_EVERY = 16  # one file in 16 (by its path's hash) is held out


def _files() -> List[str]:
    out = subprocess.run(["dpkg", "-L"] + PACKAGES, capture_output=True, text=True, check=True)
    return sorted({p for p in out.stdout.splitlines()
                   if p.startswith("/usr/include/") and os.path.isfile(p)
                   and not os.path.islink(p)})


def held_out(path: str) -> bool:
    return int(hashlib.sha256(path.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def build_manifest(path: str) -> dict:
    files = []
    for p in _files():
        with open(p, "rb") as f:
            data = f.read()
        if b"\0" in data or not data:
            continue  # not text
        files.append({"path": p, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "split": "held_out" if held_out(p) else "train"})
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    manifest = {"packages": PACKAGES, "held_out_every": HELD_OUT_EVERY, "corpus_sha256": digest,
                "files": files}
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def load(manifest_path: str, split: str) -> Tuple[bytes, dict]:
    """The split's files concatenated (each followed by a blank line) and the manifest.
    Refuses a file that is missing or whose bytes changed: the corpus would not be the one
    the manifest names."""
    with open(manifest_path) as f:
        manifest = json.load(f)
    parts = []
    for e in manifest["files"]:
        if e["split"] != split:
            continue
        try:
            with open(e["path"], "rb") as f:
                data = f.read()
        except OSError as err:
            raise ValueError(f"corpus file {e['path']} cannot be read: {err}") from None
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise ValueError(f"corpus file {e['path']} changed since the manifest "
                             f"({manifest_path}) was written")
        parts.append(data + b"\n\n")
    return b"".join(parts), manifest


def held_out_documents(manifest_path: str) -> Dict[str, bytes]:
    with open(manifest_path) as f:
        manifest = json.load(f)
    return {e["path"]: open(e["path"], "rb").read()
            for e in manifest["files"] if e["split"] == "held_out"}
