#!/usr/bin/env python3
"""Turns bench/run.sh's raw figures into the markdown tables of bench/results/latest.md.

Input: one figure per line, tab-separated: round, target (A B C M D, B P N K F in the TLS
scenarios, S R W in the cluster ones), scenario, metric, value. Targets M (keyrelay with
pins in memory) and D (the hyper pass-through floor) are optional: raw files without them
give a table without their columns. The TLS scenarios (tls-keepalive-<rate>,
tls-handshake-<rate>) get a table of their own after the first, and are all there is with
BENCH_TLS=only (bench/tls.sh); so do the cluster ones (cluster-get-<rate>,
cluster-poll-<rate>, and the one-at-a-time round-trip counts cluster-seq-get and
cluster-seq-poll) with BENCH_CLUSTER=only.
Round 0 holds one-off figures (memory, startup); rounds 1..N the interleaved runs, of which
the median is shown, with the spread across rounds beside the figures compared most.
Errors are summed over rounds rather than taken as a median.
Three requests: get and post (in.php submits) and poll (a res.php poll); raw files without
poll runs (all those from before it had any) give a table without poll sections.
"""

import argparse
import collections
import datetime
import os
import platform
import statistics

TARGETS = ("A", "B", "C")  # M and D join when the raw figures have them (see main)
OK, MISS = "✓", "✗"
# The requests, in table order. The issues' goals are set on the submits only: poll rows
# show the ratios without a goal.
REQUESTS = (
    ("get", "GET /in.php?…"),
    ("post", "POST /in.php, 219-byte urlencoded body"),
    ("poll", "GET /res.php?…action=get&id=… (poll, not ready)"),
)
GOALS = ("get", "post")


def load(path):
    runs = collections.defaultdict(list)  # (target, scenario, metric) -> [values]
    once = {}  # (scenario, metric) -> value
    for line in open(path):
        rnd, target, scenario, metric, value = line.rstrip("\n").split("\t")
        if rnd == "0":
            once[(scenario, metric)] = float(value)
        else:
            runs[(target, scenario, metric)].append(float(value))
    return runs, once


def fmt(value, digits=0):
    return f"{value:,.{digits}f}"


def ratio(c, b):
    return c / b if b else float("nan")


def mark(ok):
    return OK if ok else MISS


class Table:
    def __init__(self, runs):
        self.runs = runs
        self.rows = []

    def med(self, t, sc, metric):
        values = self.runs.get((t, sc, metric))
        return statistics.median(values) if values else None

    def spread(self, t, sc, metric):
        """Half the range across rounds, as a share of the median: the ± of a cell."""
        values = self.runs.get((t, sc, metric)) or []
        m = statistics.median(values) if values else 0
        return (max(values) - min(values)) / 2 / m * 100 if len(values) > 1 and m else 0

    def extremes(self, t, sc, metric):
        """(min, max) across rounds."""
        values = self.runs.get((t, sc, metric)) or [0]
        return min(values), max(values)

    def section(self, title):
        self.rows.append(f"| **{title}** |" + " |" * (len(TARGETS) + len(VERSUS) + 1))

    def row(self, name, cells, vs=(), goal=""):
        """`cells` per target (padded with blanks), `vs` per ratio column."""
        cells = list(cells) + [""] * (len(TARGETS) - len(cells))
        vs = list(vs) + [""] * (len(VERSUS) - len(vs))
        self.rows.append(f"| {name} | " + " | ".join(cells + vs) + f" | {goal} |")

    def metric_row(self, sc, metric, name, digits=0, goal=None, lower_is_better=True,
                   with_spread=False, with_range=False):
        meds = {t: self.med(t, sc, metric) for t in TARGETS}
        if any(v is None for v in meds.values()):
            return
        cells = []
        for t in TARGETS:
            cell = fmt(meds[t], digits)
            if with_spread:
                cell += f" ±{self.spread(t, sc, metric):.0f}%"
            if with_range and len(self.runs.get((t, sc, metric), [])) > 1:
                low, high = self.extremes(t, sc, metric)
                cell += f" ({fmt(low, digits)}–{fmt(high, digits)})"
            cells.append(cell)
        r = ratio(meds["C"], meds["B"])
        goal_text = ""
        if goal is not None:
            met = r <= goal if lower_is_better else r >= goal
            goal_text = f"{'≤' if lower_is_better else '≥'} {goal:.{1 if goal == round(goal, 1) else 2}f}× {mark(met)}"
        self.row(name, cells, [f"{ratio(meds[t], meds['B']):.2f}×" for t in VERSUS], goal_text)

    def has(self, sc):
        return any(s == sc for (_, s, _) in self.runs)

    def errors_row(self, sc):
        sums = {t: sum(self.runs.get((t, sc, "errors"), [])) for t in TARGETS}
        self.row("errors (non-2xx + socket), all rounds", [fmt(sums[t]) for t in TARGETS])


