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
# See bench/README.md for what is measured and docs/performance.md for how to read it.
#
# Knobs (environment):
#   BENCH_DURATION=10       seconds per closed-loop run (wrk)
#   BENCH_ROUNDS=3          interleaved closed-loop rounds (A B C M D each), medians reported
#   BENCH_CONNECTIONS="16 64"  closed-loop connection counts (get and post)
#   BENCH_POLL_CONNECTIONS=16  closed-loop connection counts for poll ("" for none); the
#                           fixed-rate runs poll in every round
#   BENCH_RATE=2000         open-loop request rate (req/s)
#   BENCH_OHA_CONNECTIONS=16  oha connections for the open loop
#   BENCH_OPEN_ROUNDS=5     rounds of the fixed-rate runs (get, post, poll each), medians
#   BENCH_OPEN_DURATION=20  seconds per fixed-rate run
#   BENCH_WARMUP=2          seconds of warm-up load per target (get, then post) before round 1
#   BENCH_SKIP_PINS=0       1 skips the 1M-pin memory step
#   BENCH_PINS=1000000      pins to reach in the memory step
#   BENCH_PINS_TIMEOUT=300  seconds the memory step may take at most
#   BENCH_STARTUP_RUNS=5    keyrelay starts timed for the startup figure
#   BENCH_SERVER_CPU=0      core for the servers (stub nginx, proxy under test)
#   BENCH_CLIENT_CPU=1      core for the load generator
#   BENCH_MAX_RUNTIME=3600  seconds after which the whole run is stopped (build excluded)
#   BENCH_RESULTS=bench/results/latest.md  where the table is written
#   BENCH_OHA_VERSION=1.16.0  oha version installed when oha is missing
#   KEYRELAY_BIN=path       use this binary instead of `cargo build --release`
#   PASSTHROUGH_BIN=path    use this build of benches/passthrough.rs (target D)
#   CARGO_TARGET_DIR        honoured by the build
#
# It listens on 127.0.0.1 only, on free ports, stops every process it started and removes
# its temp dir on any exit (normal, error, Ctrl-C, SIGTERM). Missing tools are installed:
# nginx, wrk (and curl, python3, util-linux, procps) with apt-get, oha with
# `cargo install --locked` into bench/.tools, once.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")

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
SERVER_CPU=${BENCH_SERVER_CPU:-0}
CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
MAX_RUNTIME=${BENCH_MAX_RUNTIME:-3600}
RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/latest.md}
OHA_VERSION=${BENCH_OHA_VERSION:-1.16.0}

# The pool: three fake 32-character keys. The key a client sends is replaced by keyrelay,
# so the load generator sends yet another one.
POOL_KEYS=(benchkey000000000000000000000001 benchkey000000000000000000000002
           benchkey000000000000000000000003)
CLIENT_KEY=0123456789abcdef0123456789abcdef
GET_QUERY="key=$CLIENT_KEY&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https%3A%2F%2Fexample.com%2Flogin&json=1"
# nginx's connection serial and its request count on that connection, joined by eight zeros,
# which neither holds: a new id per request, up to 18 digits, so a numeric id to keyrelay.
STUB_ANSWER='OK|${connection}00000000${connection_requests}'
STUB_ANSWER_RE='^OK\|[1-9][0-9]*00000000[1-9][0-9]*$'
# The stub's answer to every /res.php request: a poll of a task not solved yet. keyrelay's
# own getbalance and threadsinfo reads get it too, which leaves balances and threads unknown.
STUB_POLL_ANSWER=CAPCHA_NOT_READY
TARGETS=(A B C M D)

