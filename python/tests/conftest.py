"""Fixtures: a real kvcached on loopback (the binary the build made), fresh seeds."""
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

SOURCE_DIR = os.environ.get("KVC_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
BIN_DIR = os.environ.get("KVC_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
MINI_CONFIG = os.path.join(SOURCE_DIR, "configs", "mini.json")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """kvcached in its own data folder; restart() keeps the folder and the port."""

    def __init__(self, data_dir, extra=()):
        self.data_dir = str(data_dir)
        self.port = free_port()
        self.extra = list(extra)
        self.proc = None
        self.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    @property
    def socket(self):
        return os.path.join(self.data_dir, "kvcached.sock")

    def start(self):
        args = [os.path.join(BIN_DIR, "kvcached"), "--data-dir", self.data_dir, "--listen",
                self.address, "--log-level", "warn"] + self.extra
        for flag, default in (("--ram-bytes", "8000000"), ("--ssd-bytes", "40000000")):
            if flag not in self.extra:
                args += [flag, default]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert "listening on" in line, f"kvcached printed {line!r}"
        # Keep draining its output so it never blocks on a full pipe.
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stdout,
                                       stdout=subprocess.DEVNULL)

    def stop(self, sig=signal.SIGTERM):
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
            self._drain.wait(timeout=30)
            self.proc = None

    def restart(self, sig=signal.SIGTERM):
        self.stop(sig)
        self.start()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "data")
    yield d
    d.stop()


@pytest.fixture
def make_daemon(tmp_path):
    made = []

    def make(extra=(), name="data"):
        d = Daemon(tmp_path / name, extra)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


@pytest.fixture
def seed(request):
    s = int(os.environ.get("KVC_TEST_SEED", random.SystemRandom().randrange(2**63)))
    print(f"[seed] {request.node.name}: KVC_TEST_SEED={s}", file=sys.stderr)
    return s


@pytest.fixture
def mini_config():
    with open(MINI_CONFIG) as f:
        return f.read()


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