# The TLS table's columns, in table order, and the plain reference each TLS target's own
# share is read against.
TLS_TARGETS = ("B", "P", "N", "K", "F")
TLS_NAMES = {"B": "B: nginx plain", "P": "P: keyrelay plain", "N": "N: nginx ssl",
             "K": "K: keyrelay [tls]", "F": "F: keyrelay CONNECT"}
TLS_PLAIN = {"N": "B", "K": "P", "F": "P"}
# The issue's goal: K's CPU per request at the fixed rate with keep-alive, against N's.
TLS_GOAL = 1.2


def tls_table(runs, a):
    """The TLS rows: a section per measurement, ratios to N; [] without TLS figures."""
    modes = []
    for sc in sorted({s for (_, s, _) in runs if s.startswith("tls-")}):
        mode, rate = sc[len("tls-"):].rsplit("-", 1)
        modes.append((0 if mode == "keepalive" else 1, mode, int(rate), sc))
    tab = Table(runs)

    def med(t, sc, metric):
        return tab.med(t, sc, metric)

    def cell(t, sc, metric, digits, with_range=True):
        m = med(t, sc, metric)
        if m is None:
            return "n/a"
        text = fmt(m, digits)
        if with_range and len(runs.get((t, sc, metric), [])) > 1:
            low, high = tab.extremes(t, sc, metric)
            text += f" ({fmt(low, digits)}–{fmt(high, digits)})"
        return text

    def vs_n(t, sc, metric):
        x, n = med(t, sc, metric), med("N", sc, metric)
        return f"{x / n:.2f}×" if x is not None and n else ""

    rows = []
    blank = " |" * (len(TLS_TARGETS) + 3)
    for _, mode, rate, sc in sorted(modes):
        if mode == "keepalive":
            title = (f"GET /in.php?…, fixed rate {rate:,} req/s, oha -c{a.oha_connections}, "
                     "keep-alive")
        else:
            title = (f"GET /in.php?…, fixed rate {rate:,}/s, oha -c{a.oha_connections} "
                     "--disable-keepalive: a new connection and TLS handshake per request "
                     "(F: a new CONNECT too)")
        rows.append(f"| **{title}** |" + blank)
        goal = ""
        k, n = med("K", sc, "cpu_us"), med("N", sc, "cpu_us")
        if mode == "keepalive" and k is not None and n:
            goal = f"K ≤ {TLS_GOAL}× N {mark(k <= TLS_GOAL * n)}"
        rows.append("| server CPU µs/req (min–max) | "
                    + " | ".join(cell(t, sc, "cpu_us", 1) for t in TLS_TARGETS)
                    + f" | {vs_n('K', sc, 'cpu_us')} | {vs_n('F', sc, 'cpu_us')} | {goal} |")
        # TLS's own share: each TLS target's median minus its plain reference's.
        share = {}
        for t, plain in TLS_PLAIN.items():
            x, y = med(t, sc, "cpu_us"), med(plain, sc, "cpu_us")
            share[t] = x - y if x is not None and y is not None else None
        text = {t: "n/a" if v is None else fmt(v, 1) for t, v in share.items()}
        rel = {t: f"{share[t] / share['N']:.2f}×" if share[t] is not None and share["N"] else ""
               for t in ("K", "F")}
        rows.append(f"| TLS's share, µs/req (N − B, K − P, F − P) | — | — | {text['N']} | "
                    f"{text['K']} | {text['F']} | {rel['K']} | {rel['F']} | |")
        rows.append("| req/s achieved | " + " | ".join(
            cell(t, sc, "rps", 0, False) for t in TLS_TARGETS) + " | | | |")
        for metric, name in (("p50_us", "p50 µs"), ("p99_us", "p99 µs")):
            rows.append(f"| {name} | " + " | ".join(
                cell(t, sc, metric, 0, False) for t in TLS_TARGETS)
                + f" | {vs_n('K', sc, metric)} | {vs_n('F', sc, metric)} | |")
        rows.append("| errors (non-2xx + socket), all rounds | " + " | ".join(
            fmt(sum(runs.get((t, sc, "errors"), []))) for t in TLS_TARGETS) + " | | | |")
    return rows


