#!/usr/bin/env bash
# keyrelay's proxy hop against nginx proxy_pass, side by side, on loopback only.
#
#   bench/run.sh                                  # defaults: 10 s per run, 3 rounds
#   BENCH_DURATION=5 BENCH_ROUNDS=3 bench/run.sh  # a quicker pass
#
# Five targets, all answering GET/POST /in.php with "OK|<id>", a new numeric task id per
# request, as the service gives (so that each submit pins a new task, not the same one
# again), and GET /res.php with "CAPCHA_NOT_READY", the usual answer to a poll:
#   A  nginx stub (`return 200`): the physical limit, no proxy at all;
#   B  nginx proxy_pass to A (upstream keepalive): the yardstick;
#   C  keyrelay (3 keys) with A as its upstream, the shipped defaults (durable pin journal);
#   M  the same keyrelay with pins in memory (`[pins] durable = false`): C - M is the journal;
#   D  benches/passthrough.rs: hyper's server and client relaying to A unchanged, with none
#      of keyrelay's work: the floor under C on this stack.
# Three requests (modes): get, a GET /in.php?...&json=1 submit; post, a POST /in.php
# urlencoded submit (bench/wrk.lua's body); poll, a GET
# /res.php?key=...&action=get&id=<id>&json=1. keyrelay relays a poll only for a task pinned
# to one of its keys, so before each poll run the script submits once through that same
# target and polls the id it was answered.
# Each measurement runs A B C M D, A B C M D, ... for BENCH_ROUNDS rounds (the fixed-rate
# runs for BENCH_OPEN_ROUNDS); the table shows medians and the spread across rounds.
#
# Then the TLS rows (issue 13 §5; BENCH_TLS=0 leaves them out), in front of the same stub A:
#   N  nginx `listen ... ssl` (TLS 1.3 only, nginx's TLS defaults otherwise) proxy_pass to
#      A as B does: the yardstick;
#   K  keyrelay's `[tls]` listener on the same certificate and key files (a self-signed
#      ECDSA P-256 one for localhost, made with openssl in the temp dir): a keyrelay of its
#      own, C's config (durable journal, 3 keys) plus `[tls]`, so that C stays the shipped
#      defaults;
#   F  the same keyrelay's forward proxy: `CONNECT ocr.captchaai.com:443` to its plain
#      listener, then the requests over TLS inside, with the leaf its local CA issues for
#      that host (once, then cached);
#   P  the same keyrelay's plain listener, and B again: the plain references TLS's own share
#      is read against (N - B, K - P, F - P). Not C: by then C has served millions of
#      submits and holds a full pin table, K and P as few as each other.
# Two measurements, B P N K F in turn for BENCH_TLS_ROUNDS rounds: keepalive, the GET
# submit at BENCH_RATE with keep-alive (CPU per request once the connections are up);
# handshake, the same at BENCH_TLS_HANDSHAKE_RATE with --disable-keepalive, a new TCP
# connection and TLS handshake per request (for F a new CONNECT too). oha (rustls) runs
# with --insecure for every target: the client's work is not measured anyway.
# bench/tls.sh runs these rows alone (BENCH_TLS=only).
#
# Then the cluster rows (issue 14 §5; BENCH_CLUSTER=0 leaves them out), in front of the same
# stub A, each keyrelay with C's config (3 keys, durable journal):
#   S  a single-instance keyrelay of its own: the reference, not C, for the reason P is;
#   R  a keyrelay with `[cluster]` on a redis-server of its own on 127.0.0.1 without
#      persistence (`--save "" --appendonly no`): the least Redis can cost;
#   W  the same on a redis-server with `--appendonly yes --appendfsync everysec`, the
#      persistence docs/cluster.md asks for (BENCH_CLUSTER_AOF=0 leaves it out).
# Each Redis runs on the server core beside keyrelay, and its CPU is counted apart from
# keyrelay's. S R W in turn for BENCH_CLUSTER_ROUNDS rounds: the GET submit and the poll
# (of a task submitted through the same target) at BENCH_RATE, as C's fixed-rate rows, with
# each Redis's commands and read events per request from `INFO stats commandstats` before
# and after; and once, before the rounds, BENCH_CLUSTER_SEQUENTIAL submits and as many polls
# one at a time (oha -c1), where keyrelay's own count of its request path's round trips
# (keyrelay_cluster_round_trips_total, op acquire, pin, lookup) is read before and after,
# and Redis's read events cross-check it (a read event is a round trip). Each replica must be in
# shared mode (keyrelay_cluster_up 1) before the rounds.
# See bench/README.md for what is measured and docs/performance.md for how to read it.
#
# Knobs (environment):
#   BENCH_DURATION=10       seconds per closed-loop run (wrk)
#   BENCH_ROUNDS=3          interleaved closed-loop rounds (A B C M D each), medians reported
#   BENCH_CONNECTIONS="16 64"  closed-loop connection counts (get and post)
#   BENCH_POLL_CONNECTIONS=16  closed-loop connection counts for poll ("" for none); the
#                           fixed-rate runs poll in every round
#   BENCH_RATE=2000         open-loop request rate (req/s), the TLS keepalive runs' too
#   BENCH_OHA_CONNECTIONS=16  oha connections for the open loop and the TLS runs
#   BENCH_OPEN_ROUNDS=5     rounds of the fixed-rate runs (get, post, poll each), medians
#   BENCH_OPEN_DURATION=20  seconds per fixed-rate run
#   BENCH_WARMUP=2          seconds of warm-up load per target (get, then post) before round 1,
#                           and per TLS target and measurement before the TLS rounds
#   BENCH_SKIP_PINS=0       1 skips the 1M-pin memory step
#   BENCH_PINS=1000000      pins to reach in the memory step
#   BENCH_PINS_TIMEOUT=300  seconds the memory step may take at most
#   BENCH_STARTUP_RUNS=5    keyrelay starts timed for the startup figure
#   BENCH_TLS=1             1: the TLS rows too; 0: without them; only: the TLS rows alone
#                           (with A and B), as bench/tls.sh runs them
#   BENCH_TLS_ROUNDS=3      interleaved rounds of the TLS runs (B P N K F each)
#   BENCH_TLS_DURATION=10   seconds per TLS run
#   BENCH_TLS_HANDSHAKE_RATE=200  new connections (= requests) per second, handshake runs
#   BENCH_CLUSTER=1         1: the cluster rows too; 0: without them; only: the cluster rows
#                           alone (with A and B)
#   BENCH_CLUSTER_ROUNDS=3  interleaved rounds of the cluster runs (S R W each)
#   BENCH_CLUSTER_DURATION=10  seconds per cluster run
#   BENCH_CLUSTER_AOF=1     0 leaves out W, the keyrelay on a Redis with AOF
#   BENCH_CLUSTER_SEQUENTIAL=500  requests of each kind in the one-at-a-time round-trip count
#   BENCH_SERVER_CPU=0      core for the servers (stub nginx, proxy under test)
#   BENCH_CLIENT_CPU=1      core for the load generator
#   BENCH_MAX_RUNTIME=3600  seconds after which the whole run is stopped (build excluded)
#   BENCH_RESULTS=bench/results/latest.md  where the table is written (with BENCH_TLS=only,
#                           bench/results/latest-tls.md; BENCH_CLUSTER=only, latest-cluster.md)
#   BENCH_OHA_VERSION=1.16.0  oha version installed when oha is missing
#   KEYRELAY_BIN=path       use this binary instead of `cargo build --release`
#   PASSTHROUGH_BIN=path    use this build of benches/passthrough.rs (target D)
#   CARGO_TARGET_DIR        honoured by the build
#
# It listens on 127.0.0.1 only, on free ports, stops every process it started and removes
# its temp dir on any exit (normal, error, Ctrl-C, SIGTERM). Missing tools are installed:
# nginx, wrk, openssl, redis-server, redis-tools (and curl, python3, util-linux, procps)
# with apt-get, oha with `cargo install --locked` into bench/.tools, once. bench/lib.sh
# holds those helpers.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")
# shellcheck source=SCRIPTDIR/lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${BENCH_DURATION:-10}
ROUNDS=${BENCH_ROUNDS:-3}
CONNECTIONS=${BENCH_CONNECTIONS:-16 64}
POLL_CONNECTIONS=${BENCH_POLL_CONNECTIONS-16}
RATE=${BENCH_RATE:-2000}
OHA_CONNECTIONS=${BENCH_OHA_CONNECTIONS:-16}
OPEN_ROUNDS=${BENCH_OPEN_ROUNDS:-5}
OPEN_DURATION=${BENCH_OPEN_DURATION:-20}
WARMUP=${BENCH_WARMUP:-2}
SKIP_PINS=${BENCH_SKIP_PINS:-0}
PINS=${BENCH_PINS:-1000000}
PINS_TIMEOUT=${BENCH_PINS_TIMEOUT:-300}
STARTUP_RUNS=${BENCH_STARTUP_RUNS:-5}
TLS=${BENCH_TLS:-1}
TLS_ROUNDS=${BENCH_TLS_ROUNDS:-3}
TLS_DURATION=${BENCH_TLS_DURATION:-10}
TLS_HANDSHAKE_RATE=${BENCH_TLS_HANDSHAKE_RATE:-200}
CLUSTER=${BENCH_CLUSTER:-1}
CLUSTER_ROUNDS=${BENCH_CLUSTER_ROUNDS:-3}
CLUSTER_DURATION=${BENCH_CLUSTER_DURATION:-10}
CLUSTER_AOF=${BENCH_CLUSTER_AOF:-1}
CLUSTER_SEQUENTIAL=${BENCH_CLUSTER_SEQUENTIAL:-500}
SERVER_CPU=${BENCH_SERVER_CPU:-0}
CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
MAX_RUNTIME=${BENCH_MAX_RUNTIME:-3600}
if [[ $TLS == only ]]; then RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/latest-tls.md}
elif [[ $CLUSTER == only ]]; then RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/latest-cluster.md}
else RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/latest.md}
fi
# One of the three groups of rows alone: the plain headline rows (A B C M D, startup,
# memory) run unless BENCH_TLS or BENCH_CLUSTER is only; the other two unless 0 or the other
# one is only.
HEADLINE=1
[[ $TLS != only && $CLUSTER != only ]] || HEADLINE=0
[[ $CLUSTER != only ]] || TLS=0
[[ $TLS != only ]] || CLUSTER=0
OHA_VERSION=${BENCH_OHA_VERSION:-1.16.0}

