"""The processes under test: the mock replica, nginx, the Pingora floor and the gateways with
their generated configs; starting them, waiting for their ports, and the one cleanup that
stops them all (on exit, on an error and on SIGINT/SIGTERM)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from settings import die, has_billing, is_full, log, prefix, store_of, uses_redis


def listening(port):
    """A socket listens on PORT (from /proc/net/tcp*: state 0A is LISTEN)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


def config_sections(s, function, *args):
    """A section from scripts/bench/config_yaml.sh, shared with profile.sh and ledger_load.sh."""
    script = 'source "$0"; "$@"'
    return subprocess.run(["bash", "-c", script, os.path.join(s.helpers, "config_yaml.sh"), function, *args],
                          check=True, capture_output=True, text=True).stdout


class Stack:
    def __init__(self, s, out):
        self.s, self.out = s, out
        self.work = tempfile.mkdtemp(prefix="tollgate-bench.")
        os.chmod(self.work, 0o755)  # nginx workers run as an unprivileged user
        self.procs = {}  # name -> Popen, in start order
        self.redis_prefix = self.pg_db = self.pg_url = ""
        self.keys, self.workspaces = {}, {}  # per store (sqlite, pg)

    # ---- processes ------------------------------------------------------------------------
    def start(self, name, cpu, cmd, env=None):
        with open(os.path.join(self.work, f"{name}.log"), "w") as logf:
            self.procs[name] = subprocess.Popen(prefix(self.s, cpu) + cmd, stdout=logf, stderr=subprocess.STDOUT,
                                                env={**os.environ, **(env or {})})
        return self.procs[name].pid

    def pid(self, name):
        return self.procs[name].pid

    def log_tail(self, name):
        try:
            with open(os.path.join(self.work, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-30:])
        except OSError:
            return ""

    def wait_listening(self, name, port):
        """Up to 20 s for PORT, failing early if the process died."""
        for _ in range(200):
            if self.procs[name].poll() is not None:
                log(f"{name} exited; its log:\n{self.log_tail(name)}")
                die(f"{name} died while starting")
            if listening(port):
                return
            time.sleep(0.1)
        log(self.log_tail(name))
        die(f"{name} did not listen on 127.0.0.1:{port} within 20 s")

    def check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                log(self.log_tail(name))
                die(f"{name} (pid {p.pid}) died during the bench")

    def stop(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5  # then SIGKILL (the Pingora floor drains longer on SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        s = self.s
        if self.redis_prefix:  # the run's limiter keys (they would expire soon anyway)
            keys = subprocess.run(["redis-cli", "-u", s.redis_url, "--scan", "--pattern", f"{{{self.redis_prefix}}}:*"],
                                  capture_output=True, text=True).stdout.split()
            for i in range(0, len(keys), 500):
                subprocess.run(["redis-cli", "-u", s.redis_url, "UNLINK", *keys[i:i + 500]], capture_output=True)
        for f in glob.glob(os.path.join(self.work, "*.log")) + glob.glob(os.path.join(self.work, "nginx", "error.log")):
            shutil.copy(f, self.out)
        if self.pg_db and not s.keep_db:
            drop = subprocess.run(["psql", s.database_url, "-qtAX", "-c",
                                   f"DROP DATABASE IF EXISTS {self.pg_db} WITH (FORCE)"], capture_output=True)
            if drop.returncode:
                log(f"could not drop the database {self.pg_db}")
        shutil.rmtree(self.work, ignore_errors=True)

    # ---- the ladder -------------------------------------------------------------------------
    def write(self, path, text, copy_as=None):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        if copy_as:
            shutil.copy(path, os.path.join(self.out, copy_as))

    def gateway_head(self, t, gw_dir):
        """A gateway config's common part: ports, one thread, the model and its pool files."""
        s = self.s
        for name, text in (("models.yaml", self.models), ("upstreams.yaml", self.upstreams)):
            self.write(os.path.join(gw_dir, name), text, name if t == "gateway" else None)
        return (f"listen: 127.0.0.1:{s.port[t]}\nadmin_listen: 127.0.0.1:{s.port[t] + 1}\nthreads: 1\n"
                "models_file: models.yaml\nupstreams_file: upstreams.yaml\nshutdown:\n"
                "  grace_period_seconds: 1\n  graceful_shutdown_timeout_seconds: 1\n")

    def start_ladder(self):
        s, w = self.s, self.work
        log(f"mock replica on 127.0.0.1:{s.port['direct']} (1 thread, core {s.backend_cpu})")
        self.start("mock", s.backend_cpu, [s.mock_bin, "--listen", f"127.0.0.1:{s.port['direct']}", "--threads", "1"])
        self.wait_listening("mock", s.port["direct"])

        self.models = config_sections(s, "bench_models_yaml")
        self.upstreams = config_sections(s, "bench_upstreams_yaml", str(s.port["direct"]), "4096")
        gw = os.path.join(w, "gw")
        self.write(os.path.join(gw, "tollgate.yaml"),
                   self.gateway_head("gateway", gw) + "plugins:\n  - name: chat_completions\n", "tollgate.yaml")
        log(f"gateway on 127.0.0.1:{s.port['gateway']} (threads: 1, core {s.proxy_cpu})")
        self.start("gateway", s.proxy_cpu, [s.gw_bin, "serve", "--config", os.path.join(gw, "tollgate.yaml")],
                   {"RUST_LOG": "warn", "TMPDIR": gw})
        self.wait_listening("gateway", s.port["gateway"])

        ng = os.path.join(w, "nginx")
        with open(os.path.join(s.helpers, "nginx.conf.template")) as f:
            conf = f.read()
        for key, value in (("@PREFIX@", ng), ("@LISTEN@", f"127.0.0.1:{s.port['nginx']}"),
                           ("@LISTEN_H2@", f"127.0.0.1:{s.port['nginx-h2']}"),
                           ("@UPSTREAM@", f"127.0.0.1:{s.port['direct']}")):
            conf = conf.replace(key, value)
        self.write(os.path.join(ng, "nginx.conf"), conf, "nginx.conf")
        log(f"nginx on 127.0.0.1:{s.port['nginx']} (1 worker, core {s.proxy_cpu})")
        self.start("nginx", s.proxy_cpu, [s.nginx_bin, "-p", ng, "-e", os.path.join(ng, "error.log"),
                                          "-c", os.path.join(ng, "nginx.conf"), "-g", "daemon off;"])
        self.wait_listening("nginx", s.port["nginx"])

        for t in s.floor_targets:
            log(f"{t} on 127.0.0.1:{s.port[t]} (bare Pingora, one thread, core {s.proxy_cpu})")
            mode = "pass" if t == "pingora" else "replay"
            self.start(t, s.proxy_cpu, [s.floor_bin, "--listen", f"127.0.0.1:{s.port[t]}", "--upstream",
                                        f"127.0.0.1:{s.port['direct']}", "--mode", mode], {"RUST_LOG": "warn"})
            self.wait_listening(t, s.port[t])

    # ---- the comparison gateways (BENCH_LIMITS, BENCH_BILLING, BENCH_FULL) -------------------
    def admin(self, t, path, body=None, method=None):
        """An admin API call through T; its JSON answer (dies on anything else)."""
        with open(os.path.join(self.identity, "secrets", "admin_token")) as f:
            token = f.read().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{self.s.port[t] + 1}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
        except OSError as e:
            die(f"admin API {path}: {e}")
        return text if path == "/metrics" else json_or_die(text)

    def gateway_config(self, t, gw_dir):
        s = self.s
        store = ("{ backend: postgres, url_env: DATABASE_URL }" if store_of(t) == "pg"
                 else f"{{ backend: sqlite, path: {self.identity}/tollgate.db }}")
        text = self.gateway_head(t, gw_dir) + config_sections(s, "identity_yaml", store, f"{self.identity}/secrets")
        limiter = (f"{{ backend: redis, url_env: REDIS_URL, prefix: {self.redis_prefix} }}" if uses_redis(t)
                   else "{ backend: in_process }")
        limits = config_sections(s, "open_limits_yaml", limiter)
        billing = "billing:\n  topup_url: https://billing.example.com/top-up\n"
        if t in ("gw-auth", "gw-auth-pg"):
            return text + "plugins:\n  - name: auth\n  - name: chat_completions\n"
        if t.startswith("gw-billing-"):
            return text + billing + "plugins:\n  - name: auth\n  - name: chat_completions\n  - name: billing\n"
        if t.startswith("gw-limits-"):
            return text + limits + ("plugins:\n  - name: connection_gate\n  - name: auth\n"
                                    "  - name: chat_completions\n  - name: limits\n")
        text += limits  # the full chain: conf/tollgate.yaml's plugins with both settings
        if s.plan:  # windows no run can fill, and room for every connection at once
            text += ("plans:\n  tiers:\n    team: { five_hour_cents: 100000000, week_cents: 100000000, "
                     "standby_day_cents: 0, plan_concurrency: 10000, standby_concurrency: 0 }\n")
        text += {"off": "metrics:\n  enabled: false\n", "on": "access_log:\n  format: json\n", "": ""}[s.observe]
        if s.tracing:
            text += (f"tracing:\n  otlp_endpoint: http://127.0.0.1:{s.port['direct']}/mock/otlp/v1/traces\n"
                     f"  sample_ratio: {s.tracing}\n")
        if s.h2:
            text += "client:\n  h2c: true\n"
        return text + billing + config_sections(s, "full_chain_plugins_yaml")

    def start_extra(self, stamp):
        s = self.s
        if not s.extra_targets:
            return
        self.identity = os.path.join(self.work, "identity")
        init = subprocess.run([s.gw_bin, "init-secrets", "--dir", os.path.join(self.identity, "secrets")],
                              capture_output=True, text=True)
        self.write(os.path.join(self.work, "init-secrets.log"), init.stdout + init.stderr)
        if init.returncode:
            die(f"tollgate init-secrets failed: {init.stdout}{init.stderr}")
        self.redis_prefix = f"tgbench-{stamp}-{os.getpid()}"
        if s.use_pg:
            db = f"tollgate_bench_{stamp.lower()}_{os.getpid()}"
            ans = subprocess.run(["psql", s.database_url, "-qtAX", "-c", f"CREATE DATABASE {db}"],
                                 capture_output=True, text=True)
            if ans.returncode:
                die(f"could not create the database {db}: {ans.stdout}{ans.stderr}")
            self.pg_db, self.pg_url = db, s.database_url.rsplit("/", 1)[0] + "/" + db
            log(f"PostgreSQL database {db} created (dropped at exit unless BENCH_KEEP_DB=1)")
        for t in s.extra_targets:
            gw_dir = os.path.join(self.work, t)
            self.write(os.path.join(gw_dir, "tollgate.yaml"), self.gateway_config(t, gw_dir), f"tollgate-{t}.yaml")
            log(f"{t} on 127.0.0.1:{s.port[t]} (threads: 1, core {s.proxy_cpu})")
            self.start(t, s.proxy_cpu, [s.gw_bin, "serve", "--config", os.path.join(gw_dir, "tollgate.yaml")],
                       {"RUST_LOG": "warn", "TMPDIR": gw_dir, "REDIS_URL": s.redis_url, "DATABASE_URL": self.pg_url})
            self.wait_listening(t, s.port[t])
            self.wait_listening(t, s.port[t] + 1)
            self.fund(t)

    def fund(self, t):
        store = store_of(t)
        if t in ("gw-auth", "gw-auth-pg"):  # the first gateway on each store migrated it
            ans = self.admin(t, "/admin/v1/workspaces", {"name": "bench"})
            ws = ans.get("id") or die(f"workspace not created: {ans}")
            ans = self.admin(t, f"/admin/v1/workspaces/{ws}/keys", {"name": "bench"})
            key = ans.get("key") or die(f"key not created: {ans}")
            self.workspaces[store], self.keys[store] = ws, key
            log(f"workspace {ws} and one API key created through {t}'s admin API")
        elif has_billing(t):
            # 100,000,000 cents (the most one purchase may be): a request holds 1 cent and
            # settles a few microcents, so no run comes near running out.
            ws = self.workspaces[store]
            ans = self.admin(t, f"/admin/v1/workspaces/{ws}/credits", {"amount_cents": 100000000, "source": "purchase"})
            if not isinstance(ans.get("balance_cents"), int) or ans["balance_cents"] < 100000000:
                die(f"top-up failed: {ans}")
            log(f"workspace {ws} topped up through {t}: {ans['balance_cents']} cents")
            if self.s.plan and is_full(t):
                ans = self.admin(t, f"/admin/v1/workspaces/{ws}/plan", {"tier": "team", "status": "active"}, "PUT")
                if ans.get("serving") is not True:
                    die(f"plan not set: {ans}")
                log(f"workspace {ws} holds a serving team plan (set through {t})")


def json_or_die(text):
    try:
        ans = json.loads(text)
    except ValueError:
        die(f"admin API: {text[:400]}")
    return ans if isinstance(ans, dict) else die(f"admin API: {text[:400]}")
