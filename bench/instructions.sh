#!/usr/bin/env bash
# bench/instructions.sh: user-space instructions per relayed request (an `in.php` submit or
# a `res.php` poll), counted by callgrind, for proxies in front of the same nginx stub:
#   nginx             nginx proxy_pass with upstream keepalive (the yardstick of bench/run.sh)
#   passthrough       benches/passthrough.rs: a lean hyper server and keyrelay's upstream
#                     client relaying every request unchanged, with none of keyrelay's work
#                     (the floor under it)
#   keyrelay          keyrelay with 3 keys, pins in memory, --log warn
#   keyrelay-durable  the same with the shipped default, the durable pin journal
#   keyrelay-cluster  keyrelay-durable plus `[cluster]` on a redis-server of its own (unix
#                     socket, no persistence, flushed before each run); only keyrelay's
#                     instructions are counted, not Redis's. Not in the default targets:
#                     INSTR_TARGETS="keyrelay-durable keyrelay-cluster" compares the two.
# Every target runs on one thread (nginx one worker, the others a current-thread runtime;
# keyrelay with --threads 1), so like is compared with like: left to size its runtime from
# the machine's CPUs, keyrelay would count a second worker's hand-offs too.
#
# Five requests (INSTR_MODES, default `get post`): get,
# `GET /in.php?…method=userrecaptcha…&json=1`; post, `POST /in.php` with bench/wrk.lua's
# 219-byte urlencoded base64 submit; create, `POST /createTask` with the same image task as
# a JSON task API client sends it (keyrelay targets only: keyrelay turns it into the post's
# in.php submit, so create / post is what the JSON front costs); poll,
# `GET /res.php?key=…&action=get&id=<id>&json=1`, which the stub answers `CAPCHA_NOT_READY`;
# and close, the get with `Connection: close`, so that every request comes on a new
# connection (as 2captcha-python's do) and the count includes accepting and closing it. keyrelay relays a poll only for a task pinned
# to one of its keys, so before a poll run the script submits once through the target and
# polls the id it was answered (every target alike).
#
# Instruction counts do not depend on what else the machine is doing, so this is the figure
# optimisations are compared by (docs/performance.md). Each count covers the whole process
# life, start-up included, divided by the requests served: start-up is a few million
# instructions, under 0.2k per request at these volumes.
#
#   bench/instructions.sh                         # every target, GET and POST, 20 s each
#   INSTR_TARGETS="keyrelay" INSTR_MODES=get bench/instructions.sh
#   INSTR_MODES="get post poll" bench/instructions.sh   # the res.php poll too
#   INSTR_TARGETS=keyrelay INSTR_MODES="post create" bench/instructions.sh  # the JSON front
#   INSTR_MODES=close bench/instructions.sh      # a new connection per request
#   INSTR_DURATION=10 KEYRELAY_BIN=/path/to/keyrelay bench/instructions.sh
#   INSTR_KEEP=/tmp/cg bench/instructions.sh     # keep the callgrind files for annotation
#
# Loopback only, free ports, and everything it starts is stopped on any exit.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")
DURATION=${INSTR_DURATION:-20}
TARGETS=${INSTR_TARGETS:-nginx passthrough keyrelay keyrelay-durable}
MODES=${INSTR_MODES:-get post}
CALLER=callercallercallercallercaller99
QUERY="key=$CALLER&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https%3A%2F%2Fexample.com%2Flogin&json=1"

log() { printf '[instructions %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

TMP=$(mktemp -d /tmp/keyrelay-instr.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in valgrind callgrind_annotate nginx wrk curl python3; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install valgrind nginx wrk curl python3)"
done

cd "$REPO"
if [[ -n ${KEYRELAY_BIN:-} ]]; then
  KEYRELAY=$KEYRELAY_BIN
else
  log "building keyrelay (release)"
  cargo build --release --quiet
  KEYRELAY=${CARGO_TARGET_DIR:-$REPO/target}/release/keyrelay
fi
PASSTHROUGH=""
if [[ " $TARGETS " == *" passthrough "* ]]; then
  log "building benches/passthrough.rs (release)"
  PASSTHROUGH=$("$BENCH_DIR/passthrough-bin.sh" 2>/dev/null)
  [[ -x $PASSTHROUGH ]] || die "could not find the passthrough bench executable"
fi

read -r STUB PROXY < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')

nginx_conf() { # FILE SERVER-BLOCK: one worker, in the foreground, no access log
  cat >"$1" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $TMP/nginx-$(basename "$1").pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $TMP/body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
$2
}
EOF
}

