#!/usr/bin/env bash
# keyrelay's TLS paths against nginx with `ssl`, side by side, on loopback only (issue 13 §5).
#
#   bench/tls.sh                                        # defaults: 3 rounds of 10 s runs
#   TLS_BENCH_ROUNDS=2 TLS_BENCH_DURATION=5 bench/tls.sh  # a quicker pass
#
# Three targets, all in front of the same nginx stub (S), which answers in.php with
# "OK|<id>", a new numeric task id per request, as bench/run.sh's stub A does:
#   N  nginx `listen ... ssl` (TLS 1.3 only, keepalive) proxy_pass to S: the yardstick;
#   K  keyrelay's `[tls]` listener with the same certificate and key files, 3 keys,
#      upstream S, every other setting at its default (durable pin journal included);
#   F  the same keyrelay's forward proxy: `CONNECT ocr.captchaai.com:443` to its plain
#      listener, then the requests over TLS inside the tunnel, with the leaf its local CA
#      issues for that host (issued once, then cached).
# And two plain-HTTP references, so that TLS's own share can be read off:
#   B  the same nginx, a plain `listen` beside the ssl one, same proxy_pass (bench/run.sh's B);
#   C  the same keyrelay's plain listener, direct requests (bench/run.sh's C).
# The certificate is a self-signed ECDSA P-256 one for localhost made with openssl in the
# temp dir; the client (oha, rustls) is told --insecure, so its own verification is the
# same for all three and is not measured anyway: only the server's CPU is.
# Two measurements, each target in turn (B C N K F, B C N K F, ...) for TLS_BENCH_ROUNDS rounds:
#   keepalive  GET /in.php submits at a fixed TLS_BENCH_RATE (2,000 req/s), oha -c16 with
#              keep-alive: CPU per request once the connections are up;
#   handshake  the same GET at a fixed TLS_BENCH_HANDSHAKE_RATE (200/s) with
#              --disable-keepalive: every request on a new TCP connection and a new TLS
#              handshake (for F, a new CONNECT, then the handshake): CPU per
#              connection + handshake + request.
# CPU is the target's own (user + system, every thread), from its processes' CPU clocks
# just before and just after each run, as bench/run.sh reads it; the stub behind is not
# counted. Tables: median and min-max across rounds.
#
# Knobs (environment):
#   TLS_BENCH_ROUNDS=3            rounds (N K F each, both measurements)
#   TLS_BENCH_DURATION=10         seconds per run
#   TLS_BENCH_RATE=2000           request rate of the keepalive runs (req/s)
#   TLS_BENCH_HANDSHAKE_RATE=200  request (= connection) rate of the handshake runs
#   TLS_BENCH_CONNECTIONS=16      oha connections (concurrency)
#   TLS_BENCH_WARMUP=2            seconds of warm-up per target and measurement
#   TLS_BENCH_SERVER_CPU=0        core for the servers (stub, nginx, keyrelay)
#   TLS_BENCH_CLIENT_CPU=1        core for oha
#   TLS_BENCH_MAX_RUNTIME=1200    seconds after which the whole run is stopped
#   TLS_BENCH_RESULTS=bench/results/latest-tls.md  where the table goes (.tsv beside it)
#   KEYRELAY_BIN=path             the keyrelay binary; else /tmp/keyrelay-tls-bench if it
#                                 exists, else `cargo build --release`
#
# It listens on 127.0.0.1 only, on free ports, stops every process it started and removes
# its temp dir on any exit. Needs nginx, openssl, curl, python3, taskset, and oha in
# bench/.tools/bin (bench/run.sh installs it) or on PATH.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")