check_knobs() {
  local name
  for name in DURATION ROUNDS RATE OHA_CONNECTIONS OPEN_ROUNDS OPEN_DURATION WARMUP PINS \
    PINS_TIMEOUT STARTUP_RUNS SERVER_CPU CLIENT_CPU MAX_RUNTIME; do
    [[ ${!name} =~ ^[0-9]+$ ]] || die "BENCH_$name must be a whole number, got '${!name}'"
  done
  ((DURATION > 0 && ROUNDS > 0 && RATE > 0 && STARTUP_RUNS > 0 && OPEN_ROUNDS > 0 &&
    OPEN_DURATION > 0)) ||
    die "BENCH_DURATION, BENCH_ROUNDS, BENCH_OPEN_ROUNDS, BENCH_OPEN_DURATION, BENCH_RATE" \
      "and BENCH_STARTUP_RUNS must be > 0"
  [[ $CONNECTIONS =~ ^[0-9]+( [0-9]+)*$ ]] ||
    die "BENCH_CONNECTIONS must be numbers separated by spaces, got '$CONNECTIONS'"
  [[ -z $POLL_CONNECTIONS || $POLL_CONNECTIONS =~ ^[0-9]+( [0-9]+)*$ ]] ||
    die "BENCH_POLL_CONNECTIONS must be numbers separated by spaces (or empty)," \
      "got '$POLL_CONNECTIONS'"
  [[ $SKIP_PINS == [01] ]] || die "BENCH_SKIP_PINS must be 0 or 1, got '$SKIP_PINS'"
}

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- process bookkeeping ----------------------------------------------------------------
# Every process is started with setsid, so it leads its own process group: one kill of
# the group reaches all of it (nginx's workers, oha's threads, wrk under timeout), and a
# Ctrl-C on the terminal reaches only this script, whose trap then stops the rest.

# setsid(1) forks, so that $! would no longer be the new group's id, only when its caller
# leads a process group; without job control (the default in a script) a background
# child never does.
set +m

PGIDS=()    # process groups still running
TMP=""      # temp dir, removed on exit
LAST_PID="" # pid (= process group) of the last start_bg

forget_pg() {
  local keep=() pg
  for pg in "${PGIDS[@]}"; do [[ $pg == "$1" ]] || keep+=("$pg"); done
  PGIDS=("${keep[@]}")
}

stop_pg() {
  local pg=$1 i
  # The pid too: a child stopped right after its fork has not called setsid yet.
  kill -TERM -- "-$pg" "$pg" 2>/dev/null || true
  for i in $(seq 50); do
    kill -0 -- "-$pg" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pg" "$pg" 2>/dev/null || true
  wait "$pg" 2>/dev/null || true
  forget_pg "$pg"
}

cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM
  for pg in "${PGIDS[@]}"; do stop_pg "$pg"; done
  [[ -n $TMP && -d $TMP ]] && rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# start_bg LOG CMD...: starts CMD in the background in a new session; sets LAST_PID.
start_bg() {
  local logfile=$1
  shift
  setsid "$@" >"$logfile" 2>&1 </dev/null &
  LAST_PID=$!
  PGIDS+=("$LAST_PID")
}

# run_fg LOG CMD...: like start_bg, then waits for it. `wait` returns at once on a signal,
# so Ctrl-C is handled at once, not after the load generator's run.
run_fg() {
  start_bg "$@"
  local pid=$LAST_PID rc=0
  wait "$pid" || rc=$?
  forget_pg "$pid"
  return "$rc"
}

# A watchdog bounds the run: after MAX_RUNTIME it sends this script SIGTERM.
start_watchdog() {
  start_bg /dev/null bash -c "sleep $MAX_RUNTIME; kill -TERM $$"
}

# --- tools ------------------------------------------------------------------------------

NGINX="" OHA="" BIN="" FLOOR_BIN="" OHA_JSON=() OHA_THREADS=()

as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

find_nginx() { command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true; }

