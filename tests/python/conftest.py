"""Starts the mock replica and the gateway (the real binaries) for the client tests."""
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOLLGATE = ROOT / os.environ.get("TOLLGATE_BIN", "target/debug/tollgate")
MOCK = ROOT / os.environ.get("MOCK_BIN", "target/debug/tollgate-mock-replica")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never listened")


@pytest.fixture(scope="session")
def gateway():
    mock = subprocess.Popen([str(MOCK), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    line = mock.stdout.readline().strip()
    mock_port = int(line.rsplit(":", 1)[1])
    port = free_port()
    conf = Path(tempfile.mkdtemp(prefix="tollgate-pytest-"))
    (conf / "tollgate.yaml").write_text(
        f"listen: 127.0.0.1:{port}\nthreads: 1\nshutdown:\n  grace_period_seconds: 1\n"
        "plugins:\n  - name: chat_completions\n"
    )
    (conf / "models.yaml").write_text((ROOT / "conf/models.yaml").read_text())
    (conf / "upstreams.yaml").write_text(
        (ROOT / "conf/upstreams.yaml").read_text().replace("127.0.0.1:18000", f"127.0.0.1:{mock_port}")
    )
    log = open(conf / "gateway.log", "w")
    gw = subprocess.Popen([str(TOLLGATE), "serve", "--config", str(conf / "tollgate.yaml")], stderr=log)
    try:
        wait_listening(port, gw)
        yield f"http://127.0.0.1:{port}"
    finally:
        gw.kill()
        mock.kill()
        gw.wait()
        mock.wait()