wait_answer() { # URL PID WHAT: valgrind starts slowly, so allow 60 s
  local i
  for i in $(seq 600); do
    curl -sf -o /dev/null --max-time 1 "$1" && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited during start-up (log: $(tail -3 "$TMP/$3.log"))"
    sleep 0.1
  done
  die "$3 did not answer $1"
}

nginx_conf "$TMP/stub.conf" "  server {
    listen 127.0.0.1:$STUB;
    default_type text/plain;
    # A new numeric task id per request, as in bench/run.sh, so every submit pins a new
    # task; every res.php request (polls, keyrelay's balance and threads reads) not ready.
    location / { return 200 \"OK|\${connection}00000000\${connection_requests}\"; }
    location = /res.php { return 200 \"CAPCHA_NOT_READY\"; }
  }"
nginx -p "$TMP" -e "$TMP/nginx-error.log" -c "$TMP/stub.conf" >"$TMP/stub.log" 2>&1 &
PIDS+=($!)
wait_answer "http://127.0.0.1:$STUB/in.php" "$!" stub

nginx_conf "$TMP/proxy.conf" "  upstream stub { server 127.0.0.1:$STUB; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY;
    location / {
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
keyrelay_conf() { # FILE TOP-LEVEL-LINES TRAILING-SECTION
  cat >"$1" <<EOF
listen = "127.0.0.1:$PROXY"
upstream = "http://127.0.0.1:$STUB"
$2
[[keys]]
name = "bench-1"
key = "benchkey000000000000000000000001"
[[keys]]
name = "bench-2"
key = "benchkey000000000000000000000002"
[[keys]]
name = "bench-3"
key = "benchkey000000000000000000000003"
$3
EOF
}
keyrelay_conf "$TMP/keyrelay.toml" "" $'[pins]\ndurable = false'
# The shipped default: the durable journal, here in a data_dir of its own.
keyrelay_conf "$TMP/keyrelay-durable.toml" "data_dir = \"$TMP/data\"" ""
REDIS_SOCK=$TMP/redis.sock
keyrelay_conf "$TMP/keyrelay-cluster.toml" "data_dir = \"$TMP/data\"" \
  "$(printf '[cluster]\nredis = "redis+unix://%s"\nreplica = "instr"' "$REDIS_SOCK")"

for target in $TARGETS; do
  case $target in
    nginx | passthrough | keyrelay | keyrelay-durable | keyrelay-cluster) ;;
    *) die "unknown target $target (nginx, passthrough, keyrelay, keyrelay-durable, keyrelay-cluster)" ;;
  esac
done
for mode in $MODES; do
  [[ $mode == get || $mode == post || $mode == poll || $mode == close || $mode == create ]] ||
    die "unknown mode $mode (get, post, poll, close, create)"
done

if [[ " $TARGETS " == *" keyrelay-cluster "* ]]; then
  for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install redis-server redis-tools)"
  done
  redis-server --port 0 --unixsocket "$REDIS_SOCK" --save "" --appendonly no --dir "$TMP" \
    >"$TMP/redis.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    [[ $(redis-cli -s "$REDIS_SOCK" PING 2>/dev/null) == PONG ]] && break
    sleep 0.1
  done
  [[ $(redis-cli -s "$REDIS_SOCK" PING 2>/dev/null) == PONG ]] || die "redis-server did not start"
fi

# wait_shared PID: a keyrelay-cluster target in shared mode (keyrelay_cluster_up 1), its
# first heartbeat through, so that the run measures it on Redis and not on its own share.
wait_shared() {
  local i metrics
  for i in $(seq 600); do
    metrics=$(curl -sf --max-time 1 "http://127.0.0.1:$PROXY/metrics" || true)
    awk '$1 ~ /^keyrelay_cluster_up([{]|$)/ && $2 == 1 { up = 1 } END { exit !up }' \
      <<<"$metrics" && return 0
    kill -0 "$1" 2>/dev/null || die "keyrelay-cluster exited during start-up"
    sleep 0.1
  done
  die "keyrelay-cluster did not reach shared mode (log: $(tail -3 "$TMP/keyrelay-cluster.log"))"
}

