#!/usr/bin/env bash
# quicperf, the tool of the `quic` workload (native/quicperf: a small Go program on quic-go, pinned with its
# checksums in native/quicperf/go.mod and go.sum), built with the Go module proxy into the install cache
#   ${TUNNELBENCH_CACHE:-/var/cache/tunnelbench}/quicperf-<tool version>-quic-go-<version>/bin/quicperf
# and linked as /usr/local/bin/quicperf (the workload and `tunnelbench doctor` find it on PATH). Idempotent:
# a build whose recorded source hash matches native/quicperf is kept (a second run takes well under a second);
# a changed source is rebuilt in place.
#
# scripts/setup.sh sources this file and runs the function as one of its steps; run on its own it builds:
#   bash scripts/build-quicperf.sh
quicperf_tool() {
  local repo src tool_version quic_go dir sum have t0
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  src="$repo/native/quicperf"
  _qp_note() { if declare -F note >/dev/null; then note "$@"; else echo "quicperf: $*"; fi; }
  if ! command -v go >/dev/null; then
    _qp_note "skipped: no Go toolchain (the quic workload will say so)"
    return 0
  fi
  tool_version=$(sed -n 's/^const toolVersion = "\(.*\)"$/\1/p' "$src/main.go")
  quic_go=$(awk '$1 == "github.com/quic-go/quic-go" {print $2}' "$src/go.mod")
  if [ -z "$tool_version" ] || [ -z "$quic_go" ]; then
    echo "quicperf: cannot read the tool version or the quic-go pin from $src" >&2
    return 1
  fi
  dir="${TUNNELBENCH_CACHE:-/var/cache/tunnelbench}/quicperf-${tool_version}-quic-go-${quic_go#v}"
  sum=$(cd "$src" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)
  have=$(cat "$dir/source.sha256" 2>/dev/null || true)
  if [ "$have" = "$sum" ] && [ -x "$dir/bin/quicperf" ]; then
    ln -sfn "$dir/bin/quicperf" /usr/local/bin/quicperf
    _qp_note "cached ($dir)"
    return 0
  fi
  t0=$SECONDS
  mkdir -p "$dir/bin"
  # -mod=readonly: every module is checked against the committed go.sum; no VCS stamping (a dirty tree is fine)
  (cd "$src" && CGO_ENABLED=0 go build -mod=readonly -trimpath -buildvcs=false -o "$dir/bin/quicperf.new" .)
  mv -f "$dir/bin/quicperf.new" "$dir/bin/quicperf"
  echo "$sum" >"$dir/source.sha256"
  printf '{"name": "quicperf", "version": "%s", "quic_go": "%s", "source_sha256": "%s", "go": "%s", "built": "%s", "seconds": %d}\n' \
    "$tool_version" "$quic_go" "$sum" "$(go env GOVERSION)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" $((SECONDS - t0)) \
    >"$dir/installed.json"
  ln -sfn "$dir/bin/quicperf" /usr/local/bin/quicperf
  "$dir/bin/quicperf" version >/dev/null
  _qp_note "built ${tool_version} on quic-go ${quic_go} ($dir)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  quicperf_tool
fi
