#!/usr/bin/env bash
# quicperf, the tool of the `quic` workload (native/quicperf: a small Rust program on quinn, every crate pinned
# by native/quicperf/Cargo.lock), built from crates.io into the install cache
#   ${TUNNELBENCH_CACHE:-/var/cache/tunnelbench}/quicperf-<tool version>-quinn-<quinn version>/bin/quicperf
# and linked as /usr/local/bin/quicperf (the workload and `tunnelbench doctor` find it on PATH). Idempotent: a
# build whose recorded source hash matches native/quicperf is kept (a second run takes well under a second); a
# changed source is rebuilt (incrementally: cargo's target folder stays in the cache, quicperf-target/).
#
# scripts/setup.sh sources this file and runs the function as one of its steps; run on its own it builds:
#   bash scripts/build-quicperf.sh
quicperf_tool() {
  local repo src cache tool_version quinn dir sum have t0
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  src="$repo/native/quicperf"
  cache="${TUNNELBENCH_CACHE:-/var/cache/tunnelbench}"
  _qp_note() { if declare -F note >/dev/null; then note "$@"; else echo "quicperf: $*"; fi; }
  if ! command -v cargo >/dev/null; then
    _qp_note "skipped: no cargo (the quic workload will say so)"
    return 0
  fi
  tool_version=$(sed -n 's/^const TOOL_VERSION: &str = "\(.*\)";$/\1/p' "$src/src/main.rs")
  quinn=$(awk '$0 == "name = \"quinn\"" {getline; gsub(/[^0-9.]/, "", $0); print; exit}' "$src/Cargo.lock")
  if [ -z "$tool_version" ] || [ -z "$quinn" ]; then
    echo "quicperf: cannot read the tool version or the quinn version from $src" >&2
    return 1
  fi
  dir="$cache/quicperf-${tool_version}-quinn-${quinn}"
  sum=$(cd "$src" && cat Cargo.toml Cargo.lock src/*.rs | sha256sum | cut -d' ' -f1)
  have=$(cat "$dir/source.sha256" 2>/dev/null || true)
  if [ "$have" = "$sum" ] && [ -x "$dir/bin/quicperf" ]; then
    ln -sfn "$dir/bin/quicperf" /usr/local/bin/quicperf
    _qp_note "cached ($dir)"
    return 0
  fi
  t0=$SECONDS
  mkdir -p "$dir/bin"
  # --locked: exactly the crate versions (and checksums) of the committed Cargo.lock
  (cd "$src" && CARGO_TARGET_DIR="$cache/quicperf-target" cargo build --release --locked)
  install -m 0755 "$cache/quicperf-target/release/quicperf" "$dir/bin/quicperf.new"
  mv -f "$dir/bin/quicperf.new" "$dir/bin/quicperf"
  echo "$sum" >"$dir/source.sha256"
  printf '{"name": "quicperf", "version": "%s", "quinn": "%s", "source_sha256": "%s", "rustc": "%s", "built": "%s", "seconds": %d}\n' \
    "$tool_version" "$quinn" "$sum" "$(rustc --version)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" $((SECONDS - t0)) \
    >"$dir/installed.json"
  ln -sfn "$dir/bin/quicperf" /usr/local/bin/quicperf
  "$dir/bin/quicperf" version >/dev/null
  _qp_note "built ${tool_version} on quinn ${quinn} ($dir)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  quicperf_tool
fi