# The cluster table's columns: the single-instance reference, then the replicas.
CLUSTER_TARGETS = ("S", "R", "W")
CLUSTER_NAMES = {"S": "S: keyrelay, single instance",
                 "R": "R: [cluster], Redis without persistence",
                 "W": "W: [cluster], Redis with AOF everysec"}
# Issue 14 §5: against the single instance, at most 1.5× its CPU per request and at most
# 150 µs more p50 at the fixed rate; at most one Redis round trip per submit, none per poll
# of a pinned task.
CLUSTER_CPU_GOAL = 1.5
CLUSTER_P50_GOAL = 150
CLUSTER_TRIPS_GOAL = {"get": 1, "poll": 0}
# In the one-at-a-time count, commands sent less often than this per request are the
# background's (a sync each 500 ms, a heartbeat each 5 s: about 0.03 per request over 500
# requests in half a second), not the requests'.
SENT_SHOWN = 0.05
CLUSTER_REQUESTS = (
    ("get", "GET /in.php?… (submit)"),
    ("poll", "GET /res.php?…action=get&id=… (poll of a task pinned on the same replica)"),
)


def cluster_targets(runs):
    """The cluster targets the raw figures have, in table order."""
    present = {t for (t, sc, _) in runs if sc.startswith("cluster-")}
    return tuple(t for t in CLUSTER_TARGETS if t in present)


