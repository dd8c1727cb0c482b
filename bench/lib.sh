# shellcheck shell=bash disable=SC2034 # what it sets is read by the scripts that source it
# bench/lib.sh: what the bench scripts stand on, sourced by bench/run.sh: logging, process
# groups stopped on every exit path, the tools (nginx, wrk, redis-server and the like with
# apt-get, oha into bench/.tools), the keyrelay build, free loopback ports, the CPU clock of
# a process group, the nginx configs (the stub, proxy_pass) with a self-signed certificate,
# and a redis-server of the bench's own with its counters.
#
# Sourcing it defines functions and installs the EXIT, INT and TERM traps. The caller sets
# BENCH_DIR (this folder) and REPO first, and may set LOG_TAG (the log lines' prefix); the
# functions read SERVER_CPU and CLIENT_CPU (cores) and TMP (the temp dir, removed on exit).

LOG_TAG=${LOG_TAG:-bench}

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- process bookkeeping ----------------------------------------------------------------
# Every process is started with setsid, so it leads its own process group: one kill of
# the group reaches all of it (nginx's workers, oha's threads, wrk under timeout), and a
# Ctrl-C on the terminal reaches only the script, whose trap then stops the rest.

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

# start_watchdog SECONDS: bounds the run; after SECONDS the script gets SIGTERM.
start_watchdog() {
  start_bg /dev/null bash -c "sleep $1; kill -TERM $$"
}

# --- tools ------------------------------------------------------------------------------

NGINX="" OHA="" BIN="" OHA_JSON=() OHA_THREADS=()

as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

find_nginx() { command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true; }

# ensure_tools COMMAND...: installs with apt-get (one update first, only if something is
# missing) the Debian packages of the commands not found; sets NGINX.
ensure_tools() {
  local missing=() cmd package
  for cmd in "$@"; do
    case $cmd in
      nginx) [[ -n $(find_nginx) ]] && continue ;;
      *) command -v "$cmd" >/dev/null && continue ;;
    esac
    case $cmd in
      taskset | setsid) package=util-linux ;;
      pgrep) package=procps ;;
      redis-cli) package=redis-tools ;;
      *) package=$cmd ;;
    esac
    [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
  done
  if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    # Debian's nginx-light is only a transitional package pulling in nginx plus a module
    # since bookworm, so install nginx itself. Its package scripts may start the system
    # nginx service on port 80; the scripts neither use nor stop that service.
    log "installing ${missing[*]} with apt-get"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  fi
  NGINX=$(find_nginx)
  [[ " $* " != *" nginx "* || -n $NGINX ]] || die "nginx not found after install"
}

# ensure_oha VERSION [OPTION...]: oha from PATH, else from bench/.tools, installed there
# with `cargo install --locked` (a few minutes, once) when missing; dies if its --help
# lacks one of OPTION. Sets OHA, OHA_JSON and OHA_THREADS.
ensure_oha() {
  local version=$1 help option
  shift
  OHA=$(command -v oha || true)
  [[ -n $OHA ]] || OHA=$BENCH_DIR/.tools/bin/oha
  if [[ ! -x $OHA ]]; then
    log "installing oha $version into bench/.tools (a few minutes, once)"
    cargo install oha --version "$version" --locked --root "$BENCH_DIR/.tools" >&2
  fi
  help=$("$OHA" --help)
  for option in "$@"; do
    grep -q -- "$option" <<<"$help" ||
      die "oha at $OHA has no $option, too old: oha $version has it"
  done
  # JSON output is --output-format json in oha >= 1.5 and -j before.
  if grep -q -- '--output-format' <<<"$help"; then OHA_JSON=(--output-format json)
  else OHA_JSON=(-j)
  fi
  # oha's default is one thread per physical core, whatever its affinity: with one core
  # to itself, one thread is right.
  if grep -q -- '--worker-threads' <<<"$help"; then OHA_THREADS=(--worker-threads 1); fi
}

# build_keyrelay: sets BIN to KEYRELAY_BIN, or to the binary `cargo build --release` makes
# (honouring CARGO_TARGET_DIR).
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

# check_cpus: SERVER_CPU and CLIENT_CPU must be cores this process may run on; with one
# core, both become 0.
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

# --- measurement helpers ----------------------------------------------------------------

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

# wait_http PID WHAT CURL-ARGS...: bounded wait (10 s) until curl with CURL-ARGS (a URL and
# its options) gets a 2xx; fails early if PID died, showing the end of $TMP/WHAT.log.
wait_http() {
  local pid=$1 what=$2 _
  shift 2
  for _ in $(seq 200); do
    curl -sf -o /dev/null --max-time 1 "$@" && return 0
    kill -0 "$pid" 2>/dev/null || die "$what exited during startup (log: $(tail -5 "$TMP/$what.log"))"
    sleep 0.05
  done
  die "$what did not answer within 10 s: $*"
}

# --- nginx and the stub -----------------------------------------------------------------

# The stub's answer to in.php: nginx's connection serial and its request count on that
# connection, joined by eight zeros, which neither holds: a new id per request, up to 18
# digits, so a numeric id to keyrelay.
# shellcheck disable=SC2016 # nginx variables, expanded by nginx
STUB_ANSWER='OK|${connection}00000000${connection_requests}'
STUB_ANSWER_RE='^OK\|[1-9][0-9]*00000000[1-9][0-9]*$'
# The stub's answer to every /res.php request: a poll of a task not solved yet. keyrelay's
# own getbalance and threadsinfo reads get it too, which leaves balances and threads unknown.
STUB_POLL_ANSWER=CAPCHA_NOT_READY

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