ROUNDS=${TLS_BENCH_ROUNDS:-3}
DURATION=${TLS_BENCH_DURATION:-10}
RATE=${TLS_BENCH_RATE:-2000}
HS_RATE=${TLS_BENCH_HANDSHAKE_RATE:-200}
CONNS=${TLS_BENCH_CONNECTIONS:-16}
WARMUP=${TLS_BENCH_WARMUP:-2}
SERVER_CPU=${TLS_BENCH_SERVER_CPU:-0}
CLIENT_CPU=${TLS_BENCH_CLIENT_CPU:-1}
MAX_RUNTIME=${TLS_BENCH_MAX_RUNTIME:-1200}
RESULTS=${TLS_BENCH_RESULTS:-$BENCH_DIR/results/latest-tls.md}

# As bench/run.sh: three fake keys in the pool, another one sent by the client.
POOL_KEYS=(benchkey000000000000000000000001 benchkey000000000000000000000002
           benchkey000000000000000000000003)
CLIENT_KEY=0123456789abcdef0123456789abcdef
GET_QUERY="key=$CLIENT_KEY&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https%3A%2F%2Fexample.com%2Flogin&json=1"
# shellcheck disable=SC2016 # nginx variables, expanded by nginx
STUB_ANSWER='OK|${connection}00000000${connection_requests}'
STUB_ANSWER_RE='^OK\|[1-9][0-9]*00000000[1-9][0-9]*$'
STUB_POLL_ANSWER=CAPCHA_NOT_READY
FORWARD_HOST=ocr.captchaai.com
TARGETS=(B C N K F)

log() { printf '[tls-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_knobs() {
  local name
  for name in ROUNDS DURATION RATE HS_RATE CONNS WARMUP SERVER_CPU CLIENT_CPU MAX_RUNTIME; do
    [[ ${!name} =~ ^[0-9]+$ ]] || die "knob $name must be a whole number, got '${!name}'"
  done
  ((ROUNDS > 0 && DURATION > 0 && RATE > 0 && HS_RATE > 0 && CONNS > 0)) ||
    die "TLS_BENCH_ROUNDS, _DURATION, _RATE, _HANDSHAKE_RATE and _CONNECTIONS must be > 0"
}

# --- process bookkeeping (as bench/run.sh) ----------------------------------------------
set +m
PGIDS=() TMP="" LAST_PID=""

forget_pg() {
  local keep=() pg
  for pg in "${PGIDS[@]}"; do [[ $pg == "$1" ]] || keep+=("$pg"); done
  PGIDS=("${keep[@]}")
}

