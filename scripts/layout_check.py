#!/usr/bin/python3
"""Checks that every #include obeys the README's Layout table: a folder includes only
itself, the folders it may depend on, and outside libraries (<…> and the generated
headers named below). One line per violation, exit 1 if any.

    scripts/layout_check.py [REPO_ROOT]
"""
import os
import re
import subprocess
import sys

# Generated headers, by the folder that generates them.
GENERATED = {"kvcache/": "proto/", "etcd/": "cluster/"}
# Outside libraries included with quotes.
EXTERNAL = ("absl/", "nlohmann/", "gtest/", "gmock/", "google/", "CLI/", "prometheus/",
            "rocksdb/", "liburing", "xxhash", "cuda", "hiredis")

# Folder (longest prefix wins) → the project folders it may include besides itself. The
# README's Layout table in code; change both together.
MAY_INCLUDE = {
    "base/": [],
    "wire/": ["base/"],
    "engine/spec/": ["base/"],
    "engine/": ["base/"],
    "kernels/": ["base/", "engine/", "storage/device_arena.h"],
    "backends/": ["base/", "engine/", "kernels/"],
    "storage/": ["base/", "engine/spec/"],
    "cluster/": ["base/"],
    "client/": ["base/", "wire/", "cluster/", "engine/spec/", "proto/"],
    # The daemon derives keys by the clients' public algorithm.
    "cachesvc/": ["base/", "wire/", "storage/", "cluster/", "engine/spec/", "proto/",
                  "client/prefix_hash.h"],
    "serve/": ["base/", "engine/", "client/", "cluster/", "backends/"],
    # The mains: each builds its parts from the libraries below it, and nothing includes a
    # program.
    "programs/": ["base/", "wire/", "engine/", "kernels/hbm_arena.h", "backends/", "storage/",
                  "cluster/", "client/", "cachesvc/", "serve/", "proto/"],
}
UNCHECKED = ("bench/", "tests/", "train/", "python/", "proto/", "scripts/")


def rule_for(path):
    best = None
    for prefix in MAY_INCLUDE:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def own_folder(prefix):
    return prefix if prefix.endswith("/") else prefix.rsplit("/", 1)[0] + "/"


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    r = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, text=True)
    if r.returncode == 0:
        files = r.stdout.split()
    else:  # not a git checkout: every file under the root but the build trees
        files = [os.path.relpath(os.path.join(d, f), root)
                 for d, dirs, fs in os.walk(root) for f in fs
                 if not os.path.relpath(d, root).startswith(("build", ".git"))]
    bad = []
    for path in files:
        if not re.search(r"\.(cc|h|cu|cuh|in)$", path) or path.startswith(UNCHECKED):
            continue
        rule = rule_for(path)
        if rule is None:
            bad.append(f"{path}: its folder is not in the Layout table (scripts/layout_check.py)")
            continue
        allowed = MAY_INCLUDE[rule] + [own_folder(rule)]
        with open(os.path.join(root, path), errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                if inc.startswith(EXTERNAL) or "/" not in inc:
                    continue
                for gen, folder in GENERATED.items():
                    if inc.startswith(gen):
                        inc = folder + inc
                if not any(inc.startswith(a) for a in allowed):
                    bad.append(f"{path}:{n}: includes \"{m.group(1)}\"; {rule} may include "
                               f"only {', '.join(allowed)}")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