# The pool: three fake 32-character keys. The key a client sends is replaced by keyrelay,
# so the load generator sends yet another one.
POOL_KEYS=(benchkey000000000000000000000001 benchkey000000000000000000000002
           benchkey000000000000000000000003)
CLIENT_KEY=0123456789abcdef0123456789abcdef
GET_QUERY="key=$CLIENT_KEY&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https%3A%2F%2Fexample.com%2Flogin&json=1"
TARGETS=(A B C M D)
((HEADLINE)) || TARGETS=(A B)
TLS_TARGETS=(B P N K F)
CLUSTER_TARGETS=(S R W)
# The host F's CONNECT names, one keyrelay intercepts by default (`[forward] intercept`),
# so the pool serves what comes through the tunnel.
FORWARD_HOST=ocr.captchaai.com

check_knobs() {
  local name
  for name in DURATION ROUNDS RATE OHA_CONNECTIONS OPEN_ROUNDS OPEN_DURATION WARMUP PINS \
    PINS_TIMEOUT STARTUP_RUNS TLS_ROUNDS TLS_DURATION TLS_HANDSHAKE_RATE CLUSTER_ROUNDS \
    CLUSTER_DURATION CLUSTER_SEQUENTIAL SERVER_CPU CLIENT_CPU MAX_RUNTIME; do
    [[ ${!name} =~ ^[0-9]+$ ]] || die "BENCH_$name must be a whole number, got '${!name}'"
  done
  ((DURATION > 0 && ROUNDS > 0 && RATE > 0 && STARTUP_RUNS > 0 && OPEN_ROUNDS > 0 &&
    OPEN_DURATION > 0 && TLS_ROUNDS > 0 && TLS_DURATION > 0 && TLS_HANDSHAKE_RATE > 0 &&
    CLUSTER_ROUNDS > 0 && CLUSTER_DURATION > 0 && CLUSTER_SEQUENTIAL > 0)) ||
    die "BENCH_DURATION, BENCH_ROUNDS, BENCH_OPEN_ROUNDS, BENCH_OPEN_DURATION, BENCH_RATE," \
      "BENCH_STARTUP_RUNS, BENCH_TLS_ROUNDS, BENCH_TLS_DURATION, BENCH_TLS_HANDSHAKE_RATE," \
      "BENCH_CLUSTER_ROUNDS, BENCH_CLUSTER_DURATION and BENCH_CLUSTER_SEQUENTIAL must be > 0"
  [[ $CONNECTIONS =~ ^[0-9]+( [0-9]+)*$ ]] ||
    die "BENCH_CONNECTIONS must be numbers separated by spaces, got '$CONNECTIONS'"
  [[ -z $POLL_CONNECTIONS || $POLL_CONNECTIONS =~ ^[0-9]+( [0-9]+)*$ ]] ||
    die "BENCH_POLL_CONNECTIONS must be numbers separated by spaces (or empty)," \
      "got '$POLL_CONNECTIONS'"
  [[ $SKIP_PINS == [01] ]] || die "BENCH_SKIP_PINS must be 0 or 1, got '$SKIP_PINS'"
  [[ ${BENCH_TLS:-1} == [01] || ${BENCH_TLS:-1} == only ]] ||
    die "BENCH_TLS must be 0, 1 or only, got '${BENCH_TLS:-}'"
  [[ ${BENCH_CLUSTER:-1} == [01] || ${BENCH_CLUSTER:-1} == only ]] ||
    die "BENCH_CLUSTER must be 0, 1 or only, got '${BENCH_CLUSTER:-}'"
  [[ ${BENCH_TLS:-1} != only || ${BENCH_CLUSTER:-1} != only ]] ||
    die "BENCH_TLS=only and BENCH_CLUSTER=only exclude each other"
  [[ $CLUSTER_AOF == [01] ]] || die "BENCH_CLUSTER_AOF must be 0 or 1, got '$CLUSTER_AOF'"
}

# --- tools ------------------------------------------------------------------------------

FLOOR_BIN=""

# D, the floor: benches/passthrough.rs, keyrelay's hyper server and upstream client with
# none of keyrelay's work.
build_floor() {
  if [[ -n ${PASSTHROUGH_BIN:-} ]]; then
    FLOOR_BIN=$PASSTHROUGH_BIN
  else
    log "cargo build --release --bench passthrough"
    FLOOR_BIN=$("$BENCH_DIR/passthrough-bin.sh")
  fi
  [[ -x $FLOOR_BIN ]] || die "no passthrough binary at ${FLOOR_BIN:-?}"
}

# --- measurement helpers ----------------------------------------------------------------

