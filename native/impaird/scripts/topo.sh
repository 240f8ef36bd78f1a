#!/usr/bin/env bash
# Manual lab topology for impaird: h1 -- r -- h2 (same as e2e.sh), left up.
#   scripts/topo.sh up PFX     # PFX like tbdev1a2b- ; prints the namespace names
#   scripts/topo.sh down PFX
# Then: ip netns exec ${PFX}r target/release/impaird --config CFG.json
set -euo pipefail
cmd="$1"; PFX="$2"
H1="${PFX}h1"; R="${PFX}r"; H2="${PFX}h2"
case "$cmd" in
up)
  for ns in "$H1" "$R" "$H2"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
  ip link add name a0 netns "$H1" type veth peer name a1 netns "$R"
  ip link add name b0 netns "$H2" type veth peer name b1 netns "$R"
  ip -n "$H1" addr add 10.50.1.2/24 dev a0; ip -n "$H1" link set a0 up
  ip -n "$R" addr add 10.50.1.1/24 dev a1; ip -n "$R" link set a1 up
  ip -n "$R" addr add 10.50.2.1/24 dev b1; ip -n "$R" link set b1 up
  ip -n "$H2" addr add 10.50.2.2/24 dev b0; ip -n "$H2" link set b0 up
  ip -n "$H1" route add 10.50.2.0/24 via 10.50.1.1
  ip -n "$H2" route add 10.50.1.0/24 via 10.50.2.1
  ip netns exec "$R" sysctl -qw net.ipv4.ip_forward=1
  ip netns exec "$R" iptables -t mangle -A FORWARD -j NFQUEUE --queue-num 0
  echo "$H1 $R $H2" ;;
down)
  for ns in "$H1" "$R" "$H2"; do ip netns del "$ns" 2>/dev/null || true; done ;;
*) echo "usage: $0 up|down PFX" >&2; exit 2 ;;
esac
