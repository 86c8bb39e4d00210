"""The bench's settings: the environment (names and defaults as in docs/benchmarks.md), the
port of every target, which targets run, and the tools they need."""
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace


class BenchError(Exception):
    """Stops the bench: reported as `[bench] ERROR: ...`, exit 1, after the cleanup."""


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def die(msg):
    raise BenchError(msg)


def env(name, default=""):
    return os.environ.get(name) or default  # bash's ${NAME:-default}: empty counts as unset


def whole(name, default, minimum=0):
    value = env(name, default)
    if not re.fullmatch(r"\d+" if minimum is not None else r"-?\d+", value) or int(value) < (minimum or -1 << 63):
        die(f"{name} must be a whole number" + (f" >= {minimum}" if minimum else ""))
    return int(value)


def choice(name, default, allowed):
    value = env(name, default)
    if value not in allowed:
        die(f"{name} must be {' or '.join(', '.join(allowed).rsplit(', ', 1))}")
    return value


# Port of each target: BENCH_PORT_BASE plus this; a gateway's admin API listens one above.
PORT_OFFSET = {"direct": 0, "nginx": 1, "gateway": 2, "gw-auth": 4, "gw-limits-mem": 6,
               "gw-limits-redis": 8, "gw-auth-pg": 10, "gw-billing-sqlite": 12, "gw-billing-pg": 14,
               "gw-full": 16, "gw-full-pg": 18, "pingora": 20, "pingora-replay": 21, "nginx-h2": 22}
# The comparison sets and the extra gateways each starts: gw-auth first (it creates the SQLite
# workspace), gw-auth-pg before the other -pg ones (it creates the PostgreSQL one).
SETS = {"limits": ["gw-auth", "gw-limits-mem", "gw-limits-redis"],
        "billing": ["gw-auth", "gw-billing-sqlite", "gw-auth-pg", "gw-billing-pg"],
        "full": ["gw-auth", "gw-full", "gw-auth-pg", "gw-full-pg"]}


def prefix(s, cpu):
    """The command prefix that applies the nice level and pins to CPU."""
    return (["nice", "-n", str(s.nice)] if s.nice else []) + ([s.taskset, "-c", str(cpu)] if s.taskset else [])


def is_full(t): return t in ("gw-full", "gw-full-pg")
def has_billing(t): return t.startswith("gw-billing-") or is_full(t)
def has_limits(t): return t.startswith("gw-limits-") or is_full(t)
def uses_redis(t): return t in ("gw-limits-redis", "gw-full-pg")
def store_of(t): return "pg" if t.endswith("-pg") else "sqlite"


