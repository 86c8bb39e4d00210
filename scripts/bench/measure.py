"""Readings around a run: CPU of processes (/proc/PID/stat and schedstat), of the machine and
of this program's children (the load generator), Redis INFO deltas, pg_stat_database, the
PostgreSQL backends' CPU and the gateway's sockets to it, and the ledger's rows."""
import glob
import os
import re
import sqlite3
import subprocess

from settings import die, log, store_of


def stat_fields(pid="self"):
    """The fields of /proc/PID/stat after the command name: [0] is the state, [11] utime."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].split()


def cpu_ticks(pids):
    """utime+stime of the processes, in clock ticks (sampled by the kernel)."""
    return sum(int(f[11]) + int(f[12]) for f in map(stat_fields, pids))


def cpu_ns(pids):
    """Scheduler run time of every thread of the processes, in ns: exact, unlike the ticks,
    but it forgets threads that exited (the servers keep theirs)."""
    total = 0
    for pid in pids:
        for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
            try:
                with open(path) as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError):
                pass
    return total


HAVE_SCHEDSTAT = os.access("/proc/self/schedstat", os.R_OK)


def machine_ticks():
    """(busy, stolen) ticks of the whole machine: with the servers' own ticks they tell how much
    CPU something else took during a run (a build beside the bench makes every figure noisy)."""
    with open("/proc/stat") as f:
        c = [int(x) for x in f.readline().split()[1:]]
    return c[0] + c[1] + c[2] + c[5] + c[6], c[7]


def children_ticks():
    """CPU of this program's waited-for children (the load generator)."""
    f = stat_fields()
    return int(f[13]) + int(f[14])