# server_cpu TARGET: "<target's CPU ns> <all servers' CPU ns>" (each process group once:
# some targets share one), and for a cluster target a third figure, its Redis's CPU ns.
server_cpu() {
  local ns pg groups=() sum=0 i redis=()
  local -A seen=()
  for pg in "${PG[@]}"; do
    [[ -n ${seen[$pg]:-} ]] || groups+=("$pg")
    seen[$pg]=1
  done
  [[ -z ${REDIS_PG[$1]:-} ]] || redis=("${REDIS_PG[$1]}")
  read -r -a ns <<<"$(cpu_ns "${PG[$1]}" "${groups[@]}" "${redis[@]}")"
  for ((i = 1; i <= ${#groups[@]}; i++)); do sum=$((sum + ns[i])); done
  echo "${ns[0]} $sum ${redis:+${ns[-1]}}"
}

# expect_stub_answer URL WHAT: one request through a target must give the stub's answer.
expect_stub_answer() {
  local body
  body=$(curl -sf --max-time 2 "$1") || die "$2: request failed: $1"
  [[ $body =~ $STUB_ANSWER_RE ]] || die "$2: unexpected answer ${body:0:80}"
}

# expect_stub_post URL WHAT: the POST submit through a target must give the stub's answer.
expect_stub_post() {
  local body
  body=$(curl -sf --max-time 2 -H "Content-Type: $POST_TYPE" --data-binary "$POST_BODY" "$1") ||
    die "$2: POST failed: $1"
  [[ $body =~ $STUB_ANSWER_RE ]] || die "$2: unexpected answer to the POST ${body:0:80}"
}

# poll_url TARGET: sets POLL_URL to a res.php poll of a task TARGET knows. keyrelay relays a
# poll only for a task pinned to one of its keys (an unknown id is answered locally or
# probed, another path), so this submits once through TARGET, as expect_stub_answer does,
# and polls the id of its "OK|<id>"; one poll through TARGET must give the stub's answer.
# Through keyrelay (C, M, S, R, W) that poll must also have found the task's pin: a probe
# counts in keyrelay_probes_total. keyrelay's default [polling] answers a poll this soon
# after the submit itself (CAPCHA_NOT_READY, docs/polling.md), as it answers a script that
# polls faster than every 5 s: keyrelay's poll rows measure that shaped answer, the stub's
# and nginx's a relayed one. A fresh task for every poll run: the other runs' submits,
# hundreds of thousands each, would evict an older pin (max_pins).
POLL_URL=""
poll_url() {
  local t=$1 body url headers=$TMP/poll.headers probes="" after
  body=$(curl -sf --max-time 2 "${URL[$t]}/in.php?$GET_QUERY") ||
    die "target $t: the submit before the poll failed: ${URL[$t]}/in.php?$GET_QUERY"
  [[ $body =~ $STUB_ANSWER_RE ]] ||
    die "target $t: unexpected answer to the submit before the poll: ${body:0:80}"
  url="${URL[$t]}/res.php?key=$CLIENT_KEY&action=get&id=${body#OK|}&json=1"
  [[ $t != [CMSRW] ]] || probes=$(probes_total "$t")
  body=$(curl -sf --max-time 2 -D "$headers" "$url") || die "target $t: poll failed: $url"
  [[ $body == "$STUB_POLL_ANSWER" || ($t == [CMSRW] && $body == *'"request":"CAPCHA_NOT_READY"'*) ]] ||
    die "target $t: the poll answered '${body:0:80}', not $STUB_POLL_ANSWER: $url"
  if [[ $t == [CMSRW] ]]; then
    after=$(probes_total "$t")
    [[ $after == "$probes" ]] ||
      die "target $t: the poll's task had no pin (keyrelay probed for it): $url"
  fi
  POLL_URL=$url
}

# metric_total TARGET METRIC: keyrelay's METRIC from /metrics, all its series summed.
metric_total() {
  curl -sf --max-time 2 "${URL[$1]}/metrics" |
    awk -v m="$2" 'index($1, m) == 1 && substr($1, length(m) + 1, 1) ~ /^[{]?$/ { n += $2 }
      END { printf "%d\n", n }' ||
    die "target $1: no /metrics"
}

# request_trips TARGET: the Redis round trips keyrelay made on its request path (its
# keyrelay_cluster_round_trips_total of the ops acquire, pin and lookup), which no
# background call (sync, heartbeat, renewal, release) is counted in.
request_trips() {
  curl -sf --max-time 2 "${URL[$1]}/metrics" |
    awk '$1 ~ /^keyrelay_cluster_round_trips_total[{]op="(acquire|pin|lookup)"[}]$/ { n += $2 }
      END { printf "%d\n", n }' ||
    die "target $1: no /metrics"
}

# probes_total TARGET: keyrelay's keyrelay_probes_total, all results summed.
probes_total() { metric_total "$1" keyrelay_probes_total; }

# The POST submit of bench/wrk.lua, so that wrk and oha send the same bytes: its string
# literals, joined.
POST_TYPE=application/x-www-form-urlencoded
POST_BODY=$(python3 - "$BENCH_DIR/wrk.lua" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
expr = src.split("local post_body =", 1)[1].split("\n\n", 1)[0]
print("".join(re.findall(r'"([^"]*)"', expr)))
EOF
)
((${#POST_BODY} == 219)) || { echo "bench/wrk.lua's POST body is not 219 bytes: ${#POST_BODY}" >&2; exit 1; }
# The same task as the JSON task API's createTask (bench/wrk.lua's create body).
CREATE_BODY=$(python3 - "$BENCH_DIR/wrk.lua" <<'EOF'
import json, re, sys
src = open(sys.argv[1]).read()
expr = src.split("local create_body =", 1)[1].split("\n\n", 1)[0]
body = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', expr)).replace('\\"', '"')
json.loads(body)
print(body)
EOF
)

TICK_NS=$((1000000000 / $(getconf CLK_TCK)))

# run_stats T0 T1 MACHINE0 MACHINE1 REQUESTS: the per-run figures shared by wrk and oha,
# as "metric value" lines: server CPU per request, steal %, other load %; and with the third
# figure of server_cpu (a cluster target's Redis), Redis's CPU per request.
run_stats() {
  awk -v t0="$1" -v t1="$2" -v m0="$3" -v m1="$4" -v n="$5" -v tick="$TICK_NS" 'BEGIN {
    split(t0, a, " "); split(t1, b, " "); split(m0, x, " "); split(m1, y, " ")
    if (n == 0) n = 1
    total = (y[1] - x[1]) * tick; if (total == 0) total = 1
    other = (y[3] - x[3]) * tick - (b[2] - a[2]) - (y[4] - x[4]) * tick
    if (other < 0) other = 0
    printf "cpu_us %.2f\nsteal_pct %.2f\nother_pct %.1f\n",
      (b[1] - a[1]) / 1e3 / n, (y[2] - x[2]) * tick * 100 / total, other * 100 / total
    if (3 in a && 3 in b) printf "redis_cpu_us %.2f\n", (b[3] - a[3]) / 1e3 / n
  }'
}

RAW="" # results, one per line: round target scenario metric value

record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RAW"; }

# --- servers ----------------------------------------------------------------------------

declare -A PG=()   # target -> process group whose CPU is charged to it
declare -A URL=()  # target -> base URL
# target -> curl's and oha's options for it (TLS targets: --insecure, F's proxy), as words
declare -A CURL_ARGS=() OHA_ARGS=()
PORT_A="" PORT_B="" PORT_C="" PORT_M="" PORT_D="" PORT_SIM="" PORT_PINS="" PORT_START=""
PORT_N="" PORT_P="" PORT_K="" PORT_S="" PORT_R="" PORT_W="" PORT_REDIS_R="" PORT_REDIS_W=""
# cluster target -> its Redis's process group and port
declare -A REDIS_PG=() REDIS_PORT=()
TLS_INFO="" # what N and K negotiate, from openssl s_client

# keyrelay_conf FILE LISTEN-PORT UPSTREAM-PORT PINS [TLS-PORT]: PINS is "durable" for the
# shipped default (the pin journal, in a data_dir of the config's own in the temp dir) or
# "memory" for `[pins] durable = false`; TLS-PORT adds a `[tls]` listener on make_cert's
# files. Every other setting is left at its default.
keyrelay_conf() {
  {
    printf 'listen = "127.0.0.1:%s"\nupstream = "http://127.0.0.1:%s"\n' "$2" "$3"
    [[ $4 == durable ]] && printf 'data_dir = "%s"\n' "${1%.toml}.data"
    local i=0 k
    for k in "${POOL_KEYS[@]}"; do
      i=$((i + 1))
      printf '\n[[keys]]\nname = "bench-%s"\nkey = "%s"\n' "$i" "$k"
    done
    [[ $4 == durable ]] || printf '\n[pins]\ndurable = false\n'
    [[ -z ${5:-} ]] || printf '\n[tls]\nlisten = "127.0.0.1:%s"\ncert = "%s"\nkey = "%s"\n' \
      "$5" "$TMP/cert.pem" "$TMP/key.pem"
  } >"$1"
}

# cluster_conf FILE REDIS-PORT REPLICA: appends a `[cluster]` table on the Redis at
# 127.0.0.1:REDIS-PORT to the config keyrelay_conf wrote; its other settings at their
# defaults (heartbeat every 5 s, sync every 500 ms, 250 ms per call).
cluster_conf() {
  printf '\n[cluster]\nredis = "redis://127.0.0.1:%s/0"\nreplica = "%s"\n' "$2" "$3" >>"$1"
}

start_keyrelay() { # NAME CONFIG PORT
  start_bg "$TMP/$1.log" taskset -c "$SERVER_CPU" "$BIN" --config "$2" --log warn
  wait_http "$LAST_PID" "$1" "http://127.0.0.1:$3/healthz"
}

# A, B, and with the headline rows C, M and D.
start_targets() {
  read -r PORT_A PORT_B PORT_C PORT_M PORT_D PORT_SIM PORT_PINS PORT_START PORT_N PORT_P \
    PORT_K PORT_S PORT_R PORT_W PORT_REDIS_R PORT_REDIS_W <<<"$(free_ports 16)"

  nginx_conf stub "$(stub_server "$PORT_A")"
  start_nginx stub "http://127.0.0.1:$PORT_A/healthz"
  PG[A]=$LAST_PID URL[A]=http://127.0.0.1:$PORT_A

  nginx_conf proxy "$(proxy_server "$PORT_A" "    listen 127.0.0.1:$PORT_B;")"
  start_nginx proxy "http://127.0.0.1:$PORT_B/healthz"
  PG[B]=$LAST_PID URL[B]=http://127.0.0.1:$PORT_B

  if ((HEADLINE)); then
    keyrelay_conf "$TMP/proxy.toml" "$PORT_C" "$PORT_A" durable
    start_keyrelay keyrelay "$TMP/proxy.toml" "$PORT_C"
    PG[C]=$LAST_PID URL[C]=http://127.0.0.1:$PORT_C
    # Idle RSS: after startup and its first balance refresh, before any load.
    sleep 2
    record 0 C memory idle_rss_kb "$(rss_kb "${PG[C]}")"

    keyrelay_conf "$TMP/memory.toml" "$PORT_M" "$PORT_A" memory
    start_keyrelay keyrelay-memory "$TMP/memory.toml" "$PORT_M"
    PG[M]=$LAST_PID URL[M]=http://127.0.0.1:$PORT_M

    start_bg "$TMP/passthrough.log" taskset -c "$SERVER_CPU" "$FLOOR_BIN" \
      --serve "127.0.0.1:$PORT_D" "http://127.0.0.1:$PORT_A"
    # It relays every path, so /healthz is the stub's answer.
    wait_http "$LAST_PID" passthrough "http://127.0.0.1:$PORT_D/healthz"
    PG[D]=$LAST_PID URL[D]=http://127.0.0.1:$PORT_D
  fi

  local t
  for t in "${TARGETS[@]}"; do
    expect_stub_answer "${URL[$t]}/in.php?$GET_QUERY" "target $t"
    expect_stub_post "${URL[$t]}/in.php" "target $t"
    poll_url "$t"
  done
  local up="A stub :$PORT_A  B nginx :$PORT_B"
  ((!HEADLINE)) ||
    up+="  C keyrelay :$PORT_C  M keyrelay (pins in memory) :$PORT_M  D passthrough :$PORT_D"
  log "targets up: $up (servers on core $SERVER_CPU, load on core $CLIENT_CPU)"
}

# N, and K, P and F in one keyrelay; B is start_targets'. They are started with the others,
# so that a TLS listener that does not come up stops the run before its 40 minutes, not after.
start_tls_targets() {
  make_cert
  # nginx's TLS defaults otherwise: session tickets on, no shared session cache.
  nginx_conf tls "$(proxy_server "$PORT_A" "    listen 127.0.0.1:$PORT_N ssl;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;")"
  start_nginx tls -k "https://localhost:$PORT_N/healthz"
  PG[N]=$LAST_PID URL[N]=https://localhost:$PORT_N CURL_ARGS[N]=-k OHA_ARGS[N]=--insecure

  # The local CA that signs F's leaves is made in data_dir at start.
  keyrelay_conf "$TMP/tls.toml" "$PORT_P" "$PORT_A" durable "$PORT_K"
  start_keyrelay keyrelay-tls "$TMP/tls.toml" "$PORT_P"
  wait_http "$LAST_PID" keyrelay-tls -k "https://localhost:$PORT_K/healthz"
  PG[P]=$LAST_PID PG[K]=$LAST_PID PG[F]=$LAST_PID
  URL[P]=http://127.0.0.1:$PORT_P
  URL[K]=https://localhost:$PORT_K CURL_ARGS[K]=-k OHA_ARGS[K]=--insecure
  URL[F]=https://$FORWARD_HOST
  CURL_ARGS[F]="-k -x http://127.0.0.1:$PORT_P"
  # No DNS lookup of the target host: the proxy is dialled, never the host.
  OHA_ARGS[F]="--insecure -x http://127.0.0.1:$PORT_P --no-pre-lookup"

  # Each answers the stub's answer, and through keyrelay (P, K, F) from its pool: an answer
  # F's tunnel had taken somewhere else would carry no X-Keyrelay-Key.
  local t body args
  for t in "${TLS_TARGETS[@]}"; do
    read -r -a args <<<"${CURL_ARGS[$t]:-}"
    body=$(curl -sf --max-time 3 -D "$TMP/tls.headers" "${args[@]}" \
      "${URL[$t]}/in.php?$GET_QUERY") || die "target $t: request failed: ${URL[$t]}/in.php"
    [[ $body =~ $STUB_ANSWER_RE ]] || die "target $t: unexpected answer ${body:0:80}"
    [[ $t != [PKF] ]] || grep -qi '^x-keyrelay-key: bench-' "$TMP/tls.headers" ||
      die "target $t: the answer carries no X-Keyrelay-Key; not served by the pool"
  done
  local port
  for port in "$PORT_N" "$PORT_K"; do
    TLS_INFO+="$(openssl s_client -connect "127.0.0.1:$port" -servername localhost -brief \
      </dev/null 2>&1 | awk -F': *' '/^Protocol version|^Ciphersuite/ { printf "%s ", $2 }')"$'\n'
  done
  log "TLS targets up: N nginx ssl :$PORT_N  K keyrelay tls :$PORT_K  P its plain listener" \
    ":$PORT_P  F CONNECT $FORWARD_HOST:443 via :$PORT_P"
  log "negotiated (openssl s_client): N: ${TLS_INFO%%$'\n'*}  K: $(sed -n 2p <<<"$TLS_INFO")"
}

# wait_shared TARGET: bounded wait (20 s) until the replica is in shared mode
# (keyrelay_cluster_up 1): its first heartbeat has reached Redis.
wait_shared() {
  local _
  for _ in $(seq 200); do
    (($(metric_total "$1" keyrelay_cluster_up) == 1)) && return 0
    sleep 0.1
  done
  die "target $1: not in shared mode after 20 s (log: $(tail -3 "$TMP/keyrelay-cluster-$1.log"))"
}

# S, and R and W each with a Redis of its own. Started with the others, as the TLS targets
# are, so that a replica that never reaches Redis stops the run at its start.
start_cluster_targets() {
  keyrelay_conf "$TMP/single.toml" "$PORT_S" "$PORT_A" durable
  start_keyrelay keyrelay-single "$TMP/single.toml" "$PORT_S"
  PG[S]=$LAST_PID URL[S]=http://127.0.0.1:$PORT_S
  local t port redis_port persistence
  for t in "${CLUSTER_TARGETS[@]:1}"; do
    case $t in
      R) port=$PORT_R redis_port=$PORT_REDIS_R persistence=none ;;
      W) port=$PORT_W redis_port=$PORT_REDIS_W persistence=aof ;;
    esac
    start_redis "$t" "$redis_port" "$persistence"
    # Counted among the servers (other load), and as the target's Redis.
    PG[redis-$t]=$LAST_PID REDIS_PG[$t]=$LAST_PID REDIS_PORT[$t]=$redis_port
    keyrelay_conf "$TMP/cluster-$t.toml" "$port" "$PORT_A" durable
    cluster_conf "$TMP/cluster-$t.toml" "$redis_port" "bench-$t"
    start_keyrelay "keyrelay-cluster-$t" "$TMP/cluster-$t.toml" "$port"
    PG[$t]=$LAST_PID URL[$t]=http://127.0.0.1:$port
    # Before any request: one admitted before the first heartbeat would be admitted alone,
    # and the replica would then stay on its share for one more renewal period.
    wait_shared "$t"
  done
  for t in "${CLUSTER_TARGETS[@]}"; do
    expect_stub_answer "${URL[$t]}/in.php?$GET_QUERY" "target $t"
    poll_url "$t"
  done
  local up="S keyrelay :$PORT_S  R keyrelay [cluster] :$PORT_R on redis :$PORT_REDIS_R (no persistence)"
  [[ $CLUSTER_AOF == 0 ]] || up+="  W keyrelay [cluster] :$PORT_W on redis :$PORT_REDIS_W (AOF everysec)"
  log "cluster targets up: $up"
}

# --- closed loop: wrk -------------------------------------------------------------------

# save_run ROUND TARGET SCENARIO: records the "metric value" lines on stdin and prints a
# progress line.
save_run() {
  local metric value p999=""
  local -A m=()
  while read -r metric value; do
    record "$1" "$2" "$3" "$metric" "$value"
    m[$metric]=$value
  done
  [[ -z ${m[p999_us]:-} ]] || p999=$(printf '  p99.9 %6.0f µs' "${m[p999_us]}")
  [[ -z ${m[redis_cpu_us]:-} ]] ||
    p999+=$(printf '  redis %5.2f µs/req, %.2f commands, %.2f reads/req, %s leases at start, %s call errors' \
      "${m[redis_cpu_us]}" "${m[redis_cmds]}" "${m[redis_reads]}" "${m[open_leases]}" \
      "${m[cluster_errors]}")
  printf '  %-9s %s %8.0f req/s  p50 %5.0f µs  p99 %6.0f µs%s  cpu %6.2f µs/req  errors %s  steal %.1f%%  other load %.1f%%\n' \
    "$3" "$2" "${m[rps]}" "${m[p50_us]}" "${m[p99_us]}" "$p999" "${m[cpu_us]}" \
    "${m[errors]}" "${m[steal_pct]}" "${m[other_pct]}" >&2
}

# run_wrk ROUND TARGET MODE(get|post|poll) CONNECTIONS SECONDS: one wrk run; ROUND 0 is
# warm-up, not kept.
run_wrk() {
  local round=$1 t=$2 mode=$3 conns=$4 secs=$5 out=$TMP/wrk.out
  local cpu0 cpu1 m0 m1 url="${URL[$t]}/in.php?$GET_QUERY" wrk_mode=$3
  # wrk.lua's get sends the URL as given: for poll, a res.php URL.
  if [[ $mode == poll ]]; then
    poll_url "$t"
    url=$POLL_URL wrk_mode=get
  fi
  cpu0=$(server_cpu "$t")
  m0=$(machine_now)
  run_fg "$out" timeout $((secs + 30)) taskset -c "$CLIENT_CPU" \
    wrk -t1 -c"$conns" -d"${secs}s" --timeout 5s -s "$BENCH_DIR/wrk.lua" \
    "$url" -- "$wrk_mode" || die "wrk failed: $(tail -3 "$out")"
  m1=$(machine_now)
  cpu1=$(server_cpu "$t")
  ((round > 0)) || return 0
  local line kv
  local -A v=()
  line=$(grep '^BENCH ' "$out") || die "no BENCH line from wrk: $(tail -3 "$out")"
  for kv in ${line#BENCH }; do v[${kv%%=*}]=${kv#*=}; done
  {
    awk -v n="${v[requests]}" -v us="${v[duration_us]}" 'BEGIN { printf "rps %.1f\n", n * 1e6 / us }'
    echo "p50_us ${v[p50_us]}"
    echo "p99_us ${v[p99_us]}"
    echo "errors $((v[connect] + v[read] + v[write] + v[status] + v[timeout]))"
    run_stats "$cpu0" "$cpu1" "$m0" "$m1" "${v[requests]}"
  } | save_run "$round" "$t" "$mode-c$conns"
}

# --- open loop: oha ---------------------------------------------------------------------

# run_oha ROUND TARGET SCENARIO RATE SECONDS OHA-ARGS...: one fixed-rate oha run of
# OHA-ARGS (options and the request) at RATE req/s; ROUND 0 is warm-up, not kept. For a
# cluster target, also its Redis's CPU, commands and reads per request, and keyrelay's
# failed Redis calls; Redis's counters are read outside the CPU window.
run_oha() {
  local round=$1 t=$2 scenario=$3 rate=$4 secs=$5 out=$TMP/oha.json cpu0 cpu1 m0 m1
  local redis_port=${REDIS_PORT[$2]:-} failed0=0 failed1=0 leases=0
  shift 5
  if [[ -n $redis_port ]]; then
    failed0=$(metric_total "$t" keyrelay_cluster_errors_total)
    # The fleet's leases (as last synced): every open task holds one, and each heartbeat
    # renews them all, so Redis's work per request grows with them.
    leases=$(metric_total "$t" keyrelay_cluster_threads_held)
    redis_snapshot "$redis_port" >"$TMP/redis.before"
  fi
  cpu0=$(server_cpu "$t")
  m0=$(machine_now)
  # -w waits for requests in flight at the deadline instead of counting them as errors.
  run_fg "$TMP/oha.log" timeout $((secs + 30)) taskset -c "$CLIENT_CPU" \
    "$OHA" -q "$rate" -z "${secs}s" -c "$OHA_CONNECTIONS" -w --latency-correction \
    --no-tui "${OHA_THREADS[@]}" "${OHA_JSON[@]}" -o "$out" "$@" ||
    die "oha failed: $(tail -3 "$TMP/oha.log")"
  m1=$(machine_now)
  cpu1=$(server_cpu "$t")
  if [[ -n $redis_port ]]; then
    redis_snapshot "$redis_port" >"$TMP/redis.after"
    failed1=$(metric_total "$t" keyrelay_cluster_errors_total)
  fi
  ((round > 0)) || return 0
  python3 - "$out" >"$TMP/oha.stats" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
codes = {int(k): v for k, v in d.get("statusCodeDistribution", {}).items()}
n = sum(codes.values())
errors = sum(v for k, v in codes.items() if not 200 <= k < 300)
errors += sum(d.get("errorDistribution", {}).values())
pct = d["latencyPercentiles"]
print(f"requests {n}")
print(f"rps {n / d['summary']['total']:.1f}")
# A percentile is null when no request was answered: 0 then, and the errors say why.
for name, key in (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")):
    print(f"{name} {(pct[key] or 0) * 1e6:.1f}")
print(f"errors {errors}")
PY
  local n
  n=$(awk '$1 == "requests" { print $2 }' "$TMP/oha.stats")
  {
    grep -v '^requests ' "$TMP/oha.stats"
    run_stats "$cpu0" "$cpu1" "$m0" "$m1" "$n"
    if [[ -n $redis_port ]]; then
      redis_delta "$TMP/redis.before" "$TMP/redis.after" "$n"
      echo "cluster_errors $((failed1 - failed0))"
      echo "open_leases $leases"
    fi
  } | save_run "$round" "$t" "$scenario"
  ((failed1 == failed0)) || log "warning: target $t: $((failed1 - failed0)) Redis calls" \
    "failed or timed out during this run (keyrelay_cluster_errors_total); part of it ran" \
    "degraded, without Redis"
}

run_open() { # ROUND TARGET MODE(get|post|poll|create) SECONDS
  local request
  case $3 in
    post)
      request=(-m POST -H "Content-Type: $POST_TYPE" -d "$POST_BODY" "${URL[$2]}/in.php")
      ;;
    create)
      request=(-m POST -H "Content-Type: application/json" -d "$CREATE_BODY" "${URL[$2]}/createTask")
      ;;
    poll)
      poll_url "$2"
      request=("$POLL_URL")
      ;;
    *) request=("${URL[$2]}/in.php?$GET_QUERY") ;;
  esac
  run_oha "$1" "$2" "open-$3-$RATE" "$RATE" "$4" "${request[@]}"
}

run_rounds() {
  local t mode c r conns
  log "warm-up: ${WARMUP}s per target"
  # No poll warm-up: each round's poll runs come after its get and post runs.
  for t in "${TARGETS[@]}"; do
    run_wrk 0 "$t" get 64 "$WARMUP"
    run_wrk 0 "$t" post 64 "$WARMUP"
  done
  for r in $(seq "$ROUNDS"); do
    log "closed loop, round $r/$ROUNDS"
    for mode in get post poll; do
      conns=$CONNECTIONS
      [[ $mode != poll ]] || conns=$POLL_CONNECTIONS
      for c in $conns; do
        for t in "${TARGETS[@]}"; do run_wrk "$r" "$t" "$mode" "$c" "$DURATION"; done
      done
    done
  done
  # The fixed-rate CPU per request is the figure builds are compared by: more and longer
  # rounds than the closed loop, each target in turn, so a burst of other load hits one
  # run of one target rather than a whole column.
  for r in $(seq "$OPEN_ROUNDS"); do
    log "fixed rate, round $r/$OPEN_ROUNDS"
    for mode in get post poll create; do
      for t in "${TARGETS[@]}"; do
        # The JSON task API is keyrelay's alone: C and M, against their own POST /in.php.
        [[ $mode != create || $t == C || $t == M ]] || continue
        run_open "$r" "$t" "$mode" "$OPEN_DURATION"
      done
    done
  done
  record 0 C memory loaded_rss_kb "$(rss_kb "${PG[C]}")"
}

# --- TLS --------------------------------------------------------------------------------

# run_tls ROUND TARGET MODE(keepalive|handshake) SECONDS: the GET submit at BENCH_RATE over
# kept-alive connections, or at BENCH_TLS_HANDSHAKE_RATE on a new connection each.
run_tls() {
  local rate=$RATE args
  read -r -a args <<<"${OHA_ARGS[$2]:-}"
  if [[ $3 == handshake ]]; then rate=$TLS_HANDSHAKE_RATE args+=(--disable-keepalive); fi
  run_oha "$1" "$2" "tls-$3-$rate" "$rate" "$4" "${args[@]}" "${URL[$2]}/in.php?$GET_QUERY"
}

run_tls_rounds() {
  local t r mode
  if ((WARMUP > 0)); then
    log "TLS warm-up: ${WARMUP}s per target and measurement"
    for t in "${TLS_TARGETS[@]}"; do
      run_tls 0 "$t" keepalive "$WARMUP"
      run_tls 0 "$t" handshake "$WARMUP"
    done
  fi
  for r in $(seq "$TLS_ROUNDS"); do
    log "TLS, round $r/$TLS_ROUNDS"
    for mode in keepalive handshake; do
      for t in "${TLS_TARGETS[@]}"; do run_tls "$r" "$t" "$mode" "$TLS_DURATION"; done
    done
  done
}

# --- cluster ----------------------------------------------------------------------------

# run_cluster ROUND TARGET MODE(get|poll) SECONDS: the GET submit, or the poll of a task
# submitted through TARGET just before, at BENCH_RATE, as run_open's.
run_cluster() {
  local request=("${URL[$2]}/in.php?$GET_QUERY")
  if [[ $3 == poll ]]; then
    poll_url "$2"
    request=("$POLL_URL")
  fi
  run_oha "$1" "$2" "cluster-$3-$RATE" "$RATE" "$4" "${request[@]}"
}

# count_round_trips TARGET MODE(get|poll): Redis's read events and commands per request
# over BENCH_CLUSTER_SEQUENTIAL requests sent one at a time (oha -c1, each when the last is
# answered), so that no two requests' calls share a read event: a read event is then one
# round trip. The background's reads (a sync each 500 ms, a heartbeat each 5 s) are read
# over a 2 s idle window first, recorded as a rate for the report to subtract. The commands
# keyrelay sent (not those its scripts ran) come from MONITOR, started before and stopped
# after both snapshots, so that its own connection's reads fall outside them.
count_round_trips() {
  local t=$1 mode=$2 port=${REDIS_PORT[$1]} url="${URL[$1]}/in.php?$GET_QUERY" n t0 t1
  local trips0 trips1
  local out=$TMP/oha-seq.json
  if [[ $mode == poll ]]; then
    poll_url "$t"
    url=$POLL_URL
  fi
  redis_monitor "$port" "$TMP/monitor.log"
  local monitor=$LAST_PID
  redis_snapshot "$port" >"$TMP/redis.idle"
  t0=$(date +%s%N)
  sleep 2
  redis_snapshot "$port" >"$TMP/redis.before"
  t1=$(date +%s%N)
  local idle idle_lines
  # The idle window's MONITOR lines, to be left out of the requests' count.
  idle_lines=$(wc -l <"$TMP/monitor.log")
  idle=$(awk -v ns=$((t1 - t0)) '$1 == "redis_reads" { printf "%.3f\n", $2 / ns * 1e9 }' \
    <(redis_delta "$TMP/redis.idle" "$TMP/redis.before" 1))
  trips0=$(request_trips "$t")
  t0=$(date +%s%N)
  run_fg "$TMP/oha-seq.log" timeout 120 taskset -c "$CLIENT_CPU" \
    "$OHA" -n "$CLUSTER_SEQUENTIAL" -c 1 --no-tui "${OHA_THREADS[@]}" "${OHA_JSON[@]}" \
    -o "$out" "$url" || die "oha failed: $(tail -3 "$TMP/oha-seq.log")"
  t1=$(date +%s%N)
  trips1=$(request_trips "$t")
  redis_snapshot "$port" >"$TMP/redis.after"
  # MONITOR may not have written the last lines yet: bounded wait for the third snapshot's
  # INFO (idle, before, after), which Redis ran after every command of the requests.
  local _
  for _ in $(seq 50); do
    (($(grep -c '"INFO"' "$TMP/monitor.log") >= 3)) && break
    sleep 0.05
  done
  stop_pg "$monitor"
  tail -n +"$((idle_lines + 1))" "$TMP/monitor.log" >"$TMP/monitor.run"
  n=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
codes = d.get("statusCodeDistribution", {})
print(sum(v for k, v in codes.items() if 200 <= int(k) < 300))' "$out")
  ((n == CLUSTER_SEQUENTIAL)) ||
    die "target $t: $n of $CLUSTER_SEQUENTIAL one-at-a-time ${mode} requests answered 2xx"
  local metric value line="" sc=cluster-seq-$mode
  while read -r metric value; do
    record 1 "$t" "$sc" "$metric" "$value"
    [[ $metric != redis_reads && $metric != redis_sent && $metric != request_trips ]] ||
      line+=" ${metric#redis_} $value"
  done < <(
    echo "requests $n"
    awk -v ns=$((t1 - t0)) 'BEGIN { printf "seconds %.3f\n", ns / 1e9 }'
    echo "idle_reads_per_s $idle"
    awk -v d=$((trips1 - trips0)) -v n="$n" 'BEGIN { printf "request_trips %.4f\n", d / n }'
    redis_delta "$TMP/redis.before" "$TMP/redis.after" "$n"
    redis_sent "$TMP/monitor.run" "$n"
  )
  log "round trips, $t $mode: $n requests one at a time in $(((t1 - t0) / 1000000)) ms; per" \
    "request:$line (idle: $idle reads/s)"
}

# ping_floor TARGET: the mean of a bare Redis round trip on this machine, a PING every
# 10 ms for 3 s from the client core (redis-cli --latency): what one round trip costs a
# submit before keyrelay or Redis does any work, and so the least a submit's p50 can grow
# by. On a virtual machine whose cores idle between requests most of it is waking them up.
ping_floor() {
  local t=$1 line avg samples _
  line=$(taskset -c "$CLIENT_CPU" redis-cli -h 127.0.0.1 -p "${REDIS_PORT[$t]}" --latency \
    -i 3 --raw) || die "redis-cli --latency failed against target $t's Redis"
  # "min max avg samples", in ms (min and max whole, avg to 10 µs).
  read -r _ _ avg samples <<<"$line"
  record 1 "$t" cluster-ping ping_avg_us "$(awk -v v="$avg" 'BEGIN { printf "%.0f", v * 1000 }')"
  record 1 "$t" cluster-ping ping_samples "$samples"
  log "a bare Redis round trip, target $t: ${avg} ms on average over $samples PINGs"
}

run_cluster_rounds() {
  local t r mode
  if ((WARMUP > 0)); then
    log "cluster warm-up: ${WARMUP}s per target"
    for t in "${CLUSTER_TARGETS[@]}"; do run_cluster 0 "$t" get "$WARMUP"; done
  fi
  for t in "${CLUSTER_TARGETS[@]:1}"; do
    ping_floor "$t"
    count_round_trips "$t" get
    count_round_trips "$t" poll
  done
  for r in $(seq "$CLUSTER_ROUNDS"); do
    log "cluster, round $r/$CLUSTER_ROUNDS"
    for mode in get poll; do
      for t in "${CLUSTER_TARGETS[@]}"; do run_cluster "$r" "$t" "$mode" "$CLUSTER_DURATION"; done
    done
  done
}

# --- memory per pin ---------------------------------------------------------------------
# Pins need an upstream that issues a fresh id per submit. The stub does too, but this step
# keeps keyrelay's own simulator, so that its figures stay comparable with earlier runs; its
# keys never run out of balance or threads (each accepted task holds a simulated thread
# until polled, and none is polled here).

pinned_now() {
  curl -sf --max-time 2 "http://127.0.0.1:$PORT_PINS/metrics" |
    awk '$1 == "keyrelay_tasks_pinned" { print $2; found = 1 } END { if (!found) print 0 }'
}

measure_pins() {
  local sim_keys=() k
  for k in "${POOL_KEYS[@]}"; do sim_keys+=(--key "$k,balance=1000000000,threads=4000000000,cost=0"); done
  start_bg "$TMP/sim.log" taskset -c "$SERVER_CPU" "$BIN" simulate \
    --listen "127.0.0.1:$PORT_SIM" --polls-to-ready 1 "${sim_keys[@]}"
  local sim_pg=$LAST_PID i
  # The simulator has no /healthz; any HTTP answer on res.php means it is up.
  for i in $(seq 201); do
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT_SIM/res.php" && break
    ((i <= 200)) || die "simulator did not start (log: $(tail -3 "$TMP/sim.log"))"
    sleep 0.05
  done

  keyrelay_conf "$TMP/pins.toml" "$PORT_PINS" "$PORT_SIM" memory
  start_keyrelay keyrelay-pins "$TMP/pins.toml" "$PORT_PINS"
  local pins_pg=$LAST_PID
  sleep 2
  local idle
  idle=$(rss_kb "$pins_pg")

  log "memory: submitting until $PINS tasks are pinned (at most ${PINS_TIMEOUT}s)"
  start_bg "$TMP/wrk-pins.out" timeout $((PINS_TIMEOUT + 10)) taskset -c "$CLIENT_CPU" \
    wrk -t1 -c64 -d"${PINS_TIMEOUT}s" --timeout 5s -s "$BENCH_DIR/wrk.lua" \
    "http://127.0.0.1:$PORT_PINS/in.php?$GET_QUERY" -- get
  local wrk_pg=$LAST_PID start=$SECONDS pinned=0 last=0 last_change=$SECONDS
  # A checkpoint at a tenth of the way gives the marginal cost of a pin, without the
  # one-off growth that 64 busy connections bring (buffers, allocator arenas).
  local mark_pins=0 mark_rss=0
  while kill -0 "$wrk_pg" 2>/dev/null; do
    sleep 1
    pinned=$(pinned_now)
    ((pinned >= PINS)) && break
    if ((mark_pins == 0 && pinned >= PINS / 10)); then
      mark_rss=$(rss_kb "$pins_pg") mark_pins=$pinned
    fi
    if ((pinned > last)); then last=$pinned last_change=$SECONDS; fi
    if ((SECONDS - last_change > 15)); then
      log "warning: pins stuck at $pinned for 15 s; stopping the memory step"
      break
    fi
  done
  local secs=$((SECONDS - start))
  stop_pg "$wrk_pg"
  pinned=$(pinned_now)
  local rss
  rss=$(rss_kb "$pins_pg")
  ((pinned >= PINS)) || log "warning: reached only $pinned of $PINS pins in ${secs}s"
  log "memory: $pinned pins in ${secs}s; RSS ${idle} kB idle -> ${rss} kB"
  record 0 C memory pins "$pinned"
  record 0 C memory pins_idle_rss_kb "$idle"
  record 0 C memory pins_rss_kb "$rss"
  record 0 C memory pins_mark "$mark_pins"
  record 0 C memory pins_mark_rss_kb "$mark_rss"
  record 0 C memory pins_seconds "$secs"
  stop_pg "$pins_pg"
  stop_pg "$sim_pg"
}

# --- startup ----------------------------------------------------------------------------

measure_startup() {
  keyrelay_conf "$TMP/startup.toml" "$PORT_START" "$PORT_A" durable
  log "startup: $STARTUP_RUNS timed starts"
  run_fg "$TMP/startup.out" python3 "$BENCH_DIR/startup.py" --bin "$BIN" \
    --config "$TMP/startup.toml" --port "$PORT_START" --query "$GET_QUERY" \
    --runs "$STARTUP_RUNS" --server-cpu "$SERVER_CPU" --client-cpu "$CLIENT_CPU" ||
    die "startup measurement failed: $(tail -3 "$TMP/startup.out")"
  cat "$TMP/startup.out" >&2
  grep -P '^\d' "$TMP/startup.out" >>"$RAW" || die "no startup figures"
}

versions() {
  local tree
  tree=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)
  # A binary given with KEYRELAY_BIN was not built from this tree: say so, not the tree's hash.
  [[ -n ${KEYRELAY_BIN:-} ]] && tree="$KEYRELAY_BIN (KEYRELAY_BIN; the script at $tree)"
  printf 'keyrelay %s, nginx %s' "$tree" "$("$NGINX" -v 2>&1 | sed 's|.*/||')"
  [[ $TLS == 0 ]] || printf ', %s' "$(openssl version | awk '{ print $1, $2 }')"
  ((!HEADLINE)) || printf ', wrk %s' "$(wrk -v 2>&1 | awk 'NR == 1 { print $2 }')"
  printf ', oha %s' "$("$OHA" --version | awk '{ print $2 }')"
  [[ $CLUSTER == 0 ]] || printf ', redis-server %s' \
    "$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
}

