#!/usr/bin/env bash
# bench/passthrough-bin.sh: builds benches/passthrough.rs in release mode and prints the path
# of its executable. A bench target's file name carries a hash, so cargo is asked for it.
# Used by run.sh (target D) and instructions.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --bench passthrough --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "passthrough" and m.get("executable"):
        print(m["executable"])'
