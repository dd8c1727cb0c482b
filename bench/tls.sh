#!/usr/bin/env bash
# bench/tls.sh: only the TLS rows of bench/run.sh (issue 13 §5): keyrelay's `[tls]` listener
# (K) and its forward proxy (`CONNECT`, F) against nginx `ssl` (N) in front of the same stub,
# with the plain references B and P; keep-alive CPU per request at BENCH_RATE and the
# handshake cost at BENCH_TLS_HANDSHAKE_RATE. It is `BENCH_TLS=only bench/run.sh`: the same
# knobs (bench/run.sh's header, bench/README.md), the table written to
# bench/results/latest-tls.md (BENCH_RESULTS) and the raw figures beside it.
#
#   bench/tls.sh                                          # 3 rounds of 10 s: about 6 minutes
#   BENCH_TLS_ROUNDS=2 BENCH_TLS_DURATION=5 bench/tls.sh  # about 2 minutes

set -euo pipefail

# Its knobs were TLS_BENCH_* when it was a script of its own: refused, not ignored.
old=$(compgen -v TLS_BENCH_ || true)
if [[ -n $old ]]; then
  echo "bench/tls.sh: ${old//$'\n'/, } set: the knobs are now bench/run.sh's (BENCH_TLS_ROUNDS," \
    "BENCH_TLS_DURATION, BENCH_RATE, BENCH_TLS_HANDSHAKE_RATE, BENCH_OHA_CONNECTIONS, ...)" >&2
  exit 2
fi
BENCH_TLS=only exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