ensure_tools() {
  local missing=()
  [[ -n $(find_nginx) ]] || missing+=(nginx)
  command -v wrk >/dev/null || missing+=(wrk)
  command -v curl >/dev/null || missing+=(curl)
  command -v python3 >/dev/null || missing+=(python3)
  command -v taskset >/dev/null && command -v setsid >/dev/null || missing+=(util-linux)
  command -v pgrep >/dev/null || missing+=(procps)
  if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    # Debian's nginx-light is only a transitional package pulling in nginx plus a module
    # since bookworm, so install nginx itself. Its package scripts may start the system
    # nginx service on port 80; this script neither uses nor stops that service.
    log "installing ${missing[*]} with apt-get"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  fi
  NGINX=$(find_nginx)
  [[ -n $NGINX ]] || die "nginx not found after install"

  OHA=$(command -v oha || true)
  [[ -n $OHA ]] || OHA=$BENCH_DIR/.tools/bin/oha
  if [[ ! -x $OHA ]]; then
    log "installing oha $OHA_VERSION into bench/.tools (a few minutes, once)"
    cargo install oha --version "$OHA_VERSION" --locked --root "$BENCH_DIR/.tools" >&2
  fi
  # JSON output is --output-format json in oha >= 1.5 and -j before.
  local help
  help=$("$OHA" --help)
  if grep -q -- '--output-format' <<<"$help"; then OHA_JSON=(--output-format json)
  else OHA_JSON=(-j)
  fi
  # oha's default is one thread per physical core, whatever its affinity: with one core
  # to itself, one thread is right.
  if grep -q -- '--worker-threads' <<<"$help"; then OHA_THREADS=(--worker-threads 1); fi
}

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

build_keyrelay() {
  if [[ -n ${KEYRELAY_BIN:-} ]]; then
    BIN=$KEYRELAY_BIN
  else
    log "cargo build --release (target dir: ${CARGO_TARGET_DIR:-default})"
    (cd "$REPO" && cargo build --release --bin keyrelay >&2)
    local target_dir
    target_dir=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    BIN=$target_dir/release/keyrelay
  fi
  [[ -x $BIN ]] || die "no keyrelay binary at $BIN"
}

check_cpus() {
  local n
  n=$(nproc)
  if ((n < 2)); then
    log "warning: only $n core; servers and load generator share it, figures are contended"
    SERVER_CPU=0 CLIENT_CPU=0
  elif [[ $SERVER_CPU == "$CLIENT_CPU" ]]; then
    log "warning: BENCH_SERVER_CPU = BENCH_CLIENT_CPU; servers and load generator share a core"
  fi
  { taskset -c "$SERVER_CPU" true && taskset -c "$CLIENT_CPU" true; } ||
    die "cannot pin to cores $SERVER_CPU and $CLIENT_CPU"
}

# --- measurements helpers ---------------------------------------------------------------

# free_ports N: N distinct free loopback ports (all bound at once, so no repeats).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# cpu_ns PGID...: for each process group, the CPU time (user + system) of its processes in
# nanoseconds, threads that have exited included; one figure per group, on one line. Read
# from each process's own CPU clock (clock_getcpuclockid) just before and just after a run,
# so a run's figure is the CPU the process was charged, not a sample: /proc/<pid>/stat's
# utime + stime would count the same time in 10 ms ticks, too coarse for a few thousand
# requests at 20 µs each. Falls back to the ticks if the clock is refused.
cpu_ns() {
  python3 - "$@" <<'EOF'
import ctypes, ctypes.util, os, sys, time
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
tick_ns = 10**9 // os.sysconf("SC_CLK_TCK")
groups = {int(g): 0 for g in sys.argv[1:]}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # fields from the 3rd on
        pgrp = int(fields[2])
        if pgrp not in groups:
            continue
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(int(pid), ctypes.byref(clock)) == 0:
            groups[pgrp] += time.clock_gettime_ns(clock.value)
        else:
            groups[pgrp] += (int(fields[11]) + int(fields[12])) * tick_ns
    except OSError:
        pass  # exited meanwhile
print(" ".join(str(groups[int(g)]) for g in sys.argv[1:]))
EOF
}

