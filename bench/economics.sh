#!/usr/bin/env bash
# bench/economics.sh: what the pool costs its users, not keyrelay's CPU (issue 40, §5).
# Against the simulator (tasks solved 10 to 30 s after their submit), in one process
# (examples/pool_economics.rs):
#   1. ECON_SCRIPTS scripts poll every second, submitting again once solved, for
#      ECON_DURATION seconds: through keyrelay with its default [polling] (shaped), then
#      with interval = "0s" (every poll relayed). Reported: upstream polls per solved task
#      (goal: mean solve time / interval + 1) and the latency shaping adds between the
#      service having the solution and the script getting it (goal: one interval, plus the
#      script's own second).
#   2. ECON_ABANDONED tasks submitted and never polled. Reported: thread-seconds keyrelay
#      counts each of them in use (goal: mean solve time + orphan_after + interval; before
#      orphan polling, [capacity] stale_after, 5 minutes).
# It counts requests and time, not instructions, so a dev build serves. The last line says
# whether every goal was met; the exit status is 0 either way.
#
# Knobs (environment): ECON_SCRIPTS=100 ECON_DURATION=60 ECON_SOLVE_MIN=10
# ECON_SOLVE_MAX=30 ECON_ABANDONED=50 ECON_ORPHAN_AFTER=30. A default run takes about four
# minutes; run it in the background with its output in a file:
#   timeout 900 bench/economics.sh > /tmp/economics.md 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --example pool_economics
