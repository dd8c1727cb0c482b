#!/usr/bin/env python3
"""Times keyrelay's start for bench/run.sh: exec to the first answered /healthz, and to the
first in.php relayed through the upstream.

A Python poller, not a curl loop: spawning curl costs milliseconds, which would blur a
figure of a few milliseconds. The poller runs on the client core, keyrelay on the server
core. Prints one result line per figure (the median of --runs starts), tab-separated as
bench/run.sh records them:  0  C  startup  healthz_ms  12.3
"""

import argparse
import http.client
import os
import re
import statistics
import subprocess
import sys
import time


# The stub's answer to a submit: a new numeric task id per request (see bench/run.sh).
SUBMIT_ANSWER = re.compile(r"OK\|[0-9]+")


def poll(port, path, want_body=None, deadline=10.0):
    """Seconds (perf_counter) at which GET path first answered 200 (with a body matching
    the regex want_body, if given), or None on timeout."""
    end = time.perf_counter() + deadline
    while time.perf_counter() < end:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace")
            if resp.status == 200 and (want_body is None or want_body.fullmatch(body)):
                return time.perf_counter()
        except OSError:
            pass  # not listening yet
        finally:
            conn.close()
        time.sleep(0.0002)
    return None


def one_start(args, cpu):
    # The child is pinned before exec; the clock starts right before the fork.
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [args.bin, "--config", args.config, "--log", "warn"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    try:
        healthz = poll(args.port, "/healthz")
        inphp = poll(args.port, "/in.php?" + args.query, want_body=SUBMIT_ANSWER)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if healthz is None or inphp is None:
        sys.exit(f"keyrelay did not answer within 10 s (exit code {proc.returncode})")
    return (healthz - t0) * 1000, (inphp - t0) * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    args = p.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    runs = [one_start(args, args.server_cpu) for _ in range(args.runs)]
    for h, i in runs:
        print(f"# start: /healthz after {h:.1f} ms, first in.php after {i:.1f} ms")
    print(f"0\tC\tstartup\thealthz_ms\t{statistics.median(r[0] for r in runs):.1f}")
    print(f"0\tC\tstartup\tinphp_ms\t{statistics.median(r[1] for r in runs):.1f}")


if __name__ == "__main__":
    main()
