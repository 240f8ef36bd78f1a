#!/usr/bin/env bash
# End-to-end check of impaird in three throwaway network namespaces:
#   h1 (10.50.1.2) -- r (10.50.1.1 | 10.50.2.1) -- h2 (10.50.2.2)
# r forwards and queues every forwarded packet to NFQUEUE 0 (no bypass).
# Needs root, iproute2, iptables, iperf3, python3. Traffic stays inside the
# namespaces. Cleans up (namespaces, processes it started) on any exit.
#
#   scripts/e2e.sh            # all checks (~3 min)
#   QUICK=1 scripts/e2e.sh    # shorter runs
#   OUT=/tmp/x scripts/e2e.sh # keep results there
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
BIN="${IMPAIRD:-$ROOT/target/release/impaird}"
PROBE="$HERE/udp_probe.py"
[ -x "$BIN" ] || { echo "build first: (cd $ROOT && cargo build --release)" >&2; exit 1; }

PFX="tbdev$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')-"
H1="${PFX}h1"; R="${PFX}r"; H2="${PFX}h2"
OUT="${OUT:-$(mktemp -d /tmp/impaird-e2e.XXXXXX)}"
mkdir -p "$OUT"
T="${QUICK:+2}"; T="${T:-5}"        # iperf3 seconds
N="${QUICK:+4000}"; N="${N:-10000}" # probe packets
PIDS=()
DPID=""

cleanup() {
  set +e
  for p in "${PIDS[@]}" $DPID; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${PIDS[@]}" $DPID; do kill -9 "$p" 2>/dev/null; done
  for ns in "$H1" "$R" "$H2"; do ip netns del "$ns" 2>/dev/null; done
  echo "cleaned up namespaces ${PFX}*; results in $OUT"
}
trap cleanup EXIT INT TERM

log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
res() { echo "   $*" | tee -a "$OUT/summary.txt"; }

# ---- topology --------------------------------------------------------------
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
# fail closed: no --queue-bypass
ip netns exec "$R" iptables -t mangle -A FORWARD -j NFQUEUE --queue-num 0
res "namespaces: $H1 $R $H2 (offloads left at veth defaults: $(ip netns exec "$H1" ethtool -k a0 2>/dev/null | grep -E '^tcp-segmentation-offload' || echo 'ethtool n/a'))"

# ---- helpers ---------------------------------------------------------------
# cfg NAME 'RULES_JSON_ARRAY' [extra top-level json]
cfg() {
  cat >"$OUT/$1.json" <<EOF
{"queue": 0, "queue_maxlen": ${MAXLEN:-8192}, "stats_path": "$OUT/$1.stats.json",
 "stats_interval_ms": 200, "seed": 12345, "realtime": true,
 "rules": $2}
EOF
  "$BIN" --check-config "$OUT/$1.json" >/dev/null
}

start() { # start NAME
  stop
  ip netns exec "$R" "$BIN" --config "$OUT/$1.json" 2>>"$OUT/$1.log" &
  DPID=$!
  for _ in $(seq 50); do [ -s "$OUT/$1.stats.json" ] && break; sleep 0.1; done
  [ -s "$OUT/$1.stats.json" ] || { echo "impaird did not start:"; cat "$OUT/$1.log"; exit 1; }
  CUR="$1"
}

stop() {
  if [ -n "$DPID" ]; then kill "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; DPID=""; fi
}

st() { # st KEY -> value from current stats file
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d$1)" "$OUT/$CUR.stats.json" 2>/dev/null
}

probe() { # probe TAG COUNT PPS [fast_ms] -> $OUT/TAG.probe.json
  local fast="${4:-}"
  rm -f "$OUT/$1.ready"
  ip netns exec "$H2" python3 "$PROBE" recv 10.50.2.2 9999 "$OUT/$1.probe.json" ${fast:+--fast-ms $fast} --ready "$OUT/$1.ready" >/dev/null &
  local rp=$!; PIDS+=("$rp")
  for _ in $(seq 100); do [ -e "$OUT/$1.ready" ] && break; sleep 0.05; done
  # sender at a low SCHED_FIFO priority (below impaird's 50) so that its
  # timestamps are not taken long before the packet really leaves
  ip netns exec "$H1" chrt -f 10 python3 "$PROBE" send 10.50.2.2 9999 "$2" "$3"
  wait "$rp" || true
}