# server_cpu TARGET: "<target's CPU ns> <all servers' CPU ns>".
server_cpu() {
  local ns t groups=() sum=0 i
  for t in "${TARGETS[@]}"; do groups+=("${PG[$t]}"); done
  read -r -a ns <<<"$(cpu_ns "${PG[$1]}" "${groups[@]}")"
  for ((i = 1; i < ${#ns[@]}; i++)); do sum=$((sum + ns[i])); done
  echo "${ns[0]} $sum"
}

# machine_now: "total steal busy children" in clock ticks: all cores' time, steal, time
# spent running anything (user nice system irq softirq), from the first line of
# /proc/stat; and the CPU of this shell's reaped children (cutime + cstime of $$), which
# is the load generator's once it has exited. Other load during a run is then
# busy - servers - load generator.
machine_now() {
  local _ user nice system idle iowait irq softirq steal f
  read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
  read -r -a f <<<"$(sed 's/.*) //' "/proc/$$/stat")"
  echo "$((user + nice + system + idle + iowait + irq + softirq + steal)) $steal" \
    "$((user + nice + system + irq + softirq)) $((f[13] + f[14]))"
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# wait_http URL PID WHAT: bounded wait (10 s) until URL answers 2xx; fails early if PID died.
wait_http() {
  local url=$1 pid=$2 what=$3 i
  for i in $(seq 200); do
    curl -sf -o /dev/null --max-time 1 "$url" && return 0
    kill -0 "$pid" 2>/dev/null || die "$what exited during startup (log: $(tail -5 "$TMP/$what.log"))"
    sleep 0.05
  done
  die "$what did not answer $url within 10 s"
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
# Through keyrelay (C, M) that poll must also have gone out on the task's pin: keyrelay's
# own CAPCHA_NOT_READY carries no X-Keyrelay-Key, and a probe counts in
# keyrelay_probes_total. A fresh task for every poll run: the other runs' submits, hundreds
# of thousands each, would evict an older pin (max_pins).
POLL_URL=""
poll_url() {
  local t=$1 body url headers=$TMP/poll.headers probes="" after
  body=$(curl -sf --max-time 2 "${URL[$t]}/in.php?$GET_QUERY") ||
    die "target $t: the submit before the poll failed: ${URL[$t]}/in.php?$GET_QUERY"
  [[ $body =~ $STUB_ANSWER_RE ]] ||
    die "target $t: unexpected answer to the submit before the poll: ${body:0:80}"
  url="${URL[$t]}/res.php?key=$CLIENT_KEY&action=get&id=${body#OK|}&json=1"
  [[ $t != [CM] ]] || probes=$(probes_total "$t")
  body=$(curl -sf --max-time 2 -D "$headers" "$url") || die "target $t: poll failed: $url"
  [[ $body == "$STUB_POLL_ANSWER" ]] ||
    die "target $t: the poll answered '${body:0:80}', not $STUB_POLL_ANSWER: $url"
  if [[ $t == [CM] ]]; then
    grep -qi '^x-keyrelay-key: bench-' "$headers" ||
      die "target $t: the poll was answered by keyrelay itself, not relayed: $url"
    after=$(probes_total "$t")
    [[ $after == "$probes" ]] ||
      die "target $t: the poll's task had no pin (keyrelay probed for it): $url"
  fi
  POLL_URL=$url
}

# probes_total TARGET: keyrelay's keyrelay_probes_total, all results summed.
probes_total() {
  curl -sf --max-time 2 "${URL[$1]}/metrics" |
    awk '$1 ~ /^keyrelay_probes_total([{]|$)/ { n += $2 } END { printf "%d\n", n }' ||
    die "target $1: no /metrics"
}

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

TICK_NS=$((1000000000 / $(getconf CLK_TCK)))

# run_stats T0 T1 MACHINE0 MACHINE1 REQUESTS: the per-run figures shared by wrk and oha,
# as "metric value" lines: server CPU per request, steal %, other load %.
run_stats() {
  awk -v t0="$1" -v t1="$2" -v m0="$3" -v m1="$4" -v n="$5" -v tick="$TICK_NS" 'BEGIN {
    split(t0, a, " "); split(t1, b, " "); split(m0, x, " "); split(m1, y, " ")
    if (n == 0) n = 1
    total = (y[1] - x[1]) * tick; if (total == 0) total = 1
    other = (y[3] - x[3]) * tick - (b[2] - a[2]) - (y[4] - x[4]) * tick
    if (other < 0) other = 0
    printf "cpu_us %.2f\nsteal_pct %.2f\nother_pct %.1f\n",
      (b[1] - a[1]) / 1e3 / n, (y[2] - x[2]) * tick * 100 / total, other * 100 / total
  }'
}

RAW="" # results, one per line: round target scenario metric value

record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RAW"; }

# --- servers ----------------------------------------------------------------------------

declare -A PG=()   # target (A B C M D) -> process group whose CPU is charged to it
declare -A URL=()  # target -> base URL
PORT_A="" PORT_B="" PORT_C="" PORT_M="" PORT_D="" PORT_SIM="" PORT_PINS="" PORT_START=""

# nginx_conf NAME SERVER-BLOCKS: a minimal single-worker config kept inside the temp dir.
nginx_conf() {
  local name=$1 servers=$2
  local dir=$TMP/nginx-$name
  mkdir -p "$dir/tmp"
  cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  # Temp paths inside the prefix: Debian's defaults under /var/lib/nginx need root.
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  # nginx closes a keep-alive connection after 1000 requests by default; raised so that
  # no target pays reconnects the others do not.
  keepalive_requests 1000000;
$servers
}
EOF
}

start_nginx() {
  local name=$1 port=$2 dir=$TMP/nginx-$1
  start_bg "$TMP/nginx-$name.log" taskset -c "$SERVER_CPU" \
    "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;'
  wait_http "http://127.0.0.1:$port/healthz" "$LAST_PID" "nginx-$name"
}

# keyrelay_conf FILE LISTEN-PORT UPSTREAM-PORT PINS: PINS is "durable" for the shipped
# default (the pin journal, in a data_dir of the config's own in the temp dir) or "memory"
# for `[pins] durable = false`. Every other setting is left at its default.
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
  } >"$1"
}

start_keyrelay() { # NAME CONFIG PORT
  start_bg "$TMP/$1.log" taskset -c "$SERVER_CPU" "$BIN" --config "$2" --log warn
  wait_http "http://127.0.0.1:$3/healthz" "$LAST_PID" "$1"
}

start_targets() {
  read -r PORT_A PORT_B PORT_C PORT_M PORT_D PORT_SIM PORT_PINS PORT_START <<<"$(free_ports 8)"

  nginx_conf stub "  server {
    listen 127.0.0.1:$PORT_A;
    default_type text/plain;
    location / { return 200 \"$STUB_ANSWER\"; }
    location = /res.php { return 200 \"$STUB_POLL_ANSWER\"; }
  }"
  start_nginx stub "$PORT_A"
  PG[A]=$LAST_PID URL[A]=http://127.0.0.1:$PORT_A

  nginx_conf proxy "  upstream stub {
    server 127.0.0.1:$PORT_A;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$PORT_B;
    location / {
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
  start_nginx proxy "$PORT_B"
  PG[B]=$LAST_PID URL[B]=http://127.0.0.1:$PORT_B

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
  wait_http "http://127.0.0.1:$PORT_D/healthz" "$LAST_PID" passthrough
  PG[D]=$LAST_PID URL[D]=http://127.0.0.1:$PORT_D

  local t
  for t in "${TARGETS[@]}"; do
    expect_stub_answer "${URL[$t]}/in.php?$GET_QUERY" "target $t"
    expect_stub_post "${URL[$t]}/in.php" "target $t"
    poll_url "$t"
  done
  log "targets up: A stub :$PORT_A  B nginx :$PORT_B  C keyrelay :$PORT_C" \
    " M keyrelay (pins in memory) :$PORT_M  D passthrough :$PORT_D" \
    "(servers on core $SERVER_CPU, load on core $CLIENT_CPU)"
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

run_oha() { # ROUND TARGET MODE(get|post|poll) SECONDS
  local round=$1 t=$2 mode=$3 secs=$4 out=$TMP/oha.json cpu0 cpu1 m0 m1 request
  case $mode in
    post)
      request=(-m POST -H "Content-Type: $POST_TYPE" -d "$POST_BODY" "${URL[$t]}/in.php")
      ;;
    poll)
      poll_url "$t"
      request=("$POLL_URL")
      ;;
    *) request=("${URL[$t]}/in.php?$GET_QUERY") ;;
  esac
  cpu0=$(server_cpu "$t")
  m0=$(machine_now)
  # -w waits for requests in flight at the deadline instead of counting them as errors.
  run_fg "$TMP/oha.log" timeout $((secs + 30)) taskset -c "$CLIENT_CPU" \
    "$OHA" -q "$RATE" -z "${secs}s" -c "$OHA_CONNECTIONS" -w --latency-correction \
    --no-tui "${OHA_THREADS[@]}" "${OHA_JSON[@]}" -o "$out" "${request[@]}" ||
    die "oha failed: $(tail -3 "$TMP/oha.log")"
  m1=$(machine_now)
  cpu1=$(server_cpu "$t")
  python3 - "$out" >"$TMP/oha.stats" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
codes = {int(k): v for k, v in d.get("statusCodeDistribution", {}).items()}
n = sum(codes.values())
errors = sum(v for k, v in codes.items() if not 200 <= k < 300)
errors += sum(d.get("errorDistribution", {}).values())
pct = d["latencyPercentiles"]
print(f"requests {n}")
print(f"rps {n / d['summary']['total']:.1f}")
for name, key in (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")):
    print(f"{name} {pct[key] * 1e6:.1f}")
print(f"errors {errors}")
EOF
  local n
  n=$(awk '$1 == "requests" { print $2 }' "$TMP/oha.stats")
  {
    grep -v '^requests ' "$TMP/oha.stats"
    run_stats "$cpu0" "$cpu1" "$m0" "$m1" "$n"
  } | save_run "$round" "$t" "open-$mode-$RATE"
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
    for mode in get post poll; do
      for t in "${TARGETS[@]}"; do run_oha "$r" "$t" "$mode" "$OPEN_DURATION"; done
    done
  done
  record 0 C memory loaded_rss_kb "$(rss_kb "${PG[C]}")"
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
  printf 'keyrelay %s, nginx %s, wrk %s, oha %s' \
    "$tree" \
    "$("$NGINX" -v 2>&1 | sed 's|.*/||')" \
    "$(wrk -v 2>&1 | awk 'NR == 1 { print $2 }')" \
    "$("$OHA" --version | awk '{ print $2 }')"
}

# --- main -------------------------------------------------------------------------------

main() {
  local t0=$SECONDS
  check_knobs
  ensure_tools
  build_keyrelay
  build_floor
  check_cpus
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/keyrelay-bench.XXXXXX")
  RAW=$TMP/raw.tsv
  : >"$RAW"
  start_watchdog
  start_targets
  measure_startup
  run_rounds
  if [[ $SKIP_PINS == 1 ]]; then log "memory per pin: skipped (BENCH_SKIP_PINS=1)"
  else measure_pins
  fi

  mkdir -p "$(dirname "$RESULTS")"
  local knobs="BENCH_DURATION=$DURATION BENCH_ROUNDS=$ROUNDS"
  knobs+=" BENCH_OPEN_DURATION=$OPEN_DURATION BENCH_OPEN_ROUNDS=$OPEN_ROUNDS"
  [[ $SKIP_PINS == 1 ]] && knobs+=" BENCH_SKIP_PINS=1"
  [[ $PINS == 1000000 ]] || knobs+=" BENCH_PINS=$PINS"
  [[ $CONNECTIONS == "16 64" ]] || knobs+=" BENCH_CONNECTIONS=\"$CONNECTIONS\""
  [[ $POLL_CONNECTIONS == 16 ]] || knobs+=" BENCH_POLL_CONNECTIONS=\"$POLL_CONNECTIONS\""
  [[ $RATE == 2000 ]] || knobs+=" BENCH_RATE=$RATE"
  python3 "$BENCH_DIR/report.py" "$RAW" \
    --command "$knobs bench/run.sh" \
    --seconds $((SECONDS - t0)) \
    --rate "$RATE" --connections "$CONNECTIONS" --poll-connections "$POLL_CONNECTIONS" \
    --rounds "$ROUNDS" --duration "$DURATION" \
    --open-rounds "$OPEN_ROUNDS" --open-duration "$OPEN_DURATION" \
    --server-cpu "$SERVER_CPU" --client-cpu "$CLIENT_CPU" \
    --versions "$(versions)" >"$RESULTS"
  cp "$RAW" "${RESULTS%.md}.tsv"
  cat "$RESULTS"
  log "table written to $RESULTS (raw figures: ${RESULTS%.md}.tsv); took $((SECONDS - t0))s"
}

main "$@"