def load(quick, build, root):
    """Reads and checks the environment; returns the settings every module reads."""
    s = SimpleNamespace(root=root, helpers=os.path.join(root, "scripts", "bench"), build=build)
    s.duration = 3 if quick else whole("BENCH_SECONDS", "10", 1)
    s.warmup = whole("BENCH_WARMUP_SECONDS", "1")
    s.conns = whole("BENCH_CONNECTIONS", "32", 1)
    s.rate = whole("BENCH_RATE", "500", 1)
    s.paced_conns = whole("BENCH_PACED_CONNECTIONS", "5", 1)
    s.c1 = env("BENCH_C1", "1") == "1"
    s.rounds = whole("BENCH_ROUNDS", "1", 1)
    s.port_base = whole("BENCH_PORT_BASE", "19310", 1)
    s.proxy_cpu = whole("BENCH_PROXY_CPU", "0")
    s.backend_cpu = whole("BENCH_BACKEND_CPU", "1")
    s.target_dir = env("CARGO_TARGET_DIR", os.path.join(root, "target"))
    s.limits = choice("BENCH_LIMITS", "0", ["0", "1", "only"])
    s.billing = choice("BENCH_BILLING", "0", ["0", "1", "only"])
    s.full = choice("BENCH_FULL", "0", ["0", "1", "only"])
    s.redis_url = env("REDIS_URL", "redis://127.0.0.1:6379")
    s.database_url = env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    s.keep_db = env("BENCH_KEEP_DB", "0") == "1"
    s.plan = env("BENCH_PLAN", "0") == "1"
    s.observe = env("BENCH_OBSERVE")
    if s.observe not in ("", "on", "off"):
        die("BENCH_OBSERVE must be on or off")
    s.tracing = env("BENCH_TRACING")
    if s.tracing and not (re.fullmatch(r"[0-9.]+", s.tracing) and s.tracing.count(".") <= 1
                          and 0 <= float(s.tracing) <= 1):
        die("BENCH_TRACING must be a sample ratio between 0 and 1")
    s.pg_stats_wait = whole("BENCH_PG_STATS_WAIT", "11")
    s.bin_dir = env("BENCH_BIN_DIR")
    s.floor = env("BENCH_FLOOR", "1") == "1"
    s.h2 = env("BENCH_H2", "0") == "1"
    s.shapes = env("BENCH_SHAPES", "1") == "1"
    s.token_delay_ms = whole("BENCH_TOKEN_DELAY_MS", "10")
    s.h2_conns = whole("BENCH_H2_CONNECTIONS", "4", 1)
    s.h2_streams = whole("BENCH_H2_STREAMS", "8", 1)
    s.c1_client = choice("BENCH_C1_CLIENT", "probe", ["probe", "wrk"])
    s.paced_client = choice("BENCH_PACED_CLIENT", "wrk", ["wrk", "probe"])
    s.nice = whole("BENCH_NICE", "-10", None)
    if os.geteuid() != 0 and s.nice < 0:
        s.nice = 0
    s.cores = os.cpu_count() or 1
    s.clk_tck = os.sysconf("SC_CLK_TCK")
    if os.uname().sysname != "Linux":
        die("needs Linux (/proc/PID/stat for CPU time)")
    s.port = {t: s.port_base + off for t, off in PORT_OFFSET.items()}
    s.use_redis = s.limits != "0" or s.full != "0"
    s.use_pg = s.billing != "0" or s.full != "0"
    choose_targets(s)
    return s


def choose_targets(s):
    s.floor_targets = ["pingora", "pingora-replay"] if s.floor else []
    s.extra_targets = []
    for name in ("limits", "billing", "full"):
        if getattr(s, name) != "0":
            s.extra_targets += [t for t in SETS[name] if t not in s.extra_targets]
    # gw-auth and gw-auth-pg only set up the stores for BENCH_FULL alone: not measured.
    alone = s.limits == "0" and s.billing == "0"
    s.measured = [t for t in s.extra_targets if not (alone and t in ("gw-auth", "gw-auth-pg"))]
    s.json_targets = ["direct", "nginx"] + s.floor_targets + ["gateway"]
    s.sse_targets = list(s.json_targets)
    # A set asked for alone drops the default runs, except the full chain, which keeps the
    # ladder (its ratios are to the nginx hop).
    sets = (s.limits, s.billing, s.full)
    if "only" in sets and "1" not in sets and s.full != "only":
        s.json_targets, s.sse_targets = ["direct"], []
    s.json_targets += s.measured
    s.sse_targets += [t for t in s.measured if is_full(t)]  # limits and billing: non-streamed
    s.h2_targets = (["nginx"] + [t for t in s.measured if is_full(t)]) if s.h2 else []


_apt_updated = False


