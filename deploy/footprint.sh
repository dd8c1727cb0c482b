#!/usr/bin/env bash
# The footprint behind deploy/kubernetes/keyrelay.yaml's resource requests: a release
# keyrelay's RSS and CPU idle, then under a short wrk load, against the built-in simulator.
# Everything listens on 127.0.0.1 (ports the kernel picks) and stops by itself.
#
#   cargo build --release && deploy/footprint.sh [SECONDS]     # default 10 s per phase
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
bin=target/release/keyrelay
[[ -x $bin ]] || { echo "build it first: cargo build --release" >&2; exit 1; }
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
dir="$(mktemp -d)"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

wait_for() { # FILE PATTERN: the first match of PATTERN in FILE, waiting up to 20 s
    for _ in $(seq 200); do
        if grep -qoE "$2" "$1"; then grep -m1 -oE "$2" "$1"; return; fi
        sleep 0.1
    done
    echo "timed out waiting for $2 in $1" >&2; cat "$1" >&2; exit 1
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }

"$bin" simulate --listen 127.0.0.1:0 --polls-to-ready 1 --key simkey-footprint-000000000000001,balance=1000000,threads=100000 \
    >"$dir/sim.out" 2>&1 &
pids+=($!)
sim="$(wait_for "$dir/sim.out" 'http://127\.0\.0\.1:[0-9]+')"
cat >"$dir/proxy.toml" <<TOML
listen = "127.0.0.1:0"
upstream = "$sim"
[[keys]]
name = "a"
key = "simkey-footprint-000000000000001"
threads = 100000
TOML
"$bin" --config "$dir/proxy.toml" >"$dir/proxy.out" 2>&1 &
proxy=$!
pids+=("$proxy")
addr="$(wait_for "$dir/proxy.out" 'addr=127\.0\.0\.1:[0-9]+')"
addr="${addr#addr=}"
hz="$(getconf CLK_TCK)"

start="$(cpu_ticks "$proxy")"
sleep "$seconds"
idle_cpu="$(( $(cpu_ticks "$proxy") - start ))"
echo "idle ${seconds}s: RSS $(rss_kib "$proxy") KiB, CPU $(awk -v t="$idle_cpu" -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f", 100 * t / hz / s }') % of a core"

start="$(cpu_ticks "$proxy")"
# Submits and polls (footprint.lua): the whole request path, relayed upstream, pins kept.
wrk -t2 -c32 -d"${seconds}s" -s deploy/footprint.lua "http://$addr" | grep -E 'Requests/sec|Latency'
load_cpu="$(( $(cpu_ticks "$proxy") - start ))"
echo "load ${seconds}s (wrk -t2 -c32, submit then poll): RSS $(rss_kib "$proxy") KiB, peak RSS $(hwm_kib "$proxy") KiB, CPU $(awk -v t="$load_cpu" -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f", 100 * t / hz / s }') % of a core"
echo "(wrk, the simulator and keyrelay share this machine's $(nproc) cores)"
