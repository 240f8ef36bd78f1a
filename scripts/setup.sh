#!/usr/bin/env bash
# Idempotent set-up on a fresh machine of this kind (Debian 12, root): system packages, the Python
# environment in .venv, the VPNs built from module registries, and the native impairment engine. Fast when
# everything is already there. One line per step with its duration; what apt, pip, go and cargo print goes
# to a log file (named at the end, and its tail shown when a step fails). TB_SETUP_VERBOSE=1 shows it all.
set -euo pipefail
cd "$(dirname "$0")/.."

# the Go toolchain of every Go build (hey here, the VPNs' in `tunnelbench install`: vpns/install.py GO_TOOLCHAIN);
# the go command fetches it from the module proxy like a module (~10 s once)
export GOTOOLCHAIN=go1.27.3

LOG_DIR="${TB_SETUP_LOG_DIR:-/var/log/tunnelbench}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/setup-$(date +%Y%m%d-%H%M%S)-$$.log"
: >"$LOG"
T_SETUP=$SECONDS

# step NAME FUNCTION: run FUNCTION (in a subshell with errexit on: a failing command inside ends the step)
# with its output in the log; one line with the outcome (`note TEXT` sets it) and the duration
NOTE_FILE="$LOG.note"
note() { echo "$*" >"$NOTE_FILE"; }
step() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "== $name" >>"$LOG"
  : >"$NOTE_FILE"
  set +e
  if [ -n "${TB_SETUP_VERBOSE:-}" ]; then
    (set -e; "$@") 2>&1 | tee -a "$LOG" >&2
    rc=${PIPESTATUS[0]}
  else
    (set -e; "$@") >>"$LOG" 2>&1
    rc=$?
  fi
  set -e
  if ((rc)); then
    echo "setup: $name FAILED (exit $rc, $((SECONDS - t0)) s); the step's last lines (all in $LOG):" >&2
    awk -v m="== $name" '$0 == m {f = 1} f' "$LOG" | tail -n 40 | sed 's/^/  | /' >&2
    return $rc
  fi
  local what
  what=$(cat "$NOTE_FILE" 2>/dev/null || true)
  echo "setup: $name: ${what:-ok} ($((SECONDS - t0)) s)" >&2
}

# Lab tools and the Debian VPNs (versions are fixed by the release and are recorded with every result by
# the drivers and `tunnelbench doctor`). wireguard-go, nebula and yggdrasil default to newer upstream
# builds from the Go module proxy (below / scripts/bench); their Debian packages are the NAME@debian builds.
APT_PACKAGES=(
  iproute2 iputils-ping fping iperf3 nftables iptables ethtool procps kmod openssl tcpdump
  wireguard-tools wireguard-go nebula tinc openvpn
  fastd n2n yggdrasil protobuf-compiler libprotobuf-dev  # VPN drivers from Debian (issue 4; yggdrasil@debian)
  openssh-server openssh-client
  nginx curl rist-tools  # workloads: http_download/http_api/many_clients (nginx, curl), streaming (RIST)
  sockperf iperf  # workloads: request/response latency (sockperf), the iperf2 engine of tcp/udp (seed 002's tool)
  linux-perf  # per-case CPU profiles of the VPN daemons (flame graphs, `run --flamegraph`)
)
# only the tests need these (the report's page in a headless browser): scripts/test sets TB_SETUP_TESTS=1
if [ -n "${TB_SETUP_TESTS:-}" ]; then
  APT_PACKAGES+=(chromium)
