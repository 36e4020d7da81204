"""`pip install ./python` works offline and gives a package that runs outside the tree."""
import os
import subprocess
import sys

from conftest import run

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_installs_the_package_offline_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    # Debian's grpcio, protobuf, numpy and xxhash come from the system site packages.
    r = run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    assert r.returncode == 0, r.stderr
    r = run([str(venv / "bin" / "pip"), "install", "--no-index", "--no-cache-dir", PACKAGE_DIR])
    assert r.returncode == 0, r.stdout + r.stderr
    # The engine adapters come along, and vLLM finds the tier's plugin by its entry point.
    code = ("import kvcache, kvcache.v1.kvcache_pb2 as pb; print(kvcache.__file__); "
            "print(kvcache.chunk_keys(bytes(16), list(range(8)), 4)[1].hex()); "
            "import kvcache.integrations.sglang, kvcache.integrations.vllm; "
            "from importlib.metadata import entry_points; "
            "print([e.value for e in entry_points(group='vllm.general_plugins')])")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       cwd=str(tmp_path), env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0, r.stderr
    installed, key, plugins = r.stdout.split("\n")[:3]
    assert plugins == "['kvcache.integrations.vllm:register']"
    assert installed.startswith(str(venv))
    sys.path.insert(0, PACKAGE_DIR)
    import kvcache
    assert key == kvcache.chunk_keys(bytes(16), list(range(8)), 4)[1].hex()