def cluster_table(runs, a):
    """The cluster rows: a section per request at the fixed rate with ratios to S, then the
    one-at-a-time round-trip counts; [] without cluster figures."""
    targets = cluster_targets(runs)
    if "S" not in targets:
        return []
    replicas = targets[1:]
    tab = Table(runs)
    blank = " |" * (len(targets) + len(replicas) + 1)

    def med(t, sc, metric):
        return tab.med(t, sc, metric)

    def cell(t, sc, metric, digits, with_range=False):
        m = med(t, sc, metric)
        if m is None:
            return "—"
        text = fmt(m, digits)
        if with_range and len(runs.get((t, sc, metric), [])) > 1:
            low, high = tab.extremes(t, sc, metric)
            text += f" ({fmt(low, digits)}–{fmt(high, digits)})"
        return text

    def vs_s(values):
        base = values.get("S")
        return [f"{values[t] / base:.2f}×" if values.get(t) is not None and base else ""
                for t in replicas]

    def row(name, cells, versus=(), goal=""):
        versus = list(versus) + [""] * (len(replicas) - len(versus))
        return f"| {name} | " + " | ".join(list(cells) + versus) + f" | {goal} |"

    def goal(text, values, ok):
        """`text` and a mark per replica that has a figure."""
        marks = [f"{t} {mark(ok(values[t]))}" for t in replicas if values.get(t) is not None]
        return f"{text}: " + " ".join(marks) if marks else ""

    def ratios(values):
        return {t: values[t] / values["S"] for t in replicas
                if values.get(t) is not None and values.get("S")}

    rows = []
    for mode, label in CLUSTER_REQUESTS:
        sc = f"cluster-{mode}-{a.rate}"
        if not tab.has(sc):
            continue
        rows.append(f"| **{label}, fixed rate {a.rate:,} req/s, oha -c{a.oha_connections}** |"
                    + blank)
        rows.append(row("req/s achieved", [cell(t, sc, "rps", 0) for t in targets]))
        p50 = {t: med(t, sc, "p50_us") for t in targets}
        rows.append(row("p50 µs", [cell(t, sc, "p50_us", 0) for t in targets], vs_s(p50)))
        added = {t: p50[t] - p50["S"] for t in replicas
                 if p50[t] is not None and p50["S"] is not None}
        rows.append(row("added p50 µs over S", ["—"] + [
            fmt(added[t]) if t in added else "—" for t in replicas], (),
            goal(f"≤ {CLUSTER_P50_GOAL} µs", added, lambda v: v <= CLUSTER_P50_GOAL)))
        if mode == "get" and tab.has("cluster-ping"):
            # A submit makes one round trip on its way: the added p50 cannot be below it.
            rows.append(row("a bare Redis round trip on this machine, µs (PING every 10 ms, "
                            "redis-cli --latency, mean)", ["—"] + [
                                cell(t, "cluster-ping", "ping_avg_us", 0) for t in replicas]))
        for metric, name in (("p99_us", "p99 µs"), ("p999_us", "p99.9 µs")):
            values = {t: med(t, sc, metric) for t in targets}
            rows.append(row(name, [cell(t, sc, metric, 0) for t in targets], vs_s(values)))
        own = {t: med(t, sc, "cpu_us") for t in targets}
        rows.append(row("keyrelay CPU µs/req (min–max)",
                        [cell(t, sc, "cpu_us", 1, True) for t in targets], vs_s(own),
                        goal(f"≤ {CLUSTER_CPU_GOAL}× S", ratios(own),
                             lambda v: v <= CLUSTER_CPU_GOAL)))
        rows.append(row("Redis CPU µs/req (min–max)",
                        [cell(t, sc, "redis_cpu_us", 1, True) for t in targets]))
        # What the operator pays: the median over rounds of each round's keyrelay + Redis.
        total = {"S": own["S"]}
        for t in replicas:
            sums = [x + y for x, y in zip(runs.get((t, sc, "cpu_us"), []),
                                          runs.get((t, sc, "redis_cpu_us"), []))]
            total[t] = statistics.median(sums) if sums else None
        rows.append(row("keyrelay + Redis CPU µs/req",
                        [fmt(total[t], 1) if total[t] is not None else "—" for t in targets],
                        vs_s(total),
                        goal(f"≤ {CLUSTER_CPU_GOAL}× S", ratios(total),
                             lambda v: v <= CLUSTER_CPU_GOAL)))
        rows.append(row("Redis commands per request, those its scripts run included",
                        [cell(t, sc, "redis_cmds", 2) for t in targets]))
        rows.append(row("Redis read events per request (concurrent requests may share one)",
                        [cell(t, sc, "redis_reads", 2) for t in targets]))
        rows.append(row("the fleet's leases (open tasks) at the run's start (min–max)", [
            cell(t, sc, "open_leases", 0, True) for t in targets]))
        rows.append(row("errors (non-2xx + socket), all rounds", [
            fmt(sum(runs.get((t, sc, "errors"), []))) for t in targets]))
        rows.append(row("failed Redis calls (keyrelay_cluster_errors_total), all rounds", [
            "—" if t == "S" else fmt(sum(runs.get((t, sc, "cluster_errors"), [])))
            for t in targets]))

    seq = [(mode, f"cluster-seq-{mode}") for mode, _ in CLUSTER_REQUESTS]
    seq = [(mode, sc) for mode, sc in seq if tab.has(sc)]
    if seq and replicas:
        n = med(replicas[0], seq[0][1], "requests") or a.cluster_sequential
        rows.append(f"| **Redis round trips: {fmt(n)} requests one at a time (oha -c1), "
                    "the idle background subtracted** |" + blank)
        for mode, sc in seq:
            what = "GET submit" if mode == "get" else "poll of a pinned task"
            trips, own, commands = {}, {}, {}
            for t in replicas:
                mine = med(t, sc, "request_trips")
                if mine is not None:
                    own[t] = mine
                reads = med(t, sc, "redis_reads")
                if reads is None:
                    continue
                secs = med(t, sc, "seconds") or 0
                idle = med(t, sc, "idle_reads_per_s") or 0
                requests = med(t, sc, "requests") or 1
                trips[t] = max(reads - idle * secs / requests, 0.0)
                prefix = "redis_sent_"
                mix = sorted(((m[len(prefix):], v[0]) for (x, s, m), v in runs.items()
                              if x == t and s == sc and m.startswith(prefix)),
                             key=lambda kv: -kv[1])
                commands[t] = ", ".join(f"{v:.2f} {name.upper()}" for name, v in mix
                                        if v >= SENT_SHOWN) or "none"
            limit = CLUSTER_TRIPS_GOAL[mode]
            # The goal is read on keyrelay's own count of its request path's round trips:
            # the read events also hold whatever of the background the idle window did not
            # match (a heartbeat renewing thousands of leases), so they only cross-check it.
            if own:
                rows.append(row(f"round trips per {what}, as keyrelay counts its request "
                                "path's (keyrelay_cluster_round_trips_total, op acquire, "
                                "pin, lookup)", ["—"] + [
                                    f"{own[t]:.2f}" if t in own else "—" for t in replicas],
                                (), goal(f"≤ {limit}", own, lambda v: round(v, 2) <= limit)))
            rows.append(row(f"round trips per {what}, as Redis's read events count them "
                            "(the background's not all subtracted)", ["—"] + [
                f"{trips[t]:.2f}" if t in trips else "—" for t in replicas], (),
                "" if own else goal(f"≤ {limit}", trips, lambda v: round(v, 2) <= limit)))
            rows.append(row(f"commands keyrelay sent per {what} (MONITOR; "
                            f"below {SENT_SHOWN} left out)", ["—"] + [
                                commands.get(t, "—") for t in replicas]))
    return rows


