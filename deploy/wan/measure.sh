#!/usr/bin/env bash
# Measures an emulated WAN link: ping RTT (a -> b) and iperf3 TCP throughput a -> b with 1 or more
# parallel streams. Works on a link that is already up (--prefix P), or brings one up with the
# given rate and delay, measures, and tears it down again. Not a benchmark of nebula itself.
#
# usage: measure.sh [--prefix P | --rate-mbit R --delay-ms D] [--streams 1,4] [--time S]
#                   [--omit S] [--pings N] [--json]
# Prints "rtt_ms_min=.. rtt_ms_avg=.. rtt_ms_max=.." and "iperf3_mbit_P<n>=.." lines, or with
# --json one object {"rate_mbit":..,"delay_ms":..,"rtt_ms_avg":..,"iperf3_mbit":{"1":..,"4":..}}.
set -euo pipefail
# shellcheck source=deploy/wan/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prefix=""
rate=100
delay=25
streams="1"
t=5
omit=1
pings=10
json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --rate-mbit) rate=$2; shift 2 ;;
    --delay-ms) delay=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --time) t=$2; shift 2 ;;
    --omit) omit=$2; shift 2 ;;
    --pings) pings=$2; shift 2 ;;
    --json) json=1; shift ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) wan_die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$streams" =~ ^[0-9]+(,[0-9]+)*$ ]] || wan_die "--streams must be a comma list of counts, got '$streams'"
[[ "$t" =~ ^[0-9]+$ && "$t" -ge 1 ]] || wan_die "--time must be whole seconds >= 1"
[[ "$omit" =~ ^[0-9]+$ ]] || wan_die "--omit must be whole seconds >= 0"
[[ "$pings" =~ ^[0-9]+$ && "$pings" -ge 1 ]] || wan_die "--pings must be >= 1"
command -v iperf3 >/dev/null || wan_die "iperf3 not found (scripts/setup.sh installs it)"
command -v ping >/dev/null || wan_die "ping not found (scripts/setup.sh installs iputils-ping)"

own=""
srv=""
cleanup() {
  if [ -n "$srv" ]; then
    kill -TERM "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
  fi
  if [ -n "$own" ]; then "$NB_WAN_DIR/wan-down.sh" --prefix "$own" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "$prefix" ]; then
  prefix="nbm-$$"
  own=$prefix
  "$NB_WAN_DIR/wan-up.sh" --prefix "$prefix" --rate-mbit "$rate" --delay-ms "$delay" >/dev/null
fi
wan_check_prefix "$prefix"
envf="$NB_WAN_STATE_ROOT/$prefix/env"
[ -f "$envf" ] || wan_die "no link with prefix $prefix (no $envf): run wan-up.sh first"
# shellcheck disable=SC1090
. "$envf"

# Ping: 0.2 s apart (root may go below 1 s), quiet summary line only.
pout=$(ip netns exec "$NB_WAN_NS_A" ping -n -q -c "$pings" -i 0.2 "$NB_WAN_ADDR_B")
read -r rmin ravg rmax < <(printf '%s\n' "$pout" | awk -F'[/ =]+' '/^rtt|^round-trip/ {print $6, $7, $8}')
loss=$(printf '%s\n' "$pout" | sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')

# iperf3 server in namespace b (exec'd by ip netns exec, so $! is iperf3 itself).
port=5201
ip netns exec "$NB_WAN_NS_B" iperf3 -s -B "$NB_WAN_ADDR_B" -p "$port" >/dev/null 2>&1 &
srv=$!
for _ in $(seq 1 50); do
  ip netns exec "$NB_WAN_NS_B" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
  sleep 0.1
done

declare -A mbit
for s in ${streams//,/ }; do
  out=$(ip netns exec "$NB_WAN_NS_A" iperf3 -c "$NB_WAN_ADDR_B" -p "$port" -t "$t" -O "$omit" \
    -P "$s" -J) || wan_die "iperf3 client failed (streams $s)"
  mbit[$s]=$(printf '%s\n' "$out" | jq -r '.end.sum_received.bits_per_second / 1e6 | . * 10 | round / 10')
done

if [ "$json" -eq 1 ]; then
  {
    printf '{"rate_mbit":%s,"rate_ba_mbit":%s,"delay_ms":%s,"rtt_ms_min":%s,"rtt_ms_avg":%s,' \
      "$NB_WAN_RATE_MBIT" "$NB_WAN_RATE_BA_MBIT" "$NB_WAN_DELAY_MS" "$rmin" "$ravg"
    printf '"rtt_ms_max":%s,"ping_loss_pct":%s,"iperf3_seconds":%s,"iperf3_mbit":{' "$rmax" "$loss" "$t"
    sep=""
    for s in ${streams//,/ }; do printf '%s"%s":%s' "$sep" "$s" "${mbit[$s]}"; sep=","; done
    printf '}}\n'
  } | jq -c .
else
  echo "link: ${NB_WAN_RATE_MBIT} Mbit/s a->b, ${NB_WAN_RATE_BA_MBIT} Mbit/s b->a, ${NB_WAN_DELAY_MS} ms one way"
  echo "rtt_ms_min=$rmin rtt_ms_avg=$ravg rtt_ms_max=$rmax ping_loss_pct=$loss"
  for s in ${streams//,/ }; do echo "iperf3_mbit_P$s=${mbit[$s]}"; done
fi