# command_line: the knobs of this run as a command that repeats it.
command_line() {
  local knobs=""
  if ((HEADLINE)); then
    knobs="BENCH_DURATION=$DURATION BENCH_ROUNDS=$ROUNDS"
    knobs+=" BENCH_OPEN_DURATION=$OPEN_DURATION BENCH_OPEN_ROUNDS=$OPEN_ROUNDS"
    [[ $SKIP_PINS == 1 ]] && knobs+=" BENCH_SKIP_PINS=1"
    [[ $PINS == 1000000 ]] || knobs+=" BENCH_PINS=$PINS"
    [[ $CONNECTIONS == "16 64" ]] || knobs+=" BENCH_CONNECTIONS=\"$CONNECTIONS\""
    [[ $POLL_CONNECTIONS == 16 ]] || knobs+=" BENCH_POLL_CONNECTIONS=\"$POLL_CONNECTIONS\""
    [[ $TLS == 1 ]] || knobs+=" BENCH_TLS=0"
    [[ $CLUSTER == 1 ]] || knobs+=" BENCH_CLUSTER=0"
  fi
  [[ $CLUSTER != only ]] || knobs+=" BENCH_CLUSTER=only"
  [[ $CLUSTER == 0 ]] ||
    knobs+=" BENCH_CLUSTER_ROUNDS=$CLUSTER_ROUNDS BENCH_CLUSTER_DURATION=$CLUSTER_DURATION"
  [[ $CLUSTER == 0 || $CLUSTER_AOF == 1 ]] || knobs+=" BENCH_CLUSTER_AOF=0"
  [[ $CLUSTER == 0 || $CLUSTER_SEQUENTIAL == 500 ]] ||
    knobs+=" BENCH_CLUSTER_SEQUENTIAL=$CLUSTER_SEQUENTIAL"
  [[ $TLS == 0 ]] || knobs+=" BENCH_TLS_ROUNDS=$TLS_ROUNDS BENCH_TLS_DURATION=$TLS_DURATION"
  [[ $TLS == 0 || $TLS_HANDSHAKE_RATE == 200 ]] ||
    knobs+=" BENCH_TLS_HANDSHAKE_RATE=$TLS_HANDSHAKE_RATE"
  [[ $RATE == 2000 ]] || knobs+=" BENCH_RATE=$RATE"
  [[ $OHA_CONNECTIONS == 16 ]] || knobs+=" BENCH_OHA_CONNECTIONS=$OHA_CONNECTIONS"
  # bench/tls.sh is BENCH_TLS=only bench/run.sh.
  if [[ $TLS == only ]]; then echo "${knobs# } bench/tls.sh"; else echo "${knobs# } bench/run.sh"; fi
}