stop_pg() {
  local pg=$1 i
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

start_bg() {
  local logfile=$1
  shift
  setsid "$@" >"$logfile" 2>&1 </dev/null &
  LAST_PID=$!
  PGIDS+=("$LAST_PID")
}

run_fg() {
  start_bg "$@"
  local pid=$LAST_PID rc=0
  wait "$pid" || rc=$?
  forget_pg "$pid"
  return "$rc"
}

# --- tools ------------------------------------------------------------------------------
NGINX="" OHA="" BIN="" OHA_THREADS=()

find_tools() {
  NGINX=$(command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true)
  [[ -n $NGINX ]] || die "nginx not found (bench/run.sh installs it with apt-get)"
  local t
  for t in openssl curl python3 taskset setsid; do
    command -v "$t" >/dev/null || die "$t not found"
  done
  OHA=$BENCH_DIR/.tools/bin/oha
  [[ -x $OHA ]] || OHA=$(command -v oha || true)
  [[ -x $OHA ]] || die "oha not found: run bench/run.sh once (it installs oha into bench/.tools)"
  local help
  help=$("$OHA" --help)
  if ! { grep -q -- '--disable-keepalive' <<<"$help" && grep -q -- '--insecure' <<<"$help" &&
    grep -q -- '--output-format' <<<"$help"; }; then
    die "oha at $OHA is too old (need >= 1.5)"
  fi
  if grep -q -- '--worker-threads' <<<"$help"; then OHA_THREADS=(--worker-threads 1); fi
  if [[ -n ${KEYRELAY_BIN:-} ]]; then
    BIN=$KEYRELAY_BIN
  elif [[ -x /tmp/keyrelay-tls-bench ]]; then
    BIN=/tmp/keyrelay-tls-bench
  else
    log "cargo build --release"
    (cd "$REPO" && cargo build --release --bin keyrelay >&2)
    BIN=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/keyrelay
  fi
  [[ -x $BIN ]] || die "no keyrelay binary at $BIN"
  if (($(nproc) < 2)); then
    log "warning: one core; servers and load generator share it"
    SERVER_CPU=0 CLIENT_CPU=0
  fi
  { taskset -c "$SERVER_CPU" true && taskset -c "$CLIENT_CPU" true; } ||
    die "cannot pin to cores $SERVER_CPU and $CLIENT_CPU"
}

free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# cpu_ns PGID...: each process group's CPU time in ns, from its processes' CPU clocks (as
# bench/run.sh).
cpu_ns() {
  python3 - "$@" <<'EOF'
import ctypes, ctypes.util, os, sys, time
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
tick_ns = 10**9 // os.sysconf("SC_CLK_TCK")
groups = {int(g): 0 for g in sys.argv[1:]}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        pgrp = int(fields[2])
        if pgrp not in groups:
            continue
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(int(pid), ctypes.byref(clock)) == 0:
            groups[pgrp] += time.clock_gettime_ns(clock.value)
        else:
            groups[pgrp] += (int(fields[11]) + int(fields[12])) * tick_ns
    except OSError:
        pass
print(" ".join(str(groups[int(g)]) for g in sys.argv[1:]))
EOF
}

# machine_now: "total steal busy children" in ticks (as bench/run.sh).
machine_now() {
  local _ user nice system idle iowait irq softirq steal f
  read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
  read -r -a f <<<"$(sed 's/.*) //' "/proc/$$/stat")"
  echo "$((user + nice + system + idle + iowait + irq + softirq + steal)) $steal" \
    "$((user + nice + system + irq + softirq)) $((f[13] + f[14]))"
}

# wait_url PID WHAT CURL-ARGS...: bounded wait (10 s) for a 2xx; fails early if PID died.
wait_url() {
  local pid=$1 what=$2 i
  shift 2
  for i in $(seq 200); do
    curl -sf -o /dev/null --max-time 1 "$@" && return 0
    kill -0 "$pid" 2>/dev/null || die "$what exited during startup (log: $(tail -5 "$TMP/$what.log"))"
    sleep 0.05
  done
  die "$what did not answer within 10 s: $*"
}

RAW=""
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RAW"; }

# --- servers ----------------------------------------------------------------------------
declare -A PG=() URL=() OHA_ARGS=() CURL_ARGS=()
PORT_S="" PORT_N="" PORT_K="" PORT_KT="" PORT_B=""

nginx_conf() { # NAME SERVER-BLOCKS
  local name=$1 servers=$2 dir=$TMP/nginx-$1
  mkdir -p "$dir/tmp"
  cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  keepalive_requests 1000000;
$servers
}
EOF
}

start_nginx() { # NAME CURL-ARGS...
  local name=$1 dir=$TMP/nginx-$1
  shift
  start_bg "$TMP/nginx-$name.log" taskset -c "$SERVER_CPU" \
    "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;'
  wait_url "$LAST_PID" "nginx-$name" "$@"
}

make_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$TMP/openssl.log" ||
    die "openssl req failed: $(tail -3 "$TMP/openssl.log")"
}

