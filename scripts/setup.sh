#!/usr/bin/env bash
# Idempotent set-up on a fresh machine of this kind (Debian 12, root): system packages, the Python
# environment in .venv, and the native impairment engine. Fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# Lab tools and the Debian VPNs (versions are fixed by the release and are recorded with every result by
# the drivers and `tunnelbench doctor`). wireguard-go, nebula and yggdrasil default to newer upstream
# builds from the Go module proxy (below / scripts/bench); their Debian packages are the NAME@debian builds.
APT_PACKAGES=(
  iproute2 iputils-ping fping iperf3 nftables iptables ethtool procps kmod openssl tcpdump
  wireguard-tools wireguard-go nebula tinc openvpn
  fastd n2n yggdrasil protobuf-compiler libprotobuf-dev  # VPN drivers from Debian (issue 4; yggdrasil@debian)
  openssh-server openssh-client
  nginx curl rist-tools  # workloads: http_download/http_api/many_clients (nginx, curl), streaming (RIST)
  chromium
)
need=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Python >= 3.11 environment with tunnelbench installed editable, plus test tools.
if [ ! -x .venv/bin/tunnelbench ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: creating the Python environment in .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.installed
fi

# hey, the HTTP load generator of the http_api workload (Go module proxy, pinned; not packaged by Debian).
HEY_VERSION=v0.1.5
if ! command -v hey >/dev/null && command -v go >/dev/null; then
  echo "setup: go install github.com/rakyll/hey@${HEY_VERSION}" >&2
  GOBIN=/usr/local/bin go install "github.com/rakyll/hey@${HEY_VERSION}"
fi

# VPNs built from the Go module proxy and crates.io at pinned versions, into the install cache
# (/var/cache/tunnelbench/<name>-<version>, TUNNELBENCH_CACHE overrides): cached builds are skipped, so
# only a fresh machine pays for them (about 25 min on 2 cores, see the README). SKIP_VPN_BUILDS=1 skips
# them all (scripts/bench then builds only the default scenario's: `tunnelbench install --for-scenario default`).
if [ -z "${SKIP_VPN_BUILDS:-}" ]; then
  # a user's set-up goes on without a VPN whose build failed (that VPN is then skipped as unavailable,
  # with the reason); CI must not: its tests would skip instead of running
  if ! .venv/bin/tunnelbench install all; then
    echo "setup: some VPN installs failed (see the table above and /var/cache/tunnelbench/logs/)" >&2
    [ -z "${CI:-}" ] || exit 1
  fi
fi

# The native impairment engine (Rust), used where the kernel has no netem.
if [ -f native/impaird/Cargo.toml ] && command -v cargo >/dev/null; then
  (cd native/impaird && cargo build --release --quiet)
fi