# poll_url TARGET: sets POLL_URL to a res.php poll of a task the proxy knows: one submit
# through it, the id of its "OK|<id>", and one poll of that id, which must be answered
# CAPCHA_NOT_READY, through keyrelay with no probe counted in keyrelay_probes_total (the
# task's pin found). keyrelay's default [polling] answers a poll that soon itself (its own
# CAPCHA_NOT_READY, docs/polling.md), so its poll row counts that shaped answer: what a
# script polling faster than every 5 s costs.
POLL_URL=""
probes_total() {
  curl -sf --max-time 5 "http://127.0.0.1:$PROXY/metrics" |
    awk '$1 ~ /^keyrelay_probes_total([{]|$)/ { n += $2 } END { printf "%d\n", n }' ||
    die "no /metrics from keyrelay"
}
poll_url() {
  local body url probes="" after
  body=$(curl -sf --max-time 5 "http://127.0.0.1:$PROXY/in.php?$QUERY") ||
    die "$1 poll: the submit before it failed"
  [[ $body =~ ^OK\|[0-9]+$ ]] ||
    die "$1 poll: unexpected answer to the submit: ${body:0:80}"
  url="http://127.0.0.1:$PROXY/res.php?key=$CALLER&action=get&id=${body#OK|}&json=1"
  [[ $1 != keyrelay* ]] || probes=$(probes_total)
  body=$(curl -sf --max-time 5 -D "$TMP/poll.headers" "$url") ||
    die "$1 poll: the poll failed: $url"
  [[ $body == CAPCHA_NOT_READY || ($1 == keyrelay* && $body == *'"request":"CAPCHA_NOT_READY"'*) ]] ||
    die "$1 poll: answered '${body:0:80}', not CAPCHA_NOT_READY: $url"
  if [[ $1 == keyrelay* ]]; then
    after=$(probes_total)
    [[ $after == "$probes" ]] ||
      die "$1 poll: the task had no pin (keyrelay probed for it): $url"
  fi
  POLL_URL=$url
}

# measure TARGET MODE: one run under callgrind; appends a row to the table.
measure() {
  local target=$1 mode=$2 cmd pid requests total out=$TMP/cg.$1.$2
  if [[ $mode == create && $target != keyrelay* ]]; then
    log "$target create: skipped (only keyrelay serves the JSON task API)"
    return
  fi
  case $target in
    nginx) cmd=(nginx -p "$TMP" -e "$TMP/nginx-error.log" -c "$TMP/proxy.conf") ;;
    passthrough) cmd=("$PASSTHROUGH" --serve "127.0.0.1:$PROXY" "http://127.0.0.1:$STUB") ;;
    keyrelay | keyrelay-durable | keyrelay-cluster)
      rm -rf "$TMP/data"
      # Each run starts on an empty Redis: no leases left by the last one to renew.
      [[ $target != keyrelay-cluster ]] || redis-cli -s "$REDIS_SOCK" FLUSHALL >/dev/null
      cmd=("$KEYRELAY" --config "$TMP/$target.toml" --log warn --threads 1)
      ;;
  esac
  log "$target $mode: under callgrind, wrk -t1 -c4 for ${DURATION}s"
  valgrind --tool=callgrind --callgrind-out-file="$out" "${cmd[@]}" >"$TMP/$target.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_answer "http://127.0.0.1:$PROXY/in.php?$QUERY" "$pid" "$target"
  [[ $target != keyrelay-cluster ]] || wait_shared "$pid"
  # get and close send the URL as given (close with `Connection: close`; for poll, a
  # res.php URL); wrk.lua's post mode sends its POST /in.php instead.
  local url="http://127.0.0.1:$PROXY/in.php?$QUERY" wrk_mode=$mode
  if [[ $mode == poll ]]; then
    poll_url "$target"
    url=$POLL_URL wrk_mode=get
  fi
  requests=$(wrk -t1 -c4 -d"${DURATION}s" -s "$BENCH_DIR/wrk.lua" "$url" -- "$wrk_mode" |
    sed -n 's/^BENCH requests=\([0-9]*\) .*/\1/p')
  # SIGTERM: keyrelay drains and exits, nginx exits, the pass-through dies; callgrind writes
  # its counts in every case. (Not SIGINT: a non-interactive shell starts background jobs
  # with SIGINT ignored, and the pass-through installs no handler.)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  [[ -n $total && ${requests:-0} -gt 0 ]] || die "$target $mode: no count (log: $(tail -3 "$TMP/$target.log"))"
  python3 -c "import sys; n, t = int(sys.argv[1]), int(sys.argv[2]); print(f'| $target | $mode | {n:,} | {t:,} | {t / n / 1000:.1f}k |')" \
    "$requests" "$total" >>"$TMP/table"
  if [[ -n ${INSTR_KEEP:-} ]]; then
    mkdir -p "$INSTR_KEEP"
    cp "$out" "$INSTR_KEEP/"
  fi
}

printf '| target | request | requests | instructions | per request |\n| --- | --- | --: | --: | --: |\n' >"$TMP/table"
for target in $TARGETS; do
  for mode in $MODES; do measure "$target" "$mode"; done
done
cat "$TMP/table"
