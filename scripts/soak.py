#!/usr/bin/env python3
"""Soak test (issue 49): the real gateway with the shipped plugin chain and catalog, a funded
workspace, the mock replica, and mixed traffic with unique content on every route at a fixed
rate; then a burst of concurrent streams. Reports the gateway's RSS and open descriptors over
time, their slope after the warm-up, the answers by status, the ledger check, and RSS a minute
after the burst against the baseline before it.

    scripts/soak.py [--minutes 30] [--rate 200] [--burst 2048] [--bin-dir target/dist]
                    [--stores embedded|shared]

`--stores shared` runs the production store set: PostgreSQL for keys and the ledger (a fresh
database on DATABASE_URL's server) and Redis for limits, idempotency records and placements
(REDIS_URL, a prefix of its own). On the embedded set the node itself keeps what requests
leave behind by design: idempotency records for 24 hours (up to 256 MiB) and session
placements for their idle TTL (up to 100,000); with unique keys and sessions at this rate
they grow for the whole soak, which the RSS slope then shows.

Passes (exit 0) when: growth after the first two minutes is under 1 MB per 10 minutes, no
answer was a 5xx, the ledger is consistent with no hold left, and RSS one minute after the
burst is within 20% of the baseline. Standard library only; Linux (/proc).
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "soak-admin-token-0123456789abcdef"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def memory_parts(pid: int) -> str:
    """Threads, and RSS split into anonymous memory (heaps, stacks) and mapped files."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.split()[0] if value.split() else ""
    return (f"threads={fields.get('Threads')} anon={int(fields.get('RssAnon', 0)) / 1024:.1f}MB "
            f"file={int(fields.get('RssFile', 0)) / 1024:.1f}MB")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_10min(samples):
    """Least-squares slope of (seconds, value) samples, per 10 minutes."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    den = sum((t - mx) ** 2 for t, _ in samples) or 1.0
    return sum((t - mx) * (v - my) for t, v in samples) / den * 600


def shared_stores(yaml: str, work: Path) -> tuple[str, dict]:
    """Point `yaml` at PostgreSQL (a fresh database) and Redis; the environment it needs."""
    server = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    db = f"tollgate_soak_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", server, "-qc", f"CREATE DATABASE {db}"], check=True, capture_output=True)
    env = {"DATABASE_URL": server.rsplit("/", 1)[0] + "/" + db,
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")}
    yaml = yaml.replace("store: { backend: in_process }",
                        f"store: {{ backend: redis, url_env: REDIS_URL, prefix: soak{work.name[-8:]}, timeout_ms: 250 }}")
    yaml = yaml.replace(f"store: {{ backend: sqlite, path: {work}/tollgate.db }}",
                        "store: { backend: postgres, url_env: DATABASE_URL }")
    return yaml, env


def start(bin_dir: Path, work: Path, stores: str = "embedded"):
    mock = subprocess.Popen(
        [str(bin_dir / "tollgate-mock-replica"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    mock_addr = mock.stdout.readline().strip().rsplit(" ", 1)[-1]
    conf = work / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (work / "secrets").mkdir()
    subprocess.run([str(bin_dir / "tollgate"), "init-secrets", "--dir", str(work / "secrets")], check=True,
                   capture_output=True)
    (work / "secrets" / "admin_token").write_text(ADMIN_TOKEN)
    yaml = (conf / "tollgate.yaml").read_text()
    # Port 0: the gateway picks its ports and prints them (decision 222).
    yaml = yaml.replace("listen: 0.0.0.0:8080", "listen: 127.0.0.1:0")
    yaml = yaml.replace("admin_listen: 127.0.0.1:8081", "admin_listen: 127.0.0.1:0")
    yaml = yaml.replace("../data/secrets/", f"{work}/secrets/").replace("../data/tollgate.db", f"{work}/tollgate.db")
    # Room for the burst: the workspace's concurrency and the replica's.
    yaml = yaml.replace("workspace_concurrency: { free: 32, core: 256, enterprise: 1024 }",
                        "workspace_concurrency: { free: 8192, core: 8192, enterprise: 8192 }")
    env = {}
    if stores == "shared":
        yaml, env = shared_stores(yaml, work)
    (conf / "tollgate.yaml").write_text(yaml)
    up = (conf / "upstreams.yaml").read_text().replace("127.0.0.1:18000", mock_addr)
    up = up.replace("max_concurrency: 64", "max_concurrency: 8192")
    (conf / "upstreams.yaml").write_text(up)
    models = (conf / "models.yaml").read_text().replace("max_concurrent_requests_per_api_key: 32",
                                                       "max_concurrent_requests_per_api_key: 8192")
    (conf / "models.yaml").write_text(models)
    log = open(work / "gateway.log", "w")
    gw = subprocess.Popen([str(bin_dir / "tollgate"), "serve", "--config", str(conf / "tollgate.yaml")],
                          stdout=subprocess.PIPE, stderr=log, text=True,
                          env={**os.environ, **env, "RUST_LOG": "warn"})
    # `tollgate: listen 127.0.0.1:P admin_listen 127.0.0.1:Q`; empty if it exited first.
    words = gw.stdout.readline().split()
    if len(words) != 5 or words[1] != "listen":
        sys.exit(f"the gateway did not start; see {work / 'gateway.log'}")
    port, admin = int(words[2].rsplit(":", 1)[1]), int(words[4].rsplit(":", 1)[1])
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            admin_call(admin, "GET", "/admin/v1/health")
            break
        except Exception:
            time.sleep(0.2)
    ws = admin_call(admin, "POST", "/admin/v1/workspaces", {"name": "soak", "rate_tier": "enterprise"})["id"]
    admin_call(admin, "POST", f"/admin/v1/workspaces/{ws}/credits", {"amount_cents": 100_000_000, "source": "purchase"})
    key = admin_call(admin, "POST", f"/admin/v1/workspaces/{ws}/keys", {})["key"]
    return mock, gw, port, admin, ws, key


def admin_call(admin: int, method: str, path: str, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{admin}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def request(kind: str, key: str) -> bytes:
    """One request of `kind` with unique content."""
    u = uuid.uuid4().hex
    model = "llama-3.1-8b-instruct"
    auth = f"Authorization: Bearer {key}\r\n"
    if kind == "models":
        return f"GET /v1/models HTTP/1.1\r\nHost: s\r\n{auth}\r\n".encode()
    if kind == "credits":
        return f"GET /v1/credits HTTP/1.1\r\nHost: s\r\n{auth}\r\n".encode()
    if kind == "bad_key":
        return f"GET /v1/models HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer rp_{u}{u[:8]}\r\n\r\n".encode()
    if kind in ("chat", "chat_stream"):
        path, body = "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": f"soak {u}"}],
                                              "stream": kind == "chat_stream", "max_tokens": 16}
    elif kind == "messages":
        path, body = "/v1/messages", {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": f"soak {u}"}]}
    elif kind == "count_tokens":
        path, body = "/v1/messages/count_tokens", {"model": model, "messages": [{"role": "user", "content": f"soak {u}"}]}
    else:  # responses
        path, body = "/v1/responses", {"model": model, "input": f"soak {u}", "max_output_tokens": 16}
    data = json.dumps(body).encode()
    idem = f"Idempotency-Key: {u}\r\n" if kind == "chat" else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}{idem}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


KINDS = ["chat", "chat", "chat_stream", "chat_stream", "messages", "responses", "count_tokens", "models", "credits",
         "bad_key"]


async def read_response(reader, bodies: list | None = None) -> int:
    """Read one HTTP/1.1 response; its status. A non-2xx answer's body goes to `bodies`."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split()[1])
    length, chunked = None, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    body = b""
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            body += (await reader.readexactly(size + 2))[:size]
            if size == 0:
                break
    elif length:
        body = await reader.readexactly(length)
    if bodies is not None and not 200 <= status < 300:
        bodies.append(body)
    return status