def child_pids(parent):
    """Processes whose parent is PARENT (nginx's workers)."""
    pids = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path) as f:
                if int(f.read().rsplit(") ", 1)[1].split()[1]) == parent:
                    pids.append(int(path.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    return pids


# ---- Redis --------------------------------------------------------------------------------
def redis_info(url):
    """INFO all as {field: value}, commandstats as cmd:<name> -> calls."""
    out = subprocess.run(["redis-cli", "-u", url, "INFO", "all"], capture_output=True, text=True)
    if out.returncode:
        die("Redis INFO failed")
    info = {}
    for line in out.stdout.replace("\r", "").splitlines():
        key, _, value = line.partition(":")
        if key.startswith("cmdstat_"):
            info["cmd:" + key[8:]] = int(re.search(r"calls=(\d+)", value).group(1))
        elif value:
            info[key] = value
    return info


def redis_delta(before, after, n, path):
    """Per completed request: EVALSHA, ZREM and the other commands a client sends itself (EVAL,
    SCRIPT, PING; commandstats also counts what a script runs), all commands, read events,
    Redis CPU in us, and the list of commands; the deltas go to PATH. The INFO of the before
    snapshot is left out."""
    calls = {}
    for key in sorted(k for k in after if k.startswith("cmd:")):
        d = after[key] - before.get(key, 0) - (key == "cmd:info")
        if d > 0:
            calls[key[4:]] = d
    other = sum(d for k, d in calls.items() if re.fullmatch(r"eval|eval_ro|evalsha_ro|script\|.*|ping", k))
    total = int(after["total_commands_processed"]) - int(before["total_commands_processed"]) - 1
    reads = int(after["total_reads_processed"]) - int(before["total_reads_processed"])
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    with open(path, "w") as f:
        for k, d in calls.items():
            f.write(f"{k} calls={d} per_request={d / n:.4f}\n")
        f.write(f"total_commands={total} reads={reads} cpu_s={cpu:.3f} requests={n}\n")
    listed = ",".join(f"{k}:{d / n:.3f}" for k, d in calls.items()) or "none"
    return [f"{calls.get('evalsha', 0) / n:.3f}", f"{calls.get('zrem', 0) / n:.3f}", f"{other / n:.3f}",
            f"{total / n:.3f}", f"{reads / n:.3f}", f"{cpu * 1e6 / n:.1f}", listed]


def redis_foreign(url, pid, seconds):
    """Redis clients other than PID's connections that ran a command in the last SECONDS
    (another test or tool on the same Redis skews the counts)."""
    mine = {row[3].rsplit(":", 1)[1] for row in ss(["-Htnp"]) if f"pid={pid}," in " ".join(row)}
    out = subprocess.run(["redis-cli", "-u", url, "CLIENT", "LIST"], capture_output=True, text=True).stdout
    foreign = 0
    for line in out.replace("\r", "").splitlines():
        v = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if v.get("cmd") in ("client|list", "info") or v.get("addr", "").rsplit(":", 1)[-1] in mine:
            continue
        foreign += int(v.get("idle", "0")) <= seconds
    return foreign


def ss(args):
    out = subprocess.run(["ss", *args], capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


# ---- PostgreSQL ---------------------------------------------------------------------------
def psql(url, sql):
    out = subprocess.run(["psql", url, "-qtAX", "-F", " ", "-c", sql], capture_output=True, text=True)
    if out.returncode:
        die(f"psql: {out.stderr.strip()}")
    return out.stdout.strip()


def pg_stats(s, db):
    """xact_commit xact_rollback tup_inserted tup_updated of the bench database. A backend
    publishes its counters when idle, an idle one up to 10 s late: read after a quiet pause."""
    return [int(x) for x in psql(s.database_url, "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated "
                                 f"FROM pg_stat_database WHERE datname = '{db}'").split()]


def pg_backend_ticks(s, db):
    """{pid: utime+stime} of every backend connected to the bench database."""
    ticks = {}
    for pid in psql(s.database_url, f"SELECT pid FROM pg_stat_activity WHERE datname = '{db}'").split():
        try:
            ticks[pid] = cpu_ticks([pid])
        except OSError:
            pass
    return ticks


def pg_socket_segs(s, pid):
    """{local port: (data_segs_out, data_segs_in)} of PID's connections to PostgreSQL: what the
    gateway sent and received. On loopback each send of a small message is one segment, so
    the sends count round trips (a pipelined batch is one send)."""
    segs, port = {}, None
    for row in ss(["-Htinp", f"dport = :{s.pg_port}"]):
        line = " ".join(row)
        if not row:
            continue
        if row[0][:1].isupper():
            port = row[3].rsplit(":", 1)[1] if f"pid={pid}," in line else None
        elif port:
            found = dict(re.findall(r"data_segs_(out|in):(\d+)", line))
            segs[port] = (int(found.get("out", 0)), int(found.get("in", 0)))
            port = None
    return segs


def delta_sum(before, after, col=None):
    """Sum over the keys of AFTER of AFTER - BEFORE (0 before for a new key)."""
    pick = (lambda v: v) if col is None else (lambda v: v[col])
    return sum(pick(v) - (pick(before[k]) if k in before else 0) for k, v in after.items())


# ---- the ledger, read from the store directly (not through the gateway) -------------------
def ledger_sql(stack, t, sql):
    """The one value SQL answers on T's store."""
    if store_of(t) == "pg":
        return psql(stack.pg_url, sql)
    con = sqlite3.connect(os.path.join(stack.identity, "tollgate.db"), timeout=5)
    try:
        rows = con.execute(sql).fetchall()
    finally:
        con.close()
    return "\n".join("|".join(str(v) for v in row) for row in rows)


def ledger_count(stack, t, where):
    ws = stack.workspaces[store_of(t)]
    return int(ledger_sql(stack, t, f"SELECT count(*) FROM ledger_entries WHERE workspace_id = '{ws}' AND {where}"))


def hold_count(stack, t, where):
    """Hold rows of the workspace (decision 133: credit holds have amount_cents > 0)."""
    ws = stack.workspaces[store_of(t)]
    return int(ledger_sql(stack, t, f"SELECT count(*) FROM holds WHERE workspace_id = '{ws}' AND {where}"))


def warn_rollbacks(name, before, after):
    if after[1] != before[1]:
        log(f"WARNING: {name}: {after[1] - before[1]} PostgreSQL transactions rolled back")