def print_cluster(rows, runs, a, alone):
    targets = cluster_targets(runs)
    if not alone:
        print(f"- Rounds: {a.cluster_rounds} interleaved ({' '.join(targets)}) of "
              f"{a.cluster_duration} s per run, medians and (min–max) across rounds.")
    else:
        print("- A: nginx stub answering `OK|<a new task id>` to in.php and `CAPCHA_NOT_READY` "
              "to res.php.")
    print("- S: keyrelay (3 keys) to A with the shipped defaults, the durable pin journal "
          "included, a single instance of its own (not C, which has served far more); "
          "R: the same config plus `[cluster]` on a redis-server of its own on 127.0.0.1, "
          "without persistence (`--save \"\" --appendonly no`)"
          + ("; W: the same on a redis-server with `--appendonly yes --appendfsync everysec`"
             if "W" in targets else "")
          + ". Each Redis runs on the server core beside keyrelay. keyrelay's CPU and Redis's "
          "are each read from their processes' CPU clocks; Redis's commands (its scripts' "
          "own included) and read events from `INFO stats commandstats` before and after "
          "each run. The poll is of a task submitted through the same replica just before, "
          "so its pin is cached there. The stub never finishes a task, so every submit "
          "leaves an open task whose lease each heartbeat (every 5 s) renews until "
          "`stale_after` (5 min): Redis's work per request grows with the leases row. "
          "Goals: issue 14 §5, against S; the round trips are counted with one request at a "
          "time, where a read event is one round trip, and the commands keyrelay sent are "
          "read from MONITOR there.\n")
    print("| measurement | " + " | ".join(CLUSTER_NAMES[t] for t in targets) + " | "
          + " | ".join(f"{t} vs S" for t in targets[1:]) + " | goal |")
    print("| --- |" + " --: |" * (2 * len(targets) - 1) + " --- |")
    print("\n".join(rows))


