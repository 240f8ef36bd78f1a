#!/usr/bin/env bash
# The lab's own tools that are built, not packaged, each pinned and cached: hey (the http_api workload's
# load generator, Go module proxy), quicperf (the quic workload's tool, scripts/build-quicperf.sh) and
# inferno (flame graphs of `run --flamegraph`, crates.io). One install path for all three: scripts/setup.sh
# sources this file and runs each as a step (scripts/test builds them all), and `tunnelbench run` runs
#   bash scripts/build-tools.sh NAME
# the first time a scenario that needs NAME is planned (src/tunnelbench/builds.py), so a bare
# `scripts/bench` builds none of them.
export GOTOOLCHAIN=go1.27.3  # the Go toolchain of the Go builds (vpns/install.py GO_TOOLCHAIN)
source "$(dirname "${BASH_SOURCE[0]}")/build-quicperf.sh"

# a step's outcome line: setup.sh's `note`, else printed
_bt_note() { if declare -F note >/dev/null; then note "$@"; else echo "$*"; fi; }

HEY_VERSION=v0.1.5
hey_tool() {
  if command -v hey >/dev/null; then
    _bt_note "present"
  elif command -v go >/dev/null; then
    GOBIN=/usr/local/bin go install "github.com/rakyll/hey@${HEY_VERSION}"
    _bt_note "built ${HEY_VERSION}"
  else
    _bt_note "skipped: no Go toolchain (the http_api workload will say so)"
  fi
}

# src/tunnelbench/diagnostics/cpuprofile.py names the same version (a test keeps the two equal)
INFERNO_VERSION=0.12.8
inferno_tool() {
  local root="${TUNNELBENCH_CACHE:-/var/cache/tunnelbench}/inferno-${INFERNO_VERSION}"
  if [ -x "$root/bin/inferno-flamegraph" ] && [ -x "$root/bin/inferno-collapse-perf" ]; then
    _bt_note "cached"
  elif command -v cargo >/dev/null; then
    cargo install --locked --quiet inferno --version "${INFERNO_VERSION}" --root "$root"
    _bt_note "built ${INFERNO_VERSION}"
  else
    _bt_note "skipped: no cargo (run --flamegraph will say so)"
  fi
}

# the native impairment engine (Rust, native/impaird; Cargo.lock pins its crates): impairment other than a
# rate on a kernel without netem. setup.sh builds it as its own step; a lean set-up leaves it to first use
impaird_tool() {
  local dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/native/impaird"
  if [ ! -f "$dir/Cargo.toml" ] || ! command -v cargo >/dev/null; then
    _bt_note "skipped: no cargo (kernels with netem do not need it)"
    return 0
  fi
  (cd "$dir" && cargo build --release)
  _bt_note "built $dir/target/release/impaird"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  for name in "$@"; do
    case $name in
      hey) hey_tool ;;
      quicperf) quicperf_tool ;;
      inferno) inferno_tool ;;
      impaird) impaird_tool ;;
      *) echo "build-tools.sh: no tool $name (hey, quicperf, inferno, impaird)" >&2; exit 2 ;;
    esac
  done
fi