pj() { python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print($2)" "$OUT/$1.probe.json"; }

iperf_srv() {
  ip netns exec "$H2" iperf3 -s -D -1 -p "${1:-5201}" --pidfile "$OUT/iperf3.pid" >/dev/null 2>&1
  sleep 0.3
  PIDS+=("$(cat "$OUT/iperf3.pid")")
}

tcp() { # tcp TAG STREAMS
  iperf_srv
  local c0 p0 c1 p1 u0 u1
  c0=$(st "['cpu_s']"); p0=$(st "['packets_in']"); u0=$(st "['cpu_user_s']")
  local t0; t0=$(date +%s.%N)
  local s0; s0=$(head -1 /proc/stat)
  ip netns exec "$H1" iperf3 -c 10.50.2.2 -t "$T" -P "$2" --json >"$OUT/$1.iperf.json" 2>&1 || true
  local t1; t1=$(date +%s.%N)
  local s1; s1=$(head -1 /proc/stat)
  sleep 0.3
  c1=$(st "['cpu_s']"); p1=$(st "['packets_in']"); u1=$(st "['cpu_user_s']")
  python3 - "$OUT/$1.iperf.json" "$c0" "$c1" "$p0" "$p1" "$t0" "$t1" "$u0" "$u1" "$s0" "$s1" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
f, c0, c1, p0, p1, t0, t1, u0, u1 = sys.argv[1], *map(float, sys.argv[2:10])
a = [int(x) for x in sys.argv[10].split()[1:9]]
b = [int(x) for x in sys.argv[11].split()[1:9]]
dd = [y - x for x, y in zip(a, b)]
tot = sum(dd) or 1
machine = f"machine idle {100*dd[3]/tot:.0f}%, steal {100*dd[7]/tot:.0f}%"
d = json.load(open(f))
e = d["end"]
gbps = e["sum_received"]["bits_per_second"] / 1e9
rtx = e["sum_sent"].get("retransmits")
pk = p1 - p0
dt = t1 - t0
cpu_us = (c1 - c0) / pk * 1e6 if pk else float("nan")
print(f"   {gbps:.2f} Gbit/s, retransmits {rtx}, {pk/dt/1e3:.0f} kpps through impaird, "
      f"impaird CPU {c1-c0:.2f} s = {cpu_us:.2f} us/packet ({(c1-c0)/dt*100:.0f}% of a core; "
      f"user part {(u1-u0)/pk*1e6 if pk else 0:.2f} us/packet); {machine}")
EOF
}

# ---- 1. delay: ping 25 ms each way ----------------------------------------
log "1. delay 25 ms each way: ping -i 0.01 -c 500"
cfg delay '[{"name":"h1->h2","src":"10.50.1.0/24","dst":"10.50.2.0/24","delay_us":25000},
            {"name":"h2->h1","src":"10.50.2.0/24","dst":"10.50.1.0/24","delay_us":25000}]'
ip netns exec "$H1" ping -q -c 200 -i 0.01 10.50.2.2 >"$OUT/base.ping" 2>&1 || true # before daemon: must fail (fail closed)
res "no daemon yet (fail closed): $(grep -E 'packets transmitted' "$OUT/base.ping")"
start delay
ip netns exec "$H1" ping -q -c 500 -i 0.01 10.50.2.2 >"$OUT/delay.ping" 2>&1 || true
res "$(grep -E 'packets transmitted|rtt' "$OUT/delay.ping" | tr '\n' ' ')"
res "impaird release lateness mean $(st "['release_late_us_mean']") us, max $(st "['release_late_us_max']") us; timer overshoot estimate $(st "['timer_overshoot_us']") us"
stop
cfg zero '[]'
start zero
ip netns exec "$H1" ping -q -c 200 -i 0.01 10.50.2.2 >"$OUT/zero.ping" 2>&1 || true
res "no rules (base through impaird): $(grep rtt "$OUT/zero.ping")"

