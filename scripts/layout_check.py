#!/usr/bin/python3
"""Checks that every #include obeys the README's Layout table: a folder includes only
itself, the folders it may depend on, and outside libraries (<…> and the generated
headers named below). Also that the programs' mains stay short: in programs/ and the
benchmarks' mains (bench/*/*_main.cc) no function body is longer than MAX_MAIN_FUNCTION_LINES
(flags → build the parts → run, each step its own function). One line per violation, exit 1
if any.

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
MAY_INCLUDE: dict[str, list[str]] = {
    "base/": [],
    "wire/": ["base/"],
    "engine/spec/": ["base/"],
    "engine/": ["base/"],
    # The HBM tier's CUDA arena implements storage's device-arena interface (storage stays
    # free of CUDA; kvcached hands the arena to the store).
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
    # kvcached builds the HBM tier's CUDA arena itself (kernels/hbm_arena.h): the one kernel
    # header a program needs; the engine's CUDA parts come through backends/.
    "programs/": ["base/", "wire/", "engine/", "kernels/hbm_arena.h", "backends/", "storage/",
                  "cluster/", "client/", "cachesvc/", "serve/", "proto/"],
}
UNCHECKED = ("bench/", "tests/", "train/", "python/", "proto/", "scripts/")

MAX_MAIN_FUNCTION_LINES = 80


def is_main_source(path: str) -> bool:
    return path.endswith(".cc") and (path.startswith("programs/") or
                                     re.match(r"bench/[^/]+/[^/]+_main\.cc$", path) is not None)


def strip_comments_and_literals(text: str) -> str:
    """The code with comments, strings and characters blanked (line breaks kept)."""
    def keep_lines(m: re.Match[str]) -> str:
        return "\n" * m.group(0).count("\n")

    text = re.sub(r'R"([^(\s]*)\((.*?)\)\1"', lambda m: '""' + keep_lines(m), text, flags=re.S)
    text = re.sub(r"/\*.*?\*/", keep_lines, text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def long_functions(text: str, limit: int) -> list[tuple[int, str, int]]:
    """(first line, name, lines) of every function body longer than `limit` lines: a brace
    block opened after a parameter list, directly inside namespaces or classes."""
    code = strip_comments_and_literals(text)
    stack: list[tuple[str, int, str]] = []  # kind (ns, cls, fn, blk), first line, name
    head, line = "", 1
    found: list[tuple[int, str, int]] = []
    for ch in code:
        if ch == "\n":
            line += 1
        if ch == "{":
            outer = all(kind in ("ns", "cls") for kind, _, _ in stack)
            last = head.split(";")[-1]
            names = re.findall(r"([\w:~]+)\s*\(", last)
            if re.search(r"\bnamespace\s*[\w:]*\s*$", head) or re.search(r'extern\s+"C"\s*$', head):
                kind = "ns"
            elif outer and re.search(r"\b(struct|class)\s+\w+[^;()]*$", last):
                kind = "cls"
            elif outer and ")" in last:
                kind = "fn"
            else:
                kind = "blk"
            stack.append((kind, line, names[0] if names else "?"))
            head = ""
        elif ch == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "fn" and line - first + 1 > limit:
                    found.append((first, name, line - first + 1))
            head = ""
        else:
            head = (head + ch)[-400:]
    return found


def rule_for(path: str) -> str | None:
    best = None
    for prefix in MAY_INCLUDE:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def own_folder(prefix: str) -> str:
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
        if is_main_source(path):
            with open(os.path.join(root, path), errors="replace") as f:
                for first, name, n in long_functions(f.read(), MAX_MAIN_FUNCTION_LINES):
                    bad.append(f"{path}:{first}: {name} is {n} lines; a program's functions "
                               f"stay under {MAX_MAIN_FUNCTION_LINES} (split it into steps)")
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