def error_code(body: bytes) -> str:
    """The catalogued `code` of an error envelope (chat or messages), else `?`."""
    try:
        error = json.loads(body)["error"]
        return error.get("code") or error.get("type") or "?"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "?"


async def worker(port: int, key: str, queue: asyncio.Queue, statuses: dict):
    reader = writer = None
    while True:
        kind = await queue.get()
        if kind is None:
            break
        for _ in range(2):
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request(kind, key))
                status = await asyncio.wait_for(read_response(reader), 60)
                statuses[status] = statuses.get(status, 0) + 1
                if kind == "bad_key":  # refused before the body: the gateway closes
                    writer.close()
                    writer = None
                break
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
                if writer is not None:
                    writer.close()
                writer = None
    if writer is not None:
        writer.close()


async def soak(port: int, key: str, pid: int, minutes: float, rate: int):
    queue: asyncio.Queue = asyncio.Queue(maxsize=rate * 2)
    statuses: dict = {}
    workers = [asyncio.create_task(worker(port, key, queue, statuses)) for _ in range(64)]
    samples = []
    start = time.monotonic()
    next_sample = start
    sent = 0
    while (now := time.monotonic()) - start < minutes * 60:
        due = int((now - start) * rate)
        while sent < due:
            await queue.put(random.choice(KINDS))
            sent += 1
        if now >= next_sample:
            samples.append((now - start, rss_kb(pid), fds(pid)))
            print(f"soak: t={now - start:6.0f}s rss={samples[-1][1] / 1024:7.1f}MB fds={samples[-1][2]} "
                  f"{memory_parts(pid)} sent={sent} statuses={dict(sorted(statuses.items()))}", flush=True)
            next_sample += 10
        await asyncio.sleep(0.01)
    for _ in workers:
        await queue.put(None)
    await asyncio.gather(*workers)
    return samples, statuses, sent