# --- main -------------------------------------------------------------------------------

main() {
  local t0=$SECONDS tools=(nginx curl python3 taskset setsid pgrep) oha_needs=()
  check_knobs
  [[ $CLUSTER_AOF == 1 ]] || CLUSTER_TARGETS=(S R)
  ((!HEADLINE)) || tools+=(wrk)
  [[ $TLS == 0 ]] || tools+=(openssl) oha_needs=(--disable-keepalive --insecure --no-pre-lookup)
  [[ $CLUSTER == 0 ]] || tools+=(redis-server redis-cli)
  ensure_tools "${tools[@]}"
  ensure_oha "$OHA_VERSION" "${oha_needs[@]}"
  build_keyrelay
  ((!HEADLINE)) || build_floor
  check_cpus
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/keyrelay-bench.XXXXXX")
  RAW=$TMP/raw.tsv
  : >"$RAW"
  start_watchdog "$MAX_RUNTIME"
  start_targets
  [[ $TLS == 0 ]] || start_tls_targets
  [[ $CLUSTER == 0 ]] || start_cluster_targets
  if ((HEADLINE)); then
    measure_startup
    run_rounds
    if [[ $SKIP_PINS == 1 ]]; then log "memory per pin: skipped (BENCH_SKIP_PINS=1)"
    else measure_pins
    fi
  fi
  [[ $TLS == 0 ]] || run_tls_rounds
  [[ $CLUSTER == 0 ]] || run_cluster_rounds

  mkdir -p "$(dirname "$RESULTS")"
  python3 "$BENCH_DIR/report.py" "$RAW" \
    --command "$(command_line)" \
    --seconds $((SECONDS - t0)) \
    --rate "$RATE" --connections "$CONNECTIONS" --poll-connections "$POLL_CONNECTIONS" \
    --rounds "$ROUNDS" --duration "$DURATION" \
    --open-rounds "$OPEN_ROUNDS" --open-duration "$OPEN_DURATION" \
    --tls-rounds "$TLS_ROUNDS" --tls-duration "$TLS_DURATION" \
    --handshake-rate "$TLS_HANDSHAKE_RATE" --oha-connections "$OHA_CONNECTIONS" \
    --forward-host "$FORWARD_HOST" --negotiated "$TLS_INFO" \
    --cluster-rounds "$CLUSTER_ROUNDS" --cluster-duration "$CLUSTER_DURATION" \
    --cluster-sequential "$CLUSTER_SEQUENTIAL" \
    --server-cpu "$SERVER_CPU" --client-cpu "$CLIENT_CPU" \
    --versions "$(versions)" >"$RESULTS"
  cp "$RAW" "${RESULTS%.md}.tsv"
  cat "$RESULTS"
  log "table written to $RESULTS (raw figures: ${RESULTS%.md}.tsv); took $((SECONDS - t0))s"
}

main "$@"
