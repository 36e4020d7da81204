"""A PEP 517 build backend for the kvcache package that needs no download.

Builds a pure-Python wheel of python/kvcache with the gRPC stubs generated from the
repository's proto/ (protoc --python_out plus grpc_python_plugin, Debian's
protobuf-compiler and protobuf-compiler-grpc). Also runnable as a script to generate the
stubs in place, which is what the CMake build does so that PYTHONPATH=python works:

    python3 python/build_backend/kvcache_build.py generate
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)  # python/
PROTO_ROOT = os.path.join(os.path.dirname(PACKAGE_ROOT), "proto")
PROTO = "kvcache/v1/kvcache.proto"
NAME, VERSION = "kvcache", "0.1.0"
REQUIRES = ["grpcio", "protobuf", "xxhash", "numpy"]


def generate(out_root):
    """Writes kvcache/v1/kvcache_pb2.py, its type stub kvcache_pb2.pyi and
    kvcache_pb2_grpc.py under out_root."""
    proto_root = PROTO_ROOT
    if not os.path.exists(os.path.join(proto_root, PROTO)):
        # An sdist or a copied folder: the proto travels beside the package.
        proto_root = os.path.join(PACKAGE_ROOT, "proto")
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if protoc is None or plugin is None:
        sys.exit("kvcache build: protoc and grpc_python_plugin are needed "
                 "(Debian: protobuf-compiler protobuf-compiler-grpc)")
    subprocess.run([protoc, "-I", proto_root, f"--python_out={out_root}", f"--pyi_out={out_root}",
                    f"--grpc_out={out_root}", f"--plugin=protoc-gen-grpc={plugin}",
                    os.path.join(proto_root, PROTO)], check=True)


def _files():
    for folder, _, names in os.walk(os.path.join(PACKAGE_ROOT, NAME)):
        if "__pycache__" in folder:
            continue
        for name in sorted(names):
            # py.typed: the package's type hints are for its users' type checkers (PEP 561).
            if (name.endswith(".py") or name == "py.typed") and not name.endswith("_pb2.py") \
                    and not name.endswith("_pb2_grpc.py"):
                full = os.path.join(folder, name)
                yield full, os.path.relpath(full, PACKAGE_ROOT)


def _metadata():
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {VERSION}",
             "Summary: Client for kvcached, the tiered KV-cache service",
             "Requires-Python: >=3.9"]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    return "\n".join(lines) + "\n"


# vLLM loads general plugins from this entry point in each of its processes: ours registers
# the kvcache secondary tier (kvcache/integrations/vllm.py, docs/integrations.md).
ENTRY_POINTS = "[vllm.general_plugins]\nkvcache = kvcache.integrations.vllm:register\n"


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, f"{NAME}-{VERSION}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata())
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(ENTRY_POINTS)
    return os.path.basename(info)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_name = f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    record = []
    with tempfile.TemporaryDirectory() as gen, \
            zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                            zipfile.ZIP_DEFLATED) as whl:
        generate(gen)
        entries = list(_files())
        for folder, _, names in os.walk(gen):
            for name in names:
                full = os.path.join(folder, name)
                entries.append((full, os.path.relpath(full, gen)))
        for full, arcname in entries:
            with open(full, "rb") as f:
                data = f.read()
            whl.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        extra = {
            f"{info}/METADATA": _metadata().encode(),
            f"{info}/entry_points.txt": ENTRY_POINTS.encode(),
            f"{info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: kvcache_build\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        }
        for arcname, data in extra.items():
            whl.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        record.append(f"{info}/RECORD,,")
        whl.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/kvcache_build.py"]:
            tar.add(os.path.join(PACKAGE_ROOT, rel), f"{base}/{rel}")
        for full, arcname in _files():
            tar.add(full, f"{base}/{arcname}")
        tar.add(os.path.join(PROTO_ROOT, PROTO), f"{base}/proto/{PROTO}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        import io
        tar.addfile(info, io.BytesIO(data))
    return name


if __name__ == "__main__":
    if sys.argv[1:] != ["generate"]:
        sys.exit("usage: kvcache_build.py generate")
    generate(PACKAGE_ROOT)