# ---- 2. delay + jitter distributions (one-way, probe) ----------------------
log "2. one-way delay 20 ms +- 5 ms: uniform (sd theory 2.887) and normal (sd 5)"
for dist in uniform normal; do
  cfg "jit-$dist" "[{\"name\":\"j\",\"src\":\"10.50.1.0/24\",\"dst\":\"10.50.2.0/24\",\"delay_us\":20000,\"jitter_us\":5000,\"distribution\":\"$dist\"}]"
  start "jit-$dist"
  probe "jit-$dist" "$N" 2000
  res "$dist: impaird release lateness mean $(st "['release_late_us_mean']") us; probe: $(pj "jit-$dist" "'mean %.3f ms sd %.3f ms (sd without 1%% extremes %.3f) median %.3f, late arrivals (tfifo reordering) %d of %d' % (d['delay_ms']['mean'], d['delay_ms']['sd'], d['delay_ms']['sd_trim1'], d['delay_ms']['median'], d['late_arrivals'], d['received'])")"
done

# ---- 3. loss models ---------------------------------------------------------
log "3. loss (one direction, probe $N packets)"
cfg loss '[{"name":"l","src":"10.50.1.0/24","dst":"10.50.2.0/24","loss":{"model":"random","p":0.05}}]'
start loss; probe loss "$N" 4000
res "random 5%: $(pj loss "'loss %.4f (3 sigma %.4f), daemon dropped %s of %s' % (d['loss'], 3*(0.05*0.95/d['sent'])**0.5, '$(st "['dropped_loss']")', '$(st "['packets_in']")')")"
cfg ge '[{"name":"g","src":"10.50.1.0/24","dst":"10.50.2.0/24","loss":{"model":"gemodel","p":0.01,"r":0.25}}]'
start ge; probe ge "$((N*2))" 4000
res "gemodel p=1% r=25%: $(pj ge "'loss %.4f (theory %.4f), mean burst %.2f (theory 4.00), bursts %d' % (d['loss'], 0.01/0.26, d['mean_burst_len'], d['loss_bursts'])")"
cfg st '[{"name":"s","src":"10.50.1.0/24","dst":"10.50.2.0/24","loss":{"model":"state","p13":0.02,"p31":0.4,"p32":0.2,"p23":0.3,"p14":0.01}}]'
start st; probe st "$N" 4000
res "4-state p13=2% p31=40% p32=20% p23=30% p14=1%: $(pj st "'loss %.4f (stationary theory 0.0619)' % d['loss']")"

# ---- 4. reorder, duplicate, corrupt ----------------------------------------
log "4. reorder 25% with 10 ms delay; duplicate 5%; corrupt 2%"
cfg ro '[{"name":"r","src":"10.50.1.0/24","dst":"10.50.2.0/24","delay_us":10000,"reorder":{"p":0.25}}]'
start ro; probe ro "$N" 2000 5
res "reorder: $(pj ro "'share sent at once %.4f (want 0.25), late arrivals %d' % (d['fast_share'], d['late_arrivals'])"), daemon reordered $(st "['reordered']") of $(st "['packets_in']")"
cfg dup '[{"name":"d","src":"10.50.1.0/24","dst":"10.50.2.0/24","delay_us":5000,"duplicate":{"p":0.05}}]'
start dup; probe dup "$N" 2000
res "duplicate: $(pj dup "'duplicates received %d of %d = %.4f (want 0.05)' % (d['duplicates'], d['received'], d['duplicates']/d['received'])"), daemon duplicates_sent $(st "['duplicates_sent']"), inject_errors $(st "['inject_errors']")"
ip netns exec "$H2" nstat -n >/dev/null 2>&1 || true
cfg cor '[{"name":"c","src":"10.50.1.0/24","dst":"10.50.2.0/24","corrupt":{"p":0.02}}]'
start cor; probe cor "$N" 4000
csum=$(ip netns exec "$H2" nstat -az UdpInCsumErrors 2>/dev/null | awk '/UdpInCsumErrors/{print $2}')
res "corrupt: $(pj cor "'received %d of %d (loss %.4f)' % (d['received'], d['sent'], d['loss'])"); h2 UdpInCsumErrors $csum; daemon corrupted $(st "['corrupted']")"

