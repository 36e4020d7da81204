"""scripts/layout_check.py finds what it is there to find: an include against the Layout
table and a program function grown past the limit, on a scratch tree; and the checkout
passes it."""
import os
import pathlib
import subprocess
import sys

from conftest import SOURCE_DIR

SCRIPT = os.path.join(SOURCE_DIR, "scripts", "layout_check.py")


def run(root: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


def write(root: str, path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
        f.write(text)


def function(name: str, body_lines: int) -> str:
    body = "".join(f'  x += {i};  // "{{" in a comment\n' for i in range(body_lines))
    return f"int {name}(int x) {{\n{body}  return x;\n}}\n"


def test_the_checkout_passes() -> None:
    r = run(SOURCE_DIR)
    assert r.returncode == 0, r.stdout


def test_an_up_arrow_and_a_long_main_are_named(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path)
    write(root, "storage/a.cc", '#include "serve/session.h"\n')
    write(root, "programs/tool/main.cc",
          'namespace kvc::tool {\nnamespace {\n' + function("Short", 70) +
          'struct S {\n  void Method() {\n' + "    f();\n" * 90 + "  }\n};\n" +
          function("Long", 85) + "}  // namespace\n}  // namespace kvc::tool\n" +
          'const char* s = "}";\n')
    write(root, "bench/x/x_main.cc", function("Main", 100))
    write(root, "bench/x/helper.cc", function("NotAMain", 100))
    r = run(root)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(line.startswith("storage/a.cc:1: includes \"serve/session.h\"") for line in lines)
    assert any(line.startswith("programs/tool/main.cc:") and "Long is 88 lines" in line
               for line in lines), r.stdout
    assert any("Method is 92 lines" in line for line in lines), r.stdout
    assert any(line.startswith("bench/x/x_main.cc:1: Main is 103 lines") for line in lines)
    assert not any("Short" in line or "NotAMain" in line for line in lines), r.stdout
    assert len(lines) == 4, r.stdout