# stub_server PORT: the stub's server block.
stub_server() {
  cat <<EOF
  server {
    listen 127.0.0.1:$1;
    default_type text/plain;
    location / { return 200 "$STUB_ANSWER"; }
    location = /res.php { return 200 "$STUB_POLL_ANSWER"; }
  }
EOF
}

# proxy_server STUB-PORT SERVER-LINES: an upstream of the stub with keep-alive and a server
# block, SERVER-LINES (its listen line and any other) then proxy_pass to it, as a
# well-configured nginx proxy is set up.
proxy_server() {
  cat <<EOF
  upstream stub {
    server 127.0.0.1:$1;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
$2
    location / {
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
EOF
}

# start_nginx NAME CURL-ARGS...: starts the config nginx_conf NAME wrote on the server core
# and waits until curl with CURL-ARGS gets a 2xx; sets LAST_PID.
start_nginx() {
  local name=$1 dir=$TMP/nginx-$1
  shift
  start_bg "$TMP/nginx-$name.log" taskset -c "$SERVER_CPU" \
    "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;'
  wait_http "$LAST_PID" "nginx-$name" "$@"
}

# make_cert: a self-signed ECDSA P-256 certificate for localhost (and 127.0.0.1), valid two
# days, as $TMP/cert.pem and its key as $TMP/key.pem.
make_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$TMP/openssl.log" ||
    die "openssl req failed: $(tail -3 "$TMP/openssl.log")"
}

# --- redis ------------------------------------------------------------------------------

# start_redis NAME PORT PERSISTENCE(none|aof): a redis-server of the bench's own on
# 127.0.0.1:PORT, on the server core, its files in $TMP/redis-NAME; waits until it answers
# PING; sets LAST_PID. none: no RDB snapshots, no AOF (the least CPU); aof: `appendonly yes`
# with `appendfsync everysec`, the persistence docs/cluster.md asks for.
start_redis() {
  local name=$1 port=$2 dir=$TMP/redis-$1 persistence _
  mkdir -p "$dir"
  case $3 in
    none) persistence=(--appendonly no) ;;
    aof) persistence=(--appendonly yes --appendfsync everysec) ;;
    *) die "start_redis: persistence must be none or aof, got '$3'" ;;
  esac
  start_bg "$TMP/redis-$name.log" taskset -c "$SERVER_CPU" redis-server --bind 127.0.0.1 \
    --port "$port" --dir "$dir" --save "" "${persistence[@]}" --daemonize no --logfile ""
  for _ in $(seq 200); do
    [[ $(redis-cli -h 127.0.0.1 -p "$port" PING 2>/dev/null) == PONG ]] && return 0
    kill -0 "$LAST_PID" 2>/dev/null ||
      die "redis-$name exited during startup (log: $(tail -5 "$TMP/redis-$name.log"))"
    sleep 0.05
  done
  die "redis-$name did not answer PING within 10 s"
}

# redis_snapshot PORT: Redis's counters as "name value" lines: `reads`, the read events it
# has processed (total_reads_processed: a request, or a pipeline, that arrives in one
# segment is one; so one per round trip when requests do not overlap), then each command's
# calls by name (commandstats), INFO's own left out. redis-cli's connection costs two reads:
# the INFO, counted in its own answer, and the end of the connection, counted after it.
redis_snapshot() {
  redis-cli -h 127.0.0.1 -p "$1" INFO stats commandstats | tr -d '\r' | awk -F'[:,=]' '
    $1 == "total_reads_processed" { print "reads", $2 }
    $1 ~ /^cmdstat_/ && $1 != "cmdstat_info" { sub(/^cmdstat_/, "", $1); print $1, $3 }' ||
    die "redis on port $1 did not answer INFO"
}

# redis_delta BEFORE AFTER REQUESTS: from two redis_snapshot files, per request, as "metric
# value" lines: redis_reads (the two redis-cli reads in between left out: the first
# snapshot's end of connection and the second's INFO), redis_cmds, and
# redis_cmd_<name> for each command called in between.
redis_delta() {
  awk -v n="$3" 'FNR == NR { before[$1] = $2; next }
    {
      d = $2 - before[$1]
      if ($1 == "reads") { reads = d - 2; next }
      if (d > 0) { cmds += d; per[$1] = d }
    }
    END {
      if (n == 0) n = 1
      printf "redis_reads %.4f\nredis_cmds %.4f\n", reads / n, cmds / n
      for (c in per) printf "redis_cmd_%s %.4f\n", c, per[c] / n
    }' "$1" "$2"
}

# redis_monitor PORT FILE: starts `redis-cli MONITOR` into FILE and waits (5 s at most)
# until it is attached; sets LAST_PID. MONITOR shows the commands clients send apart from
# those scripts run ("[0 lua]"), which commandstats counts together.
redis_monitor() {
  local _
  start_bg "$2" redis-cli -h 127.0.0.1 -p "$1" MONITOR
  for _ in $(seq 100); do
    [[ $(head -c 2 "$2") == OK ]] && return 0
    sleep 0.05
  done
  die "redis-cli MONITOR on port $1 did not start"
}

# redis_sent FILE REQUESTS: from a MONITOR log, the commands clients sent (not scripts,
# not INFO), per request, as "metric value" lines: redis_sent, and redis_sent_<name> per
# command.
redis_sent() {
  awk -v n="$2" '$2 ~ /^\[/ && $3 != "lua]" {
      name = tolower($4); gsub(/"/, "", name)
      if (name != "info") { sent++; per[name]++ }
    }
    END {
      if (n == 0) n = 1
      printf "redis_sent %.4f\n", sent / n
      for (c in per) printf "redis_sent_%s %.4f\n", c, per[c] / n
    }' "$1"
}