# ---- 5. TCP throughput ------------------------------------------------------
log "5. iperf3 TCP ($T s), offloads on"
cfg tcp0 '[{"name":"f","src":"10.50.1.0/24","dst":"10.50.2.0/24"},{"name":"b","src":"10.50.2.0/24","dst":"10.50.1.0/24"}]'
start tcp0
res "0 ms, 1 stream:"; tcp tcp0-1 1
res "0 ms, 4 streams:"; tcp tcp0-4 4
MAXLEN=16384 cfg tcp20 '[{"name":"f","src":"10.50.1.0/24","dst":"10.50.2.0/24","delay_us":10000},{"name":"b","src":"10.50.2.0/24","dst":"10.50.1.0/24","delay_us":10000}]'
start tcp20
res "20 ms RTT (10 ms each way), 1 stream:"; tcp tcp20-1 1
ip netns exec "$H1" ping -q -i 0.02 -c 150 10.50.2.2 >"$OUT/tcp20.ping" 2>&1 &
pp=$!; PIDS+=("$pp")
res "20 ms RTT, 4 streams (ping alongside):"; tcp tcp20-4 4
wait "$pp" || true
res "ping during the 4-stream transfer: $(grep rtt "$OUT/tcp20.ping")"
res "release lateness mean $(st "['release_late_us_mean']") us, max $(st "['release_late_us_max']") us; max_queue_depth $(st "['max_queue_depth']"), kernel queue dropped $(st "['kernel_queue_dropped']"), user dropped $(st "['kernel_user_dropped']"), overflow $(st "['dropped_overflow']")"

# ---- 6. per wire packet with offloads on -----------------------------------
snmp() { # snmp NS PROTO FIELD -> counter from /proc/net/snmp of that namespace
  ip netns exec "$1" awk -v p="$2:" -v f="$3" '$1==p && !h {for(i=2;i<=NF;i++) n[i]=$i; h=1; next} $1==p && h {for(i=2;i<=NF;i++) if(n[i]==f) print $i}' /proc/net/snmp
}
log "6. GSO: TCP with 1% loss h1->h2, offloads on: super-packets whole, loss per wire packet"
cfg gso '[{"name":"f","src":"10.50.1.0/24","dst":"10.50.2.0/24","loss":{"model":"random","p":0.01}}]'
start gso
tx0=$(ip netns exec "$H1" cat /sys/class/net/a0/statistics/tx_packets)
ce0=$(snmp "$H2" Tcp InCsumErrors)
tcp gso 1
tx1=$(ip netns exec "$H1" cat /sys/class/net/a0/statistics/tx_packets)
ce1=$(snmp "$H2" Tcp InCsumErrors)
res "$(python3 -c "
import json;d=json.load(open('$OUT/gso.stats.json'));r=d['rules']['f']
e=json.load(open('$OUT/gso.iperf.json'))['end']['sum_sent']
b=e['bytes']; rtx=e['retransmits']
print('wire packets decided %d (%.0f payload bytes each on average; h1 a0 sent %d skbs); dropped %d = %.4f per wire packet (want 0.0100); iperf3 retransmits %d = %.2f x dropped' % (r['packets_in'], b/max(1,r['packets_in']), $tx1-$tx0, r['dropped_loss'], r['dropped_loss']/max(1,r['packets_in']), rtx, rtx/max(1,r['dropped_loss'])))
print('   super-packets %d: whole %d, segmented %d (%d wire packets released from them), dropped whole %d; size mismatches %d, split lost %d; h2 TcpInCsumErrors +%d' % (d['gso_packets'], d['gso_whole'], d['gso_segmented'], d['segments_injected'], d['gso_dropped_whole'], d['gso_size_mismatch'], d['split_lost'], $ce1-$ce0))")"