def print_tls(rows, a, headline):
    negotiated = [line.strip() or "?" for line in a.negotiated.splitlines()] + ["?", "?"]
    if headline:
        print(f"- Rounds: {a.tls_rounds} interleaved ({' '.join(TLS_TARGETS)}) of "
              f"{a.tls_duration} s per run, medians and (min–max) across rounds.")
    print(f"- Negotiated (openssl s_client): N: {negotiated[0]}; K: {negotiated[1]}.")
    if not headline:
        print("- A: nginx stub answering `OK|<a new task id>`; B: nginx `proxy_pass` to A.")
    print("- N: nginx `ssl` (TLS 1.3 only) `proxy_pass` to A, as B; K: keyrelay's `[tls]` "
          "listener on the same certificate and key files (self-signed ECDSA P-256), a "
          "keyrelay of its own with the shipped defaults (3 keys, durable journal) plus "
          "`[tls]`; "
          f"F: the same keyrelay's forward proxy, `CONNECT {a.forward_host}:443` to its plain "
          "listener and TLS inside with a cached leaf from its local CA; P: the same "
          "keyrelay's plain listener. B and P are the plain references of TLS's share. "
          "oha runs with `--insecure` for every target; CPU is the server's own, not the "
          "stub's.\n")
    print("| measurement | " + " | ".join(TLS_NAMES[t] for t in TLS_TARGETS)
          + " | K vs N | F vs N | goal |")
    print("| --- |" + " --: |" * (len(TLS_TARGETS) + 2) + " --- |")
    print("\n".join(rows))


