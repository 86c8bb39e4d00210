"""What runs in which order: the stack, the checks, every case against every target (each
run read by measure.py into one row of results.tsv), the ledger audit, the report."""
import json
import os
import re
import subprocess
import time
import urllib.request

import clients
import measure as m
import report
from settings import die, has_billing, has_limits, is_full, log, prefix, store_of, uses_redis
from stack import Stack, listening


class Ladder:
    def __init__(self, s, stack):
        self.s, self.st = s, stack
        self.rows = []

    def key_of(self, t):
        return self.st.keys[store_of(t)] if t.startswith("gw-") else ""

    def port_of(self, t, case=""):
        return self.s.port["nginx-h2"] if t == "nginx" and case.endswith("-h2") else self.s.port[t]

    # ---- the check request ----------------------------------------------------------------
    def check(self, t, shape):
        """One request through T must be a 200 of the expected shape (and, with billing, have
        placed a hold and settled)."""
        s, st = self.s, self.st
        body, tokens = self.bodies[shape], 16 if shape == "json" else 64
        what = f"{t} ({shape})"
        headers = {"x-mock-tokens": str(tokens)}
        if t.startswith("gw-"):  # without a key: refused by auth (the key is what lets it in)
            code, _, text = clients.post(s.port[t], body, {})
            if code != 401:
                die(f"{what}: HTTP {code} without a key (expected 401): {text[:400]}")
            headers["authorization"] = f"Bearer {self.key_of(t)}"
        before = int(m.ledger_sql(st, t, "SELECT coalesce(max(id), 0) FROM ledger_entries")) if has_billing(t) else 0
        code, head, text = clients.post(s.port[t], body, headers)
        if code != 200:
            die(f"{what}: HTTP {code}: {text[:400]}")
        if has_limits(t) and not clients.header(head, "x-ratelimit-remaining"):
            die(f"{what}: no X-RateLimit-* headers (limits plugin not active?)")
        if shape == "json" and '"usage"' not in text:
            die(f"{what}: no usage in {text[:400]}")
        if shape == "sse" and not re.search(r"^data: \[DONE\]", text, re.M):
            die(f"{what}: stream without [DONE]")
        if t == "gateway" or t.startswith("gw-"):
            if '"model":"llama-3.1-8b-instruct"' not in text:
                die(f"{what}: model not renamed")
            if '"cost"' not in text:
                die(f"{what}: no priced usage")
        if has_billing(t):
            self.check_ledger(t, what, head, before)
        for suffix, content in (("", text), (".headers", head)):
            with open(os.path.join(st.out, f"check-{t}-{shape}.out{suffix}"), "w") as f:
                f.write(content)
        return text

    def check_ledger(self, t, what, head, before):
        """The settlement lands in the log phase, just after the answer: the request's own
        entries when the answer names it (x-request-id), else entries since the request."""
        st = self.st
        rid = clients.header(head, "x-request-id").replace("'", "")
        which = f"request_id = '{rid}'" if rid else f"id > {before}"
        for _ in range(20):
            if m.ledger_count(st, t, f"kind = 'settlement' AND {which}") >= 1:
                break
            time.sleep(0.1)
        else:
            die(f"{what}: no settlement in the ledger after a priced request" + (f" ({rid})" if rid else ""))
        if self.s.plan and is_full(t):  # plan-funded: a hold row of 0 cents, funding 'plan'
            if not clients.header(head, "x-service-funding").lower().startswith("plan"):
                die(f"{what}: not funded by the plan")
            if not rid or int(m.ledger_sql(st, t, f"SELECT count(*) FROM holds WHERE funding = 'plan' "
                                                  f"AND request_id = '{rid}'")) < 1:
                die(f"{what}: no plan hold" + (f" for {rid}" if rid else ""))
        elif m.hold_count(st, t, "amount_cents > 0" + (f" AND request_id = '{rid}'" if rid else "")) < 1:
            die(f"{what}: no hold in the ledger" + (f" for {rid}" if rid else ""))
        log(f"{what}: the check request{' ' + rid if rid else ''} placed a hold and settled")

    def check_all(self):
        s = self.s
        self.bodies = clients.write_bodies(self.st.work)
        for t in ["direct", "nginx"] + s.floor_targets + ["gateway"]:
            self.check(t, "json")
            stream = self.check(t, "sse")
            if t == "gateway":
                self.frames = len(re.findall(r"^data: ", stream, re.M))
        for t in s.extra_targets:
            self.check(t, "json")
            if is_full(t):
                self.check(t, "sse")
        log(f"responses check out (the 64-token stream is {self.frames} SSE frames, [DONE] included)")
        for t in s.h2_targets:
            clients.h2_check(t, self.port_of(t, "-h2"), self.bodies["sse"], self.key_of(t),
                             os.path.join(self.st.work, f"check-{t}-h2.out"))
        if s.h2_targets:
            log(f"HTTP/2 with prior knowledge answers on: {' '.join(s.h2_targets)}")

    # ---- one run ----------------------------------------------------------------------------
    def proxy_pids(self, t):
        if t == "direct":
            return []
        pid = self.st.pid(t)
        return [pid] + (m.child_pids(pid) if t == "nginx" else [])  # nginx: master + worker

    def run(self, rnd, case, t, conns, delay):
        """One warm-up and one measured run; appends a row of results.tsv (see report.py)."""
        s, st = self.s, self.st
        name = f"{case}-{t}"
        shape = "sse" if case.startswith("sse") else "json"
        tokens = {"json256": 256}.get(case, 64 if shape == "sse" else 16)
        extra = {"sse64-paced": f"x-mock-token-delay-ms: {s.token_delay_ms}", "sse64-whole": "x-mock-sse-whole: 1"}
        key = self.key_of(t)
        argv, duration_arg, client = clients.load_command(s, case, self.port_of(t, case), conns, delay, key,
                                                         self.bodies[shape], tokens)
        argv = prefix(s, s.backend_cpu) + argv
        env = {**os.environ, "BENCH_BODY_FILE": self.bodies[shape], "BENCH_TOKENS": str(tokens),
               "BENCH_DELAY_MS": str(delay), "BENCH_API_KEY": key, "BENCH_EXTRA_HEADER": extra.get(case, "")}
        h2 = case.endswith("-h2")
        if s.warmup > 0:
            clients.run_load(argv, duration_arg, s.warmup, None, env, h2)
        pids = self.proxy_pids(t)
        servers = [p.pid for p in st.procs.values()] + m.child_pids(st.pid("nginx"))
        billing, pg, redis = has_billing(t), t.endswith("-pg"), uses_redis(t)
        if pg:  # after a quiet pause (pg_stats), and the sockets and backends before the run
            time.sleep(s.pg_stats_wait)
            pgs0, cpu0 = m.pg_stats(s, st.pg_db), m.pg_backend_ticks(s, st.pg_db)
            segs0 = m.pg_socket_segs(s, st.pid(t))
        if billing:
            h0, st0 = m.hold_count(st, t, "amount_cents > 0"), m.ledger_count(st, t, "kind = 'settlement'")
        if redis:  # after the PostgreSQL pause, so that the counts cover the run only
            time.sleep(0.3)  # the warm-up's last lease releases
            info0 = m.redis_info(s.redis_url)
        busy0, steal0 = m.machine_ticks()
        s0, c0, t0 = m.cpu_ticks(servers), m.children_ticks(), time.time_ns()
        p0, mk0 = m.cpu_ticks(pids), m.cpu_ticks([st.pid("mock")])
        n0 = m.cpu_ns(pids) if m.HAVE_SCHEDSTAT else 0
        log(f"{name}: {client} for {s.duration}s" + (f" (each waits {delay} ms before a request)" if delay else ""))
        raw = os.path.join(st.out, f"wrk-{name}" + (f".round{rnd}" if s.rounds > 1 else "") + ".txt")
        res = clients.run_load(argv, duration_arg, s.duration, raw, env, h2)
        n1 = m.cpu_ns(pids) if m.HAVE_SCHEDSTAT else 0
        p1, mk1 = m.cpu_ticks(pids), m.cpu_ticks([st.pid("mock")])
        t1, c1, s1 = time.time_ns(), m.children_ticks(), m.cpu_ticks(servers)
        busy1, steal1 = m.machine_ticks()
        st.check_alive()
        if res is None:
            die(f"no summary from wrk for {name}")
        req, dur = int(res["requests"]), int(res["duration_us"])
        if req <= 0:
            die(f"{name}: no request completed")
        errs = sum(int(res[f"err_{k}"]) for k in ("connect", "read", "write", "status", "timeout"))
        per_req = lambda ticks: f"{ticks * 1e6 / s.clk_tck / req:.1f}"  # noqa: E731
        machine = (t1 - t0) / 1e9 * s.clk_tck * s.cores
        other = max(0.0, 100 * (busy1 - busy0 - (s1 - s0) - (c1 - c0)) / machine)
        row = [rnd, case, t, f"{req * 1e6 / dur:.0f}", res["p50_us"], res["p99_us"],
               "-" if t == "direct" else per_req(p1 - p0), per_req(mk1 - mk0), errs, req,
               f"{(n1 - n0) / 1000 / req:.1f}" if t != "direct" and m.HAVE_SCHEDSTAT else "-",
               f"{other:.0f}", f"{100 * (steal1 - steal0) / machine:.0f}", res["err_status"]]
        rstats = ["-"] * 8
        if redis:  # the lease releases of the last requests land just after the run
            time.sleep(0.5)
            rstats = m.redis_delta(info0, m.redis_info(s.redis_url), req,
                                   os.path.join(st.out, f"redis-{name}.txt"))
            rstats.append(m.redis_foreign(s.redis_url, st.pid(t), s.duration))
            if rstats[-1]:
                log(f"WARNING: {name}: {rstats[-1]} other Redis client(s) ran commands during the run: "
                    "the command counts include theirs")
        bstats = ["-"] * 9
        if billing or pg:  # the settlements of the last requests land just after the run too
            time.sleep(0.5)
            if billing:
                dh = m.hold_count(st, t, "amount_cents > 0") - h0
                ds = m.ledger_count(st, t, "kind = 'settlement'") - st0
                bstats[:3] = [f"{dh / req:.3f}", f"{ds / req:.3f}", f"{ds * 1e6 / dur:.0f}"]
            if pg:
                segs1, cpu1 = m.pg_socket_segs(s, st.pid(t)), m.pg_backend_ticks(s, st.pg_db)
                time.sleep(s.pg_stats_wait)
                pgs1 = m.pg_stats(s, st.pg_db)
                bstats[3:] = ([f"{(pgs1[i] - pgs0[i]) / req:.3f}" for i in (0, 2, 3)]
                              + [f"{m.delta_sum(segs0, segs1, i) / req:.3f}" for i in (0, 1)]
                              + [per_req(m.delta_sum(cpu0, cpu1))])
                table = lambda d: "".join(f"{k} {' '.join(map(str, v)) if isinstance(v, tuple) else v}\n"  # noqa: E731
                                          for k, v in d.items())
                with open(os.path.join(st.out, f"pg-{name}.round{rnd}.txt"), "w") as f:
                    f.write(f"pg_stat_database before (xact_commit xact_rollback tup_inserted tup_updated): "
                            f"{' '.join(map(str, pgs0))}\npg_stat_database after: {' '.join(map(str, pgs1))}\n"
                            f"requests: {req}\ngateway sockets to PostgreSQL, before (port data_segs_out "
                            f"data_segs_in):\n{table(segs0)}after:\n{table(segs1)}backend CPU ticks before "
                            f"(pid ticks):\n{table(cpu0)}after:\n{table(cpu1)}")
                m.warn_rollbacks(name, pgs0, pgs1)
        self.rows.append(row + rstats + bstats)
        if errs:
            log(f"WARNING: {name} had {errs} errors (see {raw})")
        if t.startswith("gw-") and res["err_status"] != "0":
            log(f"WARNING: {name}: {res['err_status']} answers were not 2xx/3xx: "
                "the figures are not for admitted requests only")

    def run_all(self):
        s = self.s
        paced_delay = max(1, s.paced_conns * 1000 // s.rate)
        for rnd in range(1, s.rounds + 1):
            if s.rounds > 1:
                log(f"round {rnd} of {s.rounds}")
            plan = [("json16", s.json_targets, s.conns, 0), ("sse64", s.sse_targets, s.conns, 0)]
            if s.shapes:
                plan += [("json256", s.json_targets, s.conns, 0), ("sse64-paced", s.sse_targets, s.conns, 0),
                         ("sse64-whole", s.sse_targets, s.conns, 0)]
            plan += [("json16-h2", s.h2_targets, 0, 0), ("sse64-h2", s.h2_targets, 0, 0),
                     (f"json16@{s.rate}rps", s.json_targets, s.paced_conns, paced_delay)]
            if s.c1:
                plan.append(("json16@c1", s.json_targets, 1, 0))
            for case, targets, conns, delay in plan:
                for t in targets:
                    self.run(rnd, case, t, conns, delay)

    # ---- after the runs -------------------------------------------------------------------
    def audit(self):
        """Every hold settled or released and the balance equal to the sum of the entries (the
        admin API's check); the answers other than 2xx from the gateway's metrics."""
        st, lines, failed = self.st, [], []
        audited = [t for t in ("gw-billing-sqlite", "gw-billing-pg", "gw-full", "gw-full-pg") if t in st.procs]
        if audited:
            time.sleep(1)
        for t in audited:
            ws = st.workspaces[store_of(t)]
            ans = st.admin(t, f"/admin/v1/workspaces/{ws}/ledger")
            with open(os.path.join(st.out, f"ledger-{t}.json"), "w") as f:
                json.dump(ans, f, indent=2)
            check = ans.get("check") or {}
            line = (f"balance_cents={ans.get('balance_cents')} held_cents={ans.get('held_cents')} "
                    f"carry_microcents={ans.get('carry_microcents')} derived_balance_cents="
                    f"{check.get('derived_balance_cents')} consistent={str(check.get('consistent')).lower()}")
            mine = f"FROM %s WHERE workspace_id = '{ws}'"
            line += " open_holds=" + m.ledger_sql(st, t, f"SELECT count(*) {mine % 'holds'} AND state = 'open'")
            entries = m.ledger_sql(st, t, f"SELECT kind || ':' || count(*) {mine % 'ledger_entries'} "
                                          "GROUP BY kind ORDER BY kind")
            lines.append(f"{t}: {line} entries: {' '.join(entries.split())} ")
            if ans.get("held_cents") != 0 or check.get("consistent") is not True or not line.endswith(" open_holds=0"):
                log(f"WARNING: {t}: the ledger after the runs is not settled and consistent: {line}")
                failed.append(t)
            metrics = os.path.join(st.out, f"metrics-{t}.txt")
            with open(metrics, "w") as f:
                f.write(st.admin(t, "/metrics"))
            answers = subprocess.run(["awk", "-f", os.path.join(self.s.helpers, "non_2xx.awk"), metrics],
                                     capture_output=True, text=True).stdout.rstrip("\n")
            lines.append(f"{t}: answers other than 2xx over all its runs (tollgate_requests_total): {answers}")
        if self.s.tracing:
            time.sleep(1)  # the batch processors send what they hold every 500 ms
            with urllib.request.urlopen(f"http://127.0.0.1:{self.s.port['direct']}/mock/stats", timeout=10) as r:
                sink = json.load(r)
            lines.append(f"traces (sample_ratio {self.s.tracing} on the full-chain gateways): the OTLP sink took "
                         f"{sink.get('otlp_exports')} exports, {sink.get('otlp_bytes')} bytes")
        return lines, failed


def main(s):
    ports = [s.port[t] + d for t in ["direct", "nginx"] + s.floor_targets + ["gateway"] + s.extra_targets
             for d in ((0, 1) if t == "gateway" or t.startswith("gw-") else (0,))]
    for p in ports:
        if listening(p):
            die(f"port {p} is already in use (set BENCH_PORT_BASE to move all {len(ports)} ports)")
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[0]
    if float(load1) > 0.5:
        log(f"WARNING: load average is {load1} before starting: something else is using the CPUs, expect noisy figures")
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = os.path.join(s.target_dir, "bench", f"load-{stamp}")
    os.makedirs(out, exist_ok=True)
    st = Stack(s, out)
    try:
        st.start_ladder()
        st.start_extra(stamp)
        ladder = Ladder(s, st)
        ladder.check_all()
        report.write_env(s, st, os.path.join(out, "env.txt"))
        ladder.run_all()
        with open("/proc/loadavg") as f, open(os.path.join(out, "env.txt"), "a") as env:
            env.write(f"loadavg after: {' '.join(f.read().split()[:3])}\n")
        audit, failed = ladder.audit()
    finally:
        st.stop()
    text = report.render(s, ladder.rows, ladder.frames, audit, out)
    print(text, flush=True)
    print(f"\nraw output: {out}")
    if failed:
        die(f"ledger audit failed after the runs for: {' '.join(failed)} (see {out}/ledger-*.json)")