async def burst(port: int, key: str, n: int) -> dict:
    statuses: dict = {}

    async def one(i: int):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"model": "llama-3.1-8b-instruct", "stream": True, "max_tokens": 64,
                               "messages": [{"role": "user", "content": f"burst {i} {uuid.uuid4().hex}"}]}).encode()
            writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {key}\r\n"
                          f"x-mock-token-delay-ms: 20\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                          f"Connection: close\r\n\r\n").encode() + body)
            bodies: list = []
            status = await asyncio.wait_for(read_response(reader, bodies), 120)
            if bodies:
                status = f"{status} {error_code(bodies[0])}"
            writer.close()
        except Exception as e:  # noqa: BLE001 - counted, not raised
            status = type(e).__name__
        statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return statuses


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--burst", type=int, default=2048)
    ap.add_argument("--bin-dir", default=str(ROOT / "target" / "dist"))
    ap.add_argument("--stores", choices=["embedded", "shared"], default="embedded")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tollgate-soak-"))
    mock, gw, port, admin, ws, key = start(Path(args.bin_dir), work, args.stores)
    ok = True
    try:
        samples, statuses, sent = asyncio.run(soak(port, key, gw.pid, args.minutes, args.rate))
        settled = [(t, r, f) for t, r, f in samples if t >= 120] or samples
        rss_slope = slope_per_10min([(t, r / 1024) for t, r, _ in settled])
        fd_slope = slope_per_10min([(t, f) for t, _, f in settled])
        five_xx = sum(v for k, v in statuses.items() if 500 <= k < 600)
        time.sleep(3)
        ledger = admin_call(admin, "GET", f"/admin/v1/workspaces/{ws}/ledger")
        consistent = ledger["check"]["consistent"] and ledger["held_cents"] == 0
        print(f"soak: stores={args.stores} minutes={args.minutes} rate={args.rate}/s sent={sent} statuses={dict(sorted(statuses.items()))}")
        print(f"soak: rss after the first two minutes: {settled[0][1] / 1024:.1f} -> {settled[-1][1] / 1024:.1f} MB, "
              f"slope {rss_slope:+.2f} MB per 10 min; fds slope {fd_slope:+.1f} per 10 min; 5xx={five_xx}; "
              f"ledger consistent={consistent}")
        ok &= rss_slope < 1.0 and five_xx == 0 and consistent
        time.sleep(10)
        baseline = rss_kb(gw.pid)
        b = asyncio.run(burst(port, key, args.burst))
        peak = rss_kb(gw.pid)
        time.sleep(60)
        after = rss_kb(gw.pid)
        within = after <= baseline * 1.2
        print(f"burst: {args.burst} streams {dict(sorted(b.items(), key=str))}; rss baseline {baseline / 1024:.1f} MB, "
              f"after the burst {peak / 1024:.1f} MB, a minute later {after / 1024:.1f} MB "
              f"({(after / baseline - 1) * 100:+.0f}%, within 20%: {within})")
        ok &= within
    finally:
        gw.kill()  # SIGTERM would wait the shutdown grace (minutes)
        mock.kill()
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