def headline_rows(runs, once, a):
    """The table of A B C (M D): closed loop, fixed rate, memory and startup."""
    tab = Table(runs)

    for mode, label in REQUESTS:
        goals = mode in GOALS
        connections = a.poll_connections if mode == "poll" else a.connections
        for c in connections.split():
            sc = f"{mode}-c{c}"
            if mode == "poll" and not tab.has(sc):
                continue
            tab.section(f"{label}, closed loop, wrk -t1 -c{c}")
            tab.metric_row(sc, "rps", "req/s", goal=1.0 if goals else None,
                           lower_is_better=False, with_spread=True)
            tab.metric_row(sc, "p50_us", "p50 µs")
            tab.metric_row(sc, "p99_us", "p99 µs")
            tab.metric_row(sc, "cpu_us", "server CPU µs/req", digits=1, with_spread=True)
            tab.errors_row(sc)

    for mode, label in REQUESTS:
        goals = mode in GOALS
        sc = f"open-{mode}-{a.rate}"
        if not tab.has(sc):
            sc = f"open-{a.rate}"  # raw figures from before POST had a fixed-rate run
            if mode != "get" or not tab.has(sc):
                continue
        tab.section(f"{label} at a fixed {a.rate:,} req/s, open loop, oha")
        tab.metric_row(sc, "rps", "req/s achieved")
        tab.metric_row(sc, "p50_us", "p50 µs")
        med = {t: tab.med(t, sc, "p50_us") for t in TARGETS}
        if all(v is not None for v in med.values()):
            added = {t: med[t] - med["A"] for t in TARGETS if t != "A"}
            tab.row("added p50 µs over A (the proxy hop)",
                    ["—"] + [fmt(added[t]) for t in TARGETS if t != "A"],
                    [f"{ratio(added[t], added['B']):.2f}×" for t in VERSUS],
                    f"≤ 1.0× {mark(added['C'] <= added['B'])}" if goals else "")
        tab.metric_row(sc, "p99_us", "p99 µs")
        tab.metric_row(sc, "p999_us", "p99.9 µs")
        tab.metric_row(sc, "cpu_us", "server CPU µs/req (min–max)", digits=1,
                       goal=1.15 if goals else None, with_range=True)
        tab.errors_row(sc)

    # The JSON task API's createTask (issue 39): keyrelay turns it into the POST /in.php
    # submit above, so its own POST is the reference, not nginx.
    create, post = f"open-create-{a.rate}", f"open-post-{a.rate}"
    if tab.has(create):
        tab.section(f"POST /createTask, the POST's image task as JSON, at a fixed "
                    f"{a.rate:,} req/s (keyrelay only)")
        cells, c_ratio = [], None
        for t in TARGETS:
            mine, theirs = tab.med(t, create, "cpu_us"), tab.med(t, post, "cpu_us")
            if mine is None or not theirs:
                cells.append("")
                continue
            cells.append(f"{fmt(mine, 1)} ({mine / theirs:.2f}× its POST)")
            if t == "C":
                c_ratio = mine / theirs
        goal = f"≤ 1.2× {mark(c_ratio <= 1.2)}" if c_ratio is not None else ""
        tab.row("server CPU µs/req", cells, (), goal)
        tab.errors_row(create)

    tab.section("keyrelay memory and startup")
    idle = once.get(("memory", "idle_rss_kb"))
    if idle is not None:
        mb = idle * 1024 / 1e6
        tab.row("idle RSS", ["", "", f"{mb:.1f} MB"], (), f"≤ 20 MB {mark(mb <= 20)}")
    loaded = once.get(("memory", "loaded_rss_kb"))
    if loaded is not None:
        tab.row("RSS after the load rounds", ["", "", f"{loaded * 1024 / 1e6:.1f} MB"])
    pins = once.get(("memory", "pins"))
    if pins:
        before = once[("memory", "pins_idle_rss_kb")]
        after = once[("memory", "pins_rss_kb")]
        per_pin = (after - before) * 1024 / pins
        secs = once.get(("memory", "pins_seconds"), 0)
        tab.row(f"RSS with {fmt(pins)} tasks pinned (reached in {secs:.0f} s)",
                ["", "", f"{after * 1024 / 1e6:.1f} MB"])
        tab.row("bytes per pinned task: (RSS − idle RSS) / pins", ["", "", fmt(per_pin)], (),
                f"≤ 100 {mark(per_pin <= 100)}")
        mark_pins = once.get(("memory", "pins_mark"), 0)
        if mark_pins and pins > mark_pins:
            marginal = (after - once[("memory", "pins_mark_rss_kb")]) * 1024 / (pins - mark_pins)
            tab.row(f"marginal bytes per pin, from {fmt(mark_pins)} to {fmt(pins)} pins",
                    ["", "", fmt(marginal)])
    healthz = once.get(("startup", "healthz_ms"))
    if healthz is not None:
        tab.row("exec → first /healthz answered", ["", "", f"{healthz:.1f} ms"], (),
                f"≤ 100 ms {mark(healthz <= 100)}")
    inphp = once.get(("startup", "inphp_ms"))
    if inphp is not None:
        tab.row("exec → first in.php relayed", ["", "", f"{inphp:.1f} ms"])
    return tab.rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("raw")
    p.add_argument("--command", required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--rate", type=int, required=True)
    p.add_argument("--connections", required=True)
    p.add_argument("--poll-connections", default="",
                   help="closed-loop connection counts of the poll runs")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--duration", type=int, required=True)
    p.add_argument("--open-rounds", type=int)
    p.add_argument("--open-duration", type=int)
    p.add_argument("--tls-rounds", type=int, default=0)
    p.add_argument("--tls-duration", type=int, default=0)
    p.add_argument("--handshake-rate", type=int, default=0)
    p.add_argument("--oha-connections", type=int, default=16)
    p.add_argument("--forward-host", default="ocr.captchaai.com")
    p.add_argument("--negotiated", default="", help="N's line, then K's, from openssl s_client")
    p.add_argument("--cluster-rounds", type=int, default=0)
    p.add_argument("--cluster-duration", type=int, default=0)
    p.add_argument("--cluster-sequential", type=int, default=0,
                   help="requests of each kind in the one-at-a-time round-trip count")
    p.add_argument("--server-cpu", required=True)
    p.add_argument("--client-cpu", required=True)
    p.add_argument("--versions", required=True)
    a = p.parse_args()
    runs, once = load(a.raw)
    tls_rows = tls_table(runs, a)
    cluster_rows = cluster_table(runs, a)
    own_tables = ("tls-", "cluster-")
    headline = any(not sc.startswith(own_tables) for (_, sc, _) in runs) or bool(once)
    global TARGETS, VERSUS
    present = {t for (t, sc, _) in runs if not sc.startswith(own_tables)}
    TARGETS = ("A", "B", "C") + tuple(t for t in ("M", "D") if t in present)
    VERSUS = tuple(t for t in TARGETS if t in ("C", "M", "D"))
    open_rounds = a.open_rounds or a.rounds
    open_duration = a.open_duration or a.duration
    rows = headline_rows(runs, once, a) if headline else []

    steal = [v for (t, sc, m), vs in runs.items() if m == "steal_pct" for v in vs]
    other = [v for (t, sc, m), vs in runs.items() if m == "other_pct" for v in vs]
    cpu_model = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break

    today = datetime.date.today().isoformat()
    if headline:
        print(f"### Results of {today}\n")
    else:
        print(f"### {'TLS' if tls_rows else 'Cluster'} results of {today}\n")
    print(f"- Machine: {os.cpu_count()} cores ({cpu_model}), Linux {platform.release()}; "
          f"servers pinned to core {a.server_cpu}, load generator to core {a.client_cpu}.")
    what = []
    if headline:
        what.append(f"{a.rounds} interleaved rounds ({' '.join(TARGETS)}) of {a.duration} s "
                    f"per closed-loop run and {open_rounds} of {open_duration} s per "
                    "fixed-rate run, medians")
    if tls_rows:
        spread = "" if headline else ", medians and (min–max) across rounds"
        what.append(f"{a.tls_rounds} interleaved rounds ({' '.join(TLS_TARGETS)}) of "
                    f"{a.tls_duration} s per TLS run{spread}")
    cluster_alone = bool(cluster_rows) and not headline and not tls_rows
    if cluster_rows:
        spread = ", medians and (min–max) across rounds" if cluster_alone else ""
        what.append(f"{a.cluster_rounds} interleaved rounds "
                    f"({' '.join(cluster_targets(runs))}) of {a.cluster_duration} s per "
                    f"cluster run{spread}")
    print(f"- Command: `{a.command}`: {'; '.join(what)}; the whole run took {a.seconds} s.")
    print(f"- Versions: {a.versions}.")
    if steal:
        print(f"- Steal time over the runs: median {statistics.median(steal):.2f} %, "
              f"max {max(steal):.2f} % of all CPU time.")
    if other:
        noisy = sum(v > 5 for v in other)
        print(f"- Other load (CPU used by anything but the servers and the load generator) "
              f"during the runs: median {statistics.median(other):.1f} %, max "
              f"{max(other):.1f} % of all CPU time; {noisy} of {len(other)} runs above 5 %.")
    if headline:
        print_headline(rows, runs)
    if tls_rows:
        if headline:
            print("\n#### TLS and the forward proxy\n")
        print_tls(tls_rows, a, headline)
    if cluster_rows:
        if not cluster_alone:
            print("\n#### Cluster mode: `[cluster]` on a local Redis\n")
        print_cluster(cluster_rows, runs, a, cluster_alone)


def print_headline(rows, runs):
    memory = ("; M: the same keyrelay with pins in memory (`[pins] durable = false`), so "
              "C − M is the journal's cost") if "M" in TARGETS else ""
    floor = ("; D: benches/passthrough.rs, hyper's server and client relaying to A "
             "unchanged, with none of keyrelay's work (the floor under C)") if "D" in TARGETS else ""
    polled = any(s.startswith(("poll-", "open-poll-")) for (_, s, _) in runs)
    poll_answer = " to in.php, `CAPCHA_NOT_READY` to res.php" if polled else ""
    print(f"- A: nginx stub answering `OK|<a new task id>`{poll_answer}; B: nginx `proxy_pass` to A; "
          "C: keyrelay (3 keys) to A with the shipped defaults, the durable pin journal "
          f"included{memory}{floor}. CPU is the server's own (A: the stub; "
          "the others: the proxy, not the stub behind it), read from each process's CPU "
          "clock before and after each run. ± is half the range across rounds; "
          "(min–max) the lowest and highest round.\n")
    names = {"A": "A: direct stub", "B": "B: nginx proxy_pass", "C": "C: keyrelay",
             "M": "M: keyrelay, pins in memory", "D": "D: hyper floor"}
    print("| measurement | " + " | ".join(names[t] for t in TARGETS) + " | "
          + " | ".join(f"{t} vs B" for t in VERSUS) + " | goal |")
    print("| --- |" + " --: |" * (len(TARGETS) + len(VERSUS)) + " --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