log "6b. UDP GSO (UDP_SEGMENT, 45 x 1312-byte datagrams per send, as tailscale): 2% loss, 1% duplicate"
GSO_PROBE="$HERE/udp_gso.py"
udp_gso() { # udp_gso TAG SENDS
  rm -f "$OUT/$1.ready"
  ip netns exec "$H2" python3 "$GSO_PROBE" recv 10.50.2.2 9998 "$OUT/$1.gso.json" --ready "$OUT/$1.ready" &
  local rp=$!; PIDS+=("$rp")
  for _ in $(seq 100); do [ -e "$OUT/$1.ready" ] && break; sleep 0.05; done
  ip netns exec "$H1" python3 "$GSO_PROBE" send 10.50.2.2 9998 "$2" 45 1312 --gap-us 1000 >/dev/null
  wait "$rp" || true
}
cfg ugso '[{"name":"u","src":"10.50.1.0/24","dst":"10.50.2.0/24","delay_us":1000,"loss":{"model":"random","p":0.02},"duplicate":{"p":0.01}}]'
start ugso
NS_UDP=${QUICK:+1000}; NS_UDP=${NS_UDP:-3000}
rb0=$(snmp "$H2" Udp RcvbufErrors)
udp_gso ugso "$NS_UDP"
rb1=$(snmp "$H2" Udp RcvbufErrors)
res "$(python3 -c "
import json;d=json.load(open('$OUT/ugso.stats.json'));r=d['rules']['u'];g=json.load(open('$OUT/ugso.gso.json'))
sent=$NS_UDP*45
print('sent %d datagrams; received %d distinct (loss %.4f, want 0.02; daemon dropped %d of %d wire packets; h2 receive-buffer drops %d), %d duplicates (%.4f, want 0.01), %d bad (wrong size or bytes), sizes %s' % (sent, g['distinct'], 1-g['distinct']/sent, r['dropped_loss'], r['packets_in'], $rb1-$rb0, g['duplicates'], g['duplicates']/max(1,g['distinct']), g['bad'], g['sizes']))
print('   super-packets %d: whole %d, segmented %d; segment size learned %d times, size mismatches %d; inject errors %d' % (d['gso_packets'], d['gso_whole'], d['gso_segmented'], d['gso_size_learned'], d['gso_size_mismatch'], d['inject_errors']))")"
cfg ugsoc '[{"name":"u","src":"10.50.1.0/24","dst":"10.50.2.0/24","corrupt":{"p":0.01}}]'
start ugsoc
ue0=$(snmp "$H2" Udp InCsumErrors); rb0=$(snmp "$H2" Udp RcvbufErrors)
udp_gso ugsoc "$NS_UDP"
ue1=$(snmp "$H2" Udp InCsumErrors); rb1=$(snmp "$H2" Udp RcvbufErrors)
res "corrupt 1%: $(python3 -c "
import json;d=json.load(open('$OUT/ugsoc.stats.json'));r=d['rules']['u'];g=json.load(open('$OUT/ugsoc.gso.json'))
print('daemon corrupted %d of %d wire packets; received %d good, %d bad; h2 UdpInCsumErrors +%d (want = corrupted; h2 receive-buffer drops %d are never checksummed)' % (r['corrupted'], r['packets_in'], g['distinct'], g['bad'], $ue1-$ue0, $rb1-$rb0))")"

# ---- 7. fail closed ---------------------------------------------------------
log "7. fail closed: kill impaird during a TCP transfer"
cfg fc '[]'
start fc
iperf_srv
ip netns exec "$H1" timeout 9 iperf3 -c 10.50.2.2 -t 5 -i 1 --forceflush >"$OUT/fc.iperf.txt" 2>&1 &
ip=$!; PIDS+=("$ip")
sleep 2.5
kill "$DPID"; wait "$DPID" 2>/dev/null || true; DPID=""
res "impaird killed at t=2.5 s"
wait "$ip" || true
res "per-second Mbit/s: $(awk '/sec/ && /bits\/sec/ && !/sender|receiver/ {v=$7; u=$8; if (u ~ /^G/) v*=1000; if (u ~ /^K/) v/=1000; if (u ~ /^bits/) v/=1e6; printf "%.0f ", v}' "$OUT/fc.iperf.txt")"
ip netns exec "$H1" ping -q -c 100 -i 0.01 -w 3 10.50.2.2 >"$OUT/fc.ping" 2>&1 || true
res "ping after kill: $(grep 'packets transmitted' "$OUT/fc.ping")"

log "done"