start_targets() {
  read -r PORT_S PORT_N PORT_K PORT_KT PORT_B <<<"$(free_ports 5)"
  make_cert

  nginx_conf stub "  server {
    listen 127.0.0.1:$PORT_S;
    default_type text/plain;
    location / { return 200 \"$STUB_ANSWER\"; }
    location = /res.php { return 200 \"$STUB_POLL_ANSWER\"; }
  }"
  start_nginx stub "http://127.0.0.1:$PORT_S/healthz"
  PG[S]=$LAST_PID

  # nginx's TLS defaults otherwise: session tickets on, no shared session cache.
  nginx_conf tls "  upstream stub {
    server 127.0.0.1:$PORT_S;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$PORT_N ssl;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.3;
    location / {
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }
  server {
    listen 127.0.0.1:$PORT_B;
    location / {
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
  start_nginx tls -k "https://localhost:$PORT_N/healthz"
  PG[N]=$LAST_PID PG[B]=$LAST_PID
  URL[B]=http://127.0.0.1:$PORT_B CURL_ARGS[B]="" OHA_ARGS[B]=""
  URL[N]=https://localhost:$PORT_N
  CURL_ARGS[N]="-k"
  OHA_ARGS[N]="--insecure"

  # keyrelay: bench/run.sh's keyrelay_conf (durable journal in the temp dir, 3 keys), plus
  # the [tls] listener on the same files. The local CA (for F's leaves) is generated in
  # data_dir at start.
  {
    printf 'listen = "127.0.0.1:%s"\nupstream = "http://127.0.0.1:%s"\n' "$PORT_K" "$PORT_S"
    printf 'data_dir = "%s"\n' "$TMP/keyrelay.data"
    local i=0 k
    for k in "${POOL_KEYS[@]}"; do
      i=$((i + 1))
      printf '\n[[keys]]\nname = "bench-%s"\nkey = "%s"\n' "$i" "$k"
    done
    printf '\n[tls]\nlisten = "127.0.0.1:%s"\ncert = "%s"\nkey = "%s"\n' \
      "$PORT_KT" "$TMP/cert.pem" "$TMP/key.pem"
  } >"$TMP/proxy.toml"
  start_bg "$TMP/keyrelay.log" taskset -c "$SERVER_CPU" "$BIN" --config "$TMP/proxy.toml" --log warn
  wait_url "$LAST_PID" keyrelay "http://127.0.0.1:$PORT_K/healthz"
  wait_url "$LAST_PID" keyrelay -k "https://localhost:$PORT_KT/healthz"
  PG[K]=$LAST_PID PG[F]=$LAST_PID PG[C]=$LAST_PID
  URL[C]=http://127.0.0.1:$PORT_K CURL_ARGS[C]="" OHA_ARGS[C]=""
  URL[K]=https://localhost:$PORT_KT
  CURL_ARGS[K]="-k"
  OHA_ARGS[K]="--insecure"
  URL[F]=https://$FORWARD_HOST
  CURL_ARGS[F]="-k -x http://127.0.0.1:$PORT_K"
  # No DNS lookup of the target host: the proxy is dialled, never the host.
  OHA_ARGS[F]="--insecure -x http://127.0.0.1:$PORT_K --no-pre-lookup"

  local t body
  for t in "${TARGETS[@]}"; do
    # shellcheck disable=SC2086
    body=$(curl -sf --max-time 3 ${CURL_ARGS[$t]} "${URL[$t]}/in.php?$GET_QUERY") ||
      die "target $t: request failed: ${URL[$t]}/in.php"
    [[ $body =~ $STUB_ANSWER_RE ]] || die "target $t: unexpected answer ${body:0:80}"
  done
  # F must have been served by keyrelay's pool, not tunnelled somewhere.
  # shellcheck disable=SC2086
  curl -sf --max-time 3 -D "$TMP/f.headers" -o /dev/null ${CURL_ARGS[F]} \
    "${URL[F]}/in.php?$GET_QUERY" || die "target F: request failed"
  grep -qi '^x-keyrelay-key: bench-' "$TMP/f.headers" ||
    die "target F: the answer carries no X-Keyrelay-Key; not served by the pool"
  TLS_INFO=""
  local p
  for p in "$PORT_N" "$PORT_KT"; do
    TLS_INFO+="$(openssl s_client -connect "127.0.0.1:$p" -servername localhost -brief \
      </dev/null 2>&1 | awk -F': *' '/^Protocol version|^Ciphersuite/ { printf "%s ", $2 }')"$'\n'
  done
  log "targets up: stub :$PORT_S  B nginx :$PORT_B  C keyrelay :$PORT_K  N nginx ssl :$PORT_N  K keyrelay tls :$PORT_KT" \
    " F keyrelay CONNECT via :$PORT_K (servers on core $SERVER_CPU, oha on core $CLIENT_CPU)"
  log "negotiated (openssl s_client): N: ${TLS_INFO%%$'\n'*}  K: $(sed -n 2p <<<"$TLS_INFO")"
}

# --- runs -------------------------------------------------------------------------------

# run_oha ROUND TARGET MODE(keepalive|handshake) SECONDS: ROUND 0 is warm-up, not kept.
run_oha() {
  local round=$1 t=$2 mode=$3 secs=$4 out=$TMP/oha.json cpu0 cpu1 m0 m1 rate=$RATE extra=()
  if [[ $mode == handshake ]]; then rate=$HS_RATE extra=(--disable-keepalive); fi
  # shellcheck disable=SC2206
  local targs=(${OHA_ARGS[$t]})
  read -r cpu0 <<<"$(cpu_ns "${PG[$t]}")"
  m0=$(machine_now)
  run_fg "$TMP/oha.log" timeout $((secs + 30)) taskset -c "$CLIENT_CPU" \
    "$OHA" -q "$rate" -z "${secs}s" -c "$CONNS" -w --latency-correction --no-tui \
    "${OHA_THREADS[@]}" --output-format json -o "$out" "${extra[@]}" "${targs[@]}" \
    "${URL[$t]}/in.php?$GET_QUERY" || die "oha failed: $(tail -3 "$TMP/oha.log")"
  m1=$(machine_now)
  read -r cpu1 <<<"$(cpu_ns "${PG[$t]}")"
  ((round > 0)) || return 0
  python3 - "$out" "$cpu0" "$cpu1" "$m0" "$m1" "$(getconf CLK_TCK)" >"$TMP/oha.stats" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
cpu0, cpu1 = int(sys.argv[2]), int(sys.argv[3])
m0, m1 = [list(map(int, a.split())) for a in sys.argv[4:6]]
tick = 1e9 / int(sys.argv[6])
codes = {int(k): v for k, v in d.get("statusCodeDistribution", {}).items()}
n = sum(codes.values())
errors = sum(v for k, v in codes.items() if not 200 <= k < 300)
errors += sum(d.get("errorDistribution", {}).values())
pct = d["latencyPercentiles"]
total = (m1[0] - m0[0]) * tick or 1
other = max(0, (m1[2] - m0[2]) * tick - (cpu1 - cpu0) - (m1[3] - m0[3]) * tick)
print(f"requests {n}")
print(f"rps {n / d['summary']['total']:.1f}")
for name, key in (("p50_us", "p50"), ("p99_us", "p99")):
    print(f"{name} {(pct[key] or 0) * 1e6:.1f}")
print(f"errors {errors}")
print(f"cpu_us {(cpu1 - cpu0) / 1e3 / max(n, 1):.2f}")
print(f"steal_pct {(m1[1] - m0[1]) * tick * 100 / total:.2f}")
print(f"other_pct {other * 100 / total:.1f}")
EOF
  local metric value
  local -A m=()
  while read -r metric value; do
    record "$round" "$t" "$mode" "$metric" "$value"
    m[$metric]=$value
  done <"$TMP/oha.stats"
  printf '  %-9s %s %7.0f req/s  p50 %6.0f µs  p99 %6.0f µs  cpu %7.2f µs/req  errors %s  other load %.1f%%\n' \
    "$mode" "$t" "${m[rps]}" "${m[p50_us]}" "${m[p99_us]}" "${m[cpu_us]}" "${m[errors]}" \
    "${m[other_pct]}" >&2
}

run_rounds() {
  local t r mode
  log "warm-up: ${WARMUP}s per target and measurement"
  for t in "${TARGETS[@]}"; do
    run_oha 0 "$t" keepalive "$WARMUP"
    run_oha 0 "$t" handshake "$WARMUP"
  done
  for r in $(seq "$ROUNDS"); do
    log "round $r/$ROUNDS"
    for mode in keepalive handshake; do
      for t in "${TARGETS[@]}"; do run_oha "$r" "$t" "$mode" "$DURATION"; done
    done
  done
}

report() { # SECONDS COMMAND
  python3 - "$RAW" "$1" "$2" "$RATE" "$HS_RATE" "$CONNS" "$ROUNDS" "$DURATION" "$SERVER_CPU" \
    "$CLIENT_CPU" "$VERSIONS" "$TLS_INFO" <<'EOF'
import collections, statistics, sys
raw, secs, cmd, rate, hs_rate, conns, rounds, dur, scpu, ccpu, versions, tls_info = sys.argv[1:]
v = collections.defaultdict(list)
for line in open(raw):
    r, t, mode, metric, value = line.rstrip("\n").split("\t")
    v[(t, mode, metric)].append(float(value))
T = ["B", "C", "N", "K", "F"]
def med(t, mode, metric):
    xs = v.get((t, mode, metric))
    return statistics.median(xs) if xs else None
def cell(t, mode, metric, fmt="{:,.1f}", spread=True):
    xs = v.get((t, mode, metric))
    if not xs:
        return "n/a"
    s = fmt.format(statistics.median(xs))
    if spread and len(xs) > 1:
        s += " (" + fmt.format(min(xs)) + "–" + fmt.format(max(xs)) + ")"
    return s
def ratio(t, mode, metric):
    a, b = med(t, mode, metric), med("N", mode, metric)
    return f"{a / b:.2f}×" if a is not None and b else ""
steal = [x for k, xs in v.items() if k[2] == "steal_pct" for x in xs]
other = [x for k, xs in v.items() if k[2] == "other_pct" for x in xs]
cores = open("/proc/cpuinfo").read().count("processor\t:")
print("### TLS and the forward proxy\n")
print(f"- Machine: {cores} cores; servers pinned to core {scpu}, oha to core {ccpu}.")
print(f"- Command: `{cmd}`: {rounds} interleaved rounds (B C N K F) of {dur} s per run, "
      f"medians and (min–max) across rounds; the whole run took {secs} s.")
print(f"- Versions: {versions}.")
n_info, k_info = (tls_info.splitlines() + ["", ""])[:2]
print(f"- Negotiated (openssl s_client): N: {n_info.strip() or '?'}; "
      f"K: {k_info.strip() or '?'}.")
if steal:
    print(f"- Steal time: max {max(steal):.2f} %; other load: median "
          f"{statistics.median(other):.1f} %, max {max(other):.1f} % of all CPU time.")
print("- N: nginx `ssl` (TLS 1.3) proxy_pass to the stub; K: keyrelay's `[tls]` listener, "
      "same certificate and key files (self-signed ECDSA P-256), 3 keys, defaults otherwise; "
      f"F: the same keyrelay's forward proxy, `CONNECT {'ocr.captchaai.com'}:443` to its "
      "plain listener and TLS inside with a cached leaf from its local CA. "
      "B and C, plain-HTTP references: the same nginx with a plain `listen`, the same "
      "keyrelay's plain listener. CPU is the server's own, not the stub's.\n")
print("| measurement | B: nginx plain | C: keyrelay plain | N: nginx ssl | K: keyrelay [tls] | F: keyrelay CONNECT | K vs N | F vs N | goal |")
print("| --- | --: | --: | --: | --: | --: | --: | --: | --- |")
def rows(mode, title, goal_cpu):
    print(f"| **{title}** | | | | | | | | |")
    k = med("K", mode, "cpu_us"); n = med("N", mode, "cpu_us")
    goal = ""
    if goal_cpu and k is not None and n:
        goal = "K ≤ 1.2× " + ("✓" if k <= 1.2 * n else "✗")
    print("| server CPU µs/req | " + " | ".join(cell(t, mode, "cpu_us", "{:,.1f}") for t in T)
          + f" | {ratio('K', mode, 'cpu_us')} | {ratio('F', mode, 'cpu_us')} | {goal} |")
    # TLS's own share: each TLS target minus its plain reference, medians.
    tls = {"N": ("N", "B"), "K": ("K", "C"), "F": ("F", "C")}
    d = {}
    for t, (a, b) in tls.items():
        x, y = med(a, mode, "cpu_us"), med(b, mode, "cpu_us")
        d[t] = x - y if x is not None and y is not None else None
    f = lambda x: "n/a" if x is None else f"{x:,.1f}"
    r = lambda x: f"{d[x] / d['N']:.2f}×" if d[x] is not None and d["N"] else ""
    print(f"| TLS's share, µs/req (N − B, K − C, F − C) | — | — | {f(d['N'])} | {f(d['K'])} "
          f"| {f(d['F'])} | {r('K')} | {r('F')} | |")
    print("| req/s | " + " | ".join(cell(t, mode, "rps", "{:,.0f}", False) for t in T) + " | | | |")
    for m, name in (("p50_us", "p50 µs"), ("p99_us", "p99 µs")):
        print(f"| {name} | " + " | ".join(cell(t, mode, m, "{:,.0f}", False) for t in T)
              + f" | {ratio('K', mode, m)} | {ratio('F', mode, m)} | |")
    print("| errors, all rounds | " + " | ".join(
        f"{int(sum(v.get((t, mode, 'errors'), [0])))}" for t in T) + " | | | |")
rows("keepalive", f"GET /in.php?…, fixed rate {int(rate):,} req/s, oha -c{conns}, keep-alive", True)
rows("handshake", f"GET /in.php?…, fixed rate {int(hs_rate):,}/s, oha -c{conns} --disable-keepalive: "
     "a new connection and TLS handshake per request (F: a new CONNECT too)", False)
EOF
}

main() {
  local t0=$SECONDS
  check_knobs
  find_tools
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/keyrelay-tlsbench.XXXXXX")
  RAW=$TMP/raw.tsv
  : >"$RAW"
  start_bg /dev/null bash -c "sleep $MAX_RUNTIME; kill -TERM $$"
  start_targets
  run_rounds
  local tree
  tree=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)
  VERSIONS="keyrelay $BIN (the script at $tree), nginx $("$NGINX" -v 2>&1 | sed 's|.*/||'), $(openssl version | awk '{ print $1, $2 }'), oha $("$OHA" --version | awk '{ print $2 }')"
  local cmd="TLS_BENCH_ROUNDS=$ROUNDS TLS_BENCH_DURATION=$DURATION"
  [[ $RATE == 2000 ]] || cmd+=" TLS_BENCH_RATE=$RATE"
  [[ $HS_RATE == 200 ]] || cmd+=" TLS_BENCH_HANDSHAKE_RATE=$HS_RATE"
  [[ $CONNS == 16 ]] || cmd+=" TLS_BENCH_CONNECTIONS=$CONNS"
  mkdir -p "$(dirname "$RESULTS")"
  report $((SECONDS - t0)) "$cmd bench/tls.sh" >"$RESULTS"
  cp "$RAW" "${RESULTS%.md}.tsv"
  cat "$RESULTS"
  log "table written to $RESULTS (raw figures: ${RESULTS%.md}.tsv); took $((SECONDS - t0))s"
}

main "$@"
