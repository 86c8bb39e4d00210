"""The clients: the check request per target and shape, and the load runs (wrk with
wrk_post.lua, tollgate-bench-probe, h2load) reduced to wrk_post.lua's `BENCH ...` line."""
import http.client
import json
import os
import re
import subprocess

from settings import die

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write one short sentence about gateways."}]
BODIES = {"json": {"model": "llama-3.1-8b-instruct", "messages": MESSAGES, "max_tokens": 512},
          "sse": {"model": "llama-3.1-8b-instruct", "messages": MESSAGES, "max_tokens": 512,
                  "stream": True, "stream_options": {"include_usage": True}}}


def write_bodies(work):
    """The two request bodies, as files (the clients read them)."""
    paths = {}
    for shape, body in BODIES.items():
        paths[shape] = os.path.join(work, f"body-{shape}.json")
        with open(paths[shape], "w") as f:
            f.write(json.dumps(body, separators=(",", ":")))
    return paths


def post(port, body_path, headers):
    """One POST to /v1/chat/completions: (status, headers as curl -D writes them, body)."""
    with open(body_path, "rb") as f:
        body = f.read()
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        con.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", **headers})
        r = con.getresponse()
        head = f"HTTP/1.1 {r.status} {r.reason}\n" + "".join(f"{k}: {v}\n" for k, v in r.getheaders())
        return r.status, head, r.read().decode(errors="replace")
    except OSError as e:
        die(f"request to 127.0.0.1:{port} failed: {e}")
    finally:
        con.close()


def header(head, name):
    m = re.search(rf"^{name}: *(.*)$", head, re.I | re.M)
    return m.group(1).strip() if m else ""


def h2_check(t, port, body_path, key, out_path):
    """One streamed request over HTTP/2 with prior knowledge: a 200 over HTTP/2 ending in [DONE]."""
    auth = ["-H", f"authorization: Bearer {key}"] if key else []
    ans = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-o", out_path, "-w",
                          "%{http_code} %{http_version}", "--max-time", "10", "-H", "content-type: application/json",
                          *auth, "-H", "x-mock-tokens: 64",
                          "--data-binary", f"@{body_path}", f"http://127.0.0.1:{port}/v1/chat/completions"],
                         capture_output=True, text=True)
    body = open(out_path, errors="replace").read() if os.path.exists(out_path) else ""
    if ans.returncode or ans.stdout != "200 2" or not re.search(r"^data: \[DONE\]", body, re.M):
        die(f"{t} over HTTP/2: {ans.stdout or ans.stderr.strip()} {body[:300]}")


# ---- load runs ----------------------------------------------------------------------------
def load_command(s, case, port, conns, delay, key, body, tokens):
    """(argv without the duration, how the duration is passed, description) of CASE's client."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    if case.endswith("-h2"):  # HTTP/2 with prior knowledge: h2load, no percentiles
        auth = ["-H", f"authorization: Bearer {key}"] if key else []
        return (["h2load", f"-c{s.h2_conns}", f"-m{s.h2_streams}", "-d", body, "-H", "content-type: application/json",
                 "-H", f"x-mock-tokens: {tokens}", *auth, url, "-D"], "{}", f"h2load -c{s.h2_conns} -m{s.h2_streams}")
    # One connection and the paced run: the probe, whose latencies are not wrk's own.
    if (conns == 1 and delay == 0 and s.c1_client == "probe") or (delay > 0 and s.paced_client == "probe"):
        return [s.probe_bin, f"-c{conns}", url], "-d{}s", f"tollgate-bench-probe -c{conns}"
    return (["wrk", "-t1", f"-c{conns}", "--timeout", "10s", "-s", os.path.join(s.helpers, "wrk_post.lua"), url],
            "-d{}s", f"wrk -t1 -c{conns}")


def h2_summary(report, seconds):
    """wrk_post.lua's line from h2load's report: err_status counts the answers other than
    2xx/3xx, err_read the streams that errored."""
    done = errored = timeout = bad = 0
    for line in report.splitlines():
        f = line.split()
        if line.startswith("requests:"):
            done, errored, timeout = int(f[5]), int(f[11]), int(f[13])
        elif line.startswith("status codes:"):
            bad = int(f[6]) + int(f[8])
    return (f"BENCH requests={done} duration_us={seconds * 1000000} p50_us=- p99_us=- err_connect=0 "
            f"err_read={errored} err_write=0 err_status={bad} err_timeout={timeout}\n")


def run_load(argv, duration_arg, seconds, raw_path, env, h2):
    """Runs the client for SECONDS (raw output to RAW_PATH, unless None); its BENCH fields."""
    cmd = argv + [duration_arg.format(seconds)]
    if raw_path is None:
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return None
    with open(raw_path, "w") as out:
        rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    text = open(raw_path, errors="replace").read()
    if rc:
        die(f"{'h2load' if h2 else 'wrk'} failed: {''.join(text.splitlines(True)[-5:])}")
    if h2:
        summary = h2_summary(text, seconds)
        text += summary
        with open(raw_path, "a") as out:
            out.write(summary)
    line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
    return dict(kv.split("=", 1) for kv in line.split()[1:]) if line else None
