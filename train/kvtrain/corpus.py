"""The training corpus: text and code that Debian 12 ships in packages (not this
repository's own files), listed in a manifest with each file's SHA-256, so a corpus is
reproducible and its hash names it. Files whose path's hash puts them in the held-out split
are never trained on.

Two manifests exist: `corpus.json` (v1: the C and C++ headers only, what the first shipped
weights were trained on) and `corpus-v2.json` (several languages: C/C++ headers, Python's
standard library, Perl's modules, CMake's modules, shell completions, man pages).
A third, `outside-v1.json`, is never trained on: code in the corpus's languages from other
packages, which `python3 -m kvtrain.score` reads for the outside check."""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
from typing import Callable, Dict, List, Tuple

HELD_OUT_EVERY = 16  # one file in 16 (by its path's hash) is held out

# v1: the C and C++ standard libraries' headers (the packages' files, not whatever else a
# machine installed under /usr/include).
PACKAGES_V1 = ["libstdc++-12-dev", "libc6-dev"]


def _is(prefix: str, *suffixes: str) -> Callable[[str], bool]:
    return lambda p: p.startswith(prefix) and (not suffixes or p.endswith(suffixes))


# v2: each package with the files of it that are text in one language. Every package is on
# a machine that ran scripts/install-deps.sh (build-essential brings perl; python3 its
# standard library; cmake its modules).
SOURCES_V2: List[Tuple[str, str, Callable[[str], bool]]] = [
    ("libstdc++-12-dev", "c++", _is("/usr/include/")),
    ("libc6-dev", "c", _is("/usr/include/")),
    ("libpython3.11-minimal", "python", _is("/usr/lib/python3.11/", ".py")),
    ("libpython3.11-stdlib", "python", _is("/usr/lib/python3.11/", ".py")),
    ("perl-modules-5.36", "perl", _is("/usr/share/perl/", ".pm", ".pl")),
    ("cmake-data", "cmake", _is("/usr/share/cmake-3.25/", ".cmake")),
    ("bash-completion", "shell", _is("/usr/share/bash-completion/")),
    ("manpages", "man", _is("/usr/share/man/", ".gz")),
    ("manpages-dev", "man", _is("/usr/share/man/", ".gz")),
]
# The outside check: code in the corpus's languages from packages the corpus never read
# (third-party Python; C++ and C headers of other libraries). Every package is one
# scripts/install-deps.sh installs. Nothing here is trained on: the split is "outside".
SOURCES_OUTSIDE: List[Tuple[str, str, Callable[[str], bool]]] = [
    ("python3-numpy", "python", _is("/usr/lib/python3/dist-packages/", ".py")),
    ("python3-pytest", "python", _is("/usr/lib/python3/dist-packages/", ".py")),
    ("libabsl-dev", "c++", _is("/usr/include/absl/", ".h")),
    ("librocksdb-dev", "c++", _is("/usr/include/rocksdb/", ".h")),
    ("liburing-dev", "c", _is("/usr/include/", ".h")),
]
MAX_FILE_BYTES = 1 << 20  # generated tables (unicode data and the like) are not language


def _package_files(package: str) -> List[str]:
    out = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return sorted({p for p in out.stdout.splitlines()
                   if os.path.isfile(p) and not os.path.islink(p)})


def held_out(path: str) -> bool:
    return int(hashlib.sha256(path.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def text_of(path: str, raw: bytes) -> bytes:
    """A file's text: man pages are stored gzipped."""
    return gzip.decompress(raw) if path.endswith(".gz") else raw


def _entry(path: str, language: str) -> Dict:
    with open(path, "rb") as f:
        raw = f.read()
    text = text_of(path, raw)
    if b"\0" in text or not text or len(text) > MAX_FILE_BYTES:
        return {}
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return {}  # not text in an encoding the tokenizer's bytes would read as language
    return {"path": path, "bytes": len(text), "sha256": hashlib.sha256(raw).hexdigest(),
            "language": language, "split": "held_out" if held_out(path) else "train"}


KINDS = ("1", "2", "outside")  # corpus versions 1 and 2; text for the outside check


def build_manifest(path: str, kind: str = "2") -> dict:
    """kind "1" or "2": that version of the training corpus; "outside": code the corpus
    never read, for kvtrain.score's outside check (every file's split is "outside")."""
    if kind not in KINDS:
        raise ValueError(f"corpus kind {kind!r} is not one of {', '.join(KINDS)}")
    files = []
    if kind == "1":
        for p in sorted({q for pkg in PACKAGES_V1 for q in _package_files(pkg)
                         if q.startswith("/usr/include/")}):
            e = _entry(p, "c")
            if e:
                e.pop("language")
                files.append(e)
        head = {"packages": PACKAGES_V1}
    else:
        sources = SOURCES_OUTSIDE if kind == "outside" else SOURCES_V2
        seen = set()
        for package, language, wanted in sources:
            for p in _package_files(package):
                if wanted(p) and p not in seen:
                    seen.add(p)
                    e = _entry(p, language)
                    if e:
                        if kind == "outside":
                            e["split"] = "outside"
                        files.append(e)
        head = {"packages": sorted({s[0] for s in sources})}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    manifest = dict(head, held_out_every=HELD_OUT_EVERY, corpus_sha256=digest, files=files)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def read_checked(e: dict, manifest_path: str) -> bytes:
    try:
        with open(e["path"], "rb") as f:
            raw = f.read()
    except OSError as err:
        raise ValueError(f"corpus file {e['path']} cannot be read: {err}"
                         f" (scripts/install-deps.sh installs the corpus's packages)") from None
    if hashlib.sha256(raw).hexdigest() != e["sha256"]:
        raise ValueError(f"corpus file {e['path']} changed since the manifest "
                         f"({manifest_path}) was written")
    return text_of(e["path"], raw)


def load(manifest_path: str, split: str) -> Tuple[bytes, dict]:
    """The split's files concatenated (each followed by a blank line) and the manifest.
    Refuses a file that is missing or whose bytes changed: the corpus would not be the one
    the manifest names."""
    with open(manifest_path) as f:
        manifest = json.load(f)
    parts = [read_checked(e, manifest_path) + b"\n\n"
             for e in manifest["files"] if e["split"] == split]
    return b"".join(parts), manifest


def held_out_documents(manifest_path: str, split: str = "held_out") -> Dict[str, bytes]:
    with open(manifest_path) as f:
        manifest = json.load(f)
    return {e["path"]: read_checked(e, manifest_path)
            for e in manifest["files"] if e["split"] == split}


def main() -> int:
    ap = argparse.ArgumentParser(description="write a corpus manifest from this machine's "
                                 "Debian packages")
    ap.add_argument("out")
    ap.add_argument("--version", default="2", choices=KINDS,
                    help="1, 2: a training corpus; outside: code the corpus never read "
                    "(kvtrain.score's outside check)")
    args = ap.parse_args()
    m = build_manifest(args.out, args.version)
    by: Dict[Tuple[str, str], int] = {}
    for e in m["files"]:
        k = (e.get("language", "c"), e["split"])
        by[k] = by.get(k, 0) + e["bytes"]
    for (lang, split), n in sorted(by.items()):
        print(f"{lang:8s} {split:9s} {n / 1e6:8.2f} MB")
    print(f"{len(m['files'])} files, corpus {m['corpus_sha256'][:12]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