fi
apt_packages() {
  local need=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
  done
  if ((${#need[@]} == 0)); then
    note "all ${#APT_PACKAGES[@]} installed"
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}"
  note "installed ${#need[@]}: ${need[*]}"
}
step "Debian packages" apt_packages

# Python >= 3.11 environment with tunnelbench installed editable, plus the test tools unless the set-up is
# lean (a bare scripts/bench: what the run needs only). Installed by uv (pinned, from PyPI like pip, ~10 s
# instead of pip's ~50-65 s on a fresh 2-core machine); pip if uv cannot be installed.
UV_VERSION=0.13.9
python_env() {
  local want=test have extras="[test]"
  if [ -n "${TB_SETUP_LEAN:-}" ]; then want=runtime extras=""; fi
  have=$(cat .venv/.installed 2>/dev/null || true)
  if [ -x .venv/bin/tunnelbench ] && [ ! pyproject.toml -nt .venv/.installed ] \
    && { [ "$have" = test ] || [ "$have" = "$want" ]; }; then
    note "up to date ($have)"
    return 0
  fi
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if .venv/bin/pip install -q "uv==${UV_VERSION}"; then
    # the platform's certificate store, which pip and apt trust too (uv's own bundle refuses a registry
    # reached through a local CA when SSL_CERT_FILE is not set)
    UV_SYSTEM_CERTS=1 .venv/bin/uv pip install --python .venv/bin/python -e ".${extras}"
  else
    .venv/bin/pip install -e ".${extras}"
  fi
  echo "$want" >.venv/.installed
  note "installed ${want:-runtime} ($(.venv/bin/python --version))"
}
step "Python environment (.venv)" python_env

# the tools built rather than packaged (hey, quicperf, inferno): scripts/build-tools.sh, the same path
# `tunnelbench run` takes on first use. TB_SETUP_LEAN=1 (a bare scripts/bench) leaves them to that first use.
source scripts/build-tools.sh
lean() { note "left for first use (a scenario that needs it builds it: tunnelbench plan says so)"; }
if [ -n "${TB_SETUP_LEAN:-}" ]; then
  step "hey ${HEY_VERSION}" lean
  step "quicperf (cargo build --locked)" lean
else
  step "hey ${HEY_VERSION}" hey_tool
  step "quicperf (cargo build --locked)" quicperf_tool
fi

# VPNs built from the Go module proxy and crates.io at pinned versions, into the install cache
# (/var/cache/tunnelbench/<name>-<version>, TUNNELBENCH_CACHE overrides): cached builds are skipped, so
# only a fresh machine pays for them (about 25 min on 2 cores, see the README). SKIP_VPN_BUILDS=1 skips
# them all (scripts/bench does: the run then installs what its scenario needs on first use, src/tunnelbench/builds.py).
vpn_builds() {
  local out="$LOG.install" rc=0
  COLUMNS=160 .venv/bin/tunnelbench install all >"$out" 2>&1 || rc=$?
  cat "$out"
  # the outcome line: how many builds were cached, built, impossible here or failed
  note "$(grep -o '│ \(cached\|built\|installed\|impossible here\|failed[^│]*\) ' "$out" | sed 's/ *$//' | sort \
    | uniq -c | awk '{c=$1; $1=""; sub(/^ │ /, ""); printf "%s%d %s", (n++ ? ", " : ""), c, $0}')"
  rm -f "$out"
  return $rc
}
if [ -z "${SKIP_VPN_BUILDS:-}" ]; then
  # a user's set-up goes on without a VPN whose build failed (that VPN is then skipped as unavailable,
  # with the reason); CI must not: its tests would skip instead of running
  if ! step "VPN builds (tunnelbench install all)" vpn_builds; then
    echo "setup: some VPN installs failed (per-VPN logs in /var/cache/tunnelbench/logs/)" >&2
    [ -z "${CI:-}" ] || exit 1
  fi
fi

# inferno (crates.io, pinned): folds `perf script` stacks and draws the flame graphs of `run --flamegraph`.
# About 40 s to build once (248 s on a fresh 2-core machine), then cached.
if [ -n "${TB_SETUP_LEAN:-}" ]; then
  step "inferno ${INFERNO_VERSION} (flame graphs)" lean
else
  step "inferno ${INFERNO_VERSION} (flame graphs)" inferno_tool
fi

# The native impairment engine (Rust), used where the kernel has no netem (scripts/build-tools.sh; a lean
# set-up leaves it to the first scenario, calibrate or bench-engine that impairs)
if [ -n "${TB_SETUP_LEAN:-}" ]; then
  step "native engine (cargo build --release)" lean
else
  step "native engine (cargo build --release)" impaird_tool
fi

rm -f "$NOTE_FILE"
echo "setup: done in $((SECONDS - T_SETUP)) s; log: $LOG" >&2
