"""Starts the mock replica and the gateway (the real binaries) for the client tests."""
import json
import os
import socket
import urllib.request
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


ADMIN_TOKEN = "pytest-admin-token-0123456789"


def admin_post(base: str, path: str, body: dict, method: str = "POST") -> dict:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


ADMIN: dict = {}


def admin_get(path: str) -> dict:
    req = urllib.request.Request(ADMIN["url"] + path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture()
def fresh_workspace(gateway):
    """A new workspace (its $1 grant) and a key of it: (base url, key, workspace id)."""
    base, _ = gateway
    ws = admin_post(ADMIN["url"], "/admin/v1/workspaces", {"name": "pytest-fresh"})
    key = admin_post(ADMIN["url"], f"/admin/v1/workspaces/{ws['id']}/keys", {})
    return base, key["key"], ws["id"]


@pytest.fixture(scope="session")
def plan_gateway(gateway):
    """The same gateway, with a key of a workspace on an active `pro` coding plan."""
    base, _ = gateway
    admin = ADMIN["url"]
    ws = admin_post(admin, "/admin/v1/workspaces", {"name": "pytest-plan"})
    admin_post(admin, f"/admin/v1/workspaces/{ws['id']}/plan", {"tier": "pro", "status": "active"}, method="PUT")
    key = admin_post(admin, f"/admin/v1/workspaces/{ws['id']}/keys", {})
    return base, key["key"]


@pytest.fixture(scope="session")
def gateway():
    mock = subprocess.Popen([str(MOCK), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    line = mock.stdout.readline().strip()
    mock_port = int(line.rsplit(":", 1)[1])
    port, admin_port = free_port(), free_port()
    conf = Path(tempfile.mkdtemp(prefix="tollgate-pytest-"))
    (conf / "pepper").write_text("p" * 48)
    (conf / "enc").write_text("ab" * 32)
    (conf / "admin_token").write_text(ADMIN_TOKEN)
    (conf / "tollgate.yaml").write_text(
        f"listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin_port}\nthreads: 1\n"
        "shutdown:\n  grace_period_seconds: 1\n"
        # The listener also takes cleartext HTTP/2 (test_http2_clients.py).
        "client:\n  h2c: true\n"
        # Short, so the messages heartbeat (15 s in production) shows within a test.
        "budgets:\n  heartbeat_seconds: 0.3\n"
        "identity:\n  store: { backend: sqlite, path: identity.db }\n"
        "  key_pepper: { file: pepper }\n  key_encryption_key: { file: enc }\n"
        "admin:\n  token_file: admin_token\n"
        "plugins:\n  - name: auth\n  - name: dialects\n  - name: idempotency\n  - name: chat_completions\n  - name: billing\n"
    )
    (conf / "models.yaml").write_text((ROOT / "conf/models.yaml").read_text())
    (conf / "upstreams.yaml").write_text(
        (ROOT / "conf/upstreams.yaml").read_text().replace("127.0.0.1:18000", f"127.0.0.1:{mock_port}")
    )
    log = open(conf / "gateway.log", "w")
    gw = subprocess.Popen([str(TOLLGATE), "serve", "--config", str(conf / "tollgate.yaml")], stderr=log)
    try:
        wait_listening(port, gw)
        wait_listening(admin_port, gw)
        admin = f"http://127.0.0.1:{admin_port}"
        ws = admin_post(admin, "/admin/v1/workspaces", {"name": "pytest"})
        key = admin_post(admin, f"/admin/v1/workspaces/{ws['id']}/keys", {})
        ADMIN["url"] = admin
        yield f"http://127.0.0.1:{port}", key["key"]
    finally:
        gw.kill()
        mock.kill()
        gw.wait()
        mock.wait()