def apt_install(*packages):
    global _apt_updated
    if os.geteuid() != 0:
        die(f"{' '.join(packages)} missing and not root: install them (apt-get install {' '.join(packages)})")
    quiet = dict(env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)
    if not _apt_updated:
        log("apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], check=True, **quiet)
        _apt_updated = True
    log(f"apt-get install {' '.join(packages)}")
    return subprocess.run(["apt-get", "install", "-y", "-qq", *packages], **quiet).returncode == 0


def need(command, package):
    if not shutil.which(command):
        apt_install(package)


def prepare_tools(s):
    """Installs what is missing (as root), checks Redis and PostgreSQL answer, finds the binaries."""
    need("wrk", "wrk")
    s.nginx_bin = env("NGINX_BIN") or shutil.which("nginx") or ""
    if not s.nginx_bin and os.access("/usr/sbin/nginx", os.X_OK):
        s.nginx_bin = "/usr/sbin/nginx"
    if not s.nginx_bin:
        apt_install("nginx-light") or apt_install("nginx")
        s.nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(s.nginx_bin, os.X_OK):
        die("nginx not found after install")
    if s.h2:
        need("h2load", "nghttp2-client")
        need("curl", "curl")  # the HTTP/2 check request (--http2-prior-knowledge)
    if s.use_redis:
        need("redis-cli", "redis-tools")
        if not s.redis_url.startswith("redis://"):
            die(f"REDIS_URL must be a redis:// URL (got {s.redis_url})")
        pong = subprocess.run(["redis-cli", "-u", s.redis_url, "PING"], capture_output=True, text=True)
        if pong.stdout.strip() != "PONG":
            die(f"Redis at {s.redis_url} is not reachable (redis-cli PING: "
                f"{(pong.stdout + pong.stderr).strip() or 'no answer'}); start it with: "
                'eval "$(scripts/services.sh)"')
    if s.use_pg:
        need("psql", "postgresql-client")
        need("ss", "iproute2")
        if not re.match(r"postgres(ql)?://", s.database_url):
            die(f"DATABASE_URL must be a postgres:// URL (got {s.database_url})")
        ans = subprocess.run(["psql", s.database_url, "-qtAX", "-c", "select 1"], capture_output=True, text=True)
        if ans.stdout.strip() != "1":
            die(f"PostgreSQL at {redact(s.database_url)} is not reachable (psql: "
                f"{(ans.stdout + ans.stderr).strip() or 'no answer'}); start it with: "
                'eval "$(scripts/services.sh)"')
        # The port the gateways connect to (their sockets are found by it).
        m = re.match(r"^[a-z]+://([^@/]*@)?[^:/?]*(:(\d+))?", s.database_url)
        s.pg_port = (m and m.group(3)) or "5432"
    s.taskset = shutil.which("taskset") or ""
    if not s.taskset:
        log("taskset not found: processes are not pinned (install util-linux for pinning)")
    elif max(s.proxy_cpu, s.backend_cpu) >= s.cores:
        log(f"only {s.cores} core(s): not pinning")
        s.taskset = ""
    find_binaries(s)


def find_binaries(s):
    bin_dir = s.bin_dir or os.path.join(s.target_dir, "dist")
    if not s.bin_dir and s.build:
        log("cargo build --profile dist --bins")
        subprocess.run(["cargo", "build", "--profile", "dist", "--bins", "--quiet"], cwd=s.root, check=True)
    s.gw_bin, s.mock_bin, s.floor_bin, s.probe_bin = (
        os.path.join(bin_dir, b) for b in
        ("tollgate", "tollgate-mock-replica", "tollgate-bench-floor", "tollgate-bench-probe"))
    if not (os.access(s.gw_bin, os.X_OK) and os.access(s.mock_bin, os.X_OK)):
        die(f"tollgate and tollgate-mock-replica missing in BENCH_BIN_DIR={s.bin_dir}" if s.bin_dir
            else f"dist binaries missing in {bin_dir} (run without --no-build)")
    probe = os.access(s.probe_bin, os.X_OK)
    if s.c1 and s.c1_client == "probe" and not probe:
        die(f"no tollgate-bench-probe at {s.probe_bin} (build it, or BENCH_C1_CLIENT=wrk)")
    if s.paced_client == "probe" and not probe:
        die(f"no tollgate-bench-probe at {s.probe_bin} (build it, or BENCH_PACED_CLIENT=wrk)")
    if s.floor and not os.access(s.floor_bin, os.X_OK):
        die(f"no tollgate-bench-floor at {s.floor_bin} (build it, or BENCH_FLOOR=0 to leave the Pingora floor out)")


def redact(url):
    return re.sub(r"//.*@", "//***@", url, count=1)
