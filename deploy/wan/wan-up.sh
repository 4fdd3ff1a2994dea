#!/usr/bin/env bash
# Brings up an emulated WAN link on this machine: two network namespaces <prefix>-a and <prefix>-b
# joined by a TAP pair and the nb-delayline program (one-way delay > 0) or by a veth pair (no
# delay), with tbf rate shaping on each side. Needs root. Not a real WAN: no loss, no jitter.
#
# usage: wan-up.sh [--prefix P] [--rate-mbit R] [--rate-ba-mbit R] [--delay-ms D] [--ipv6]
#                  [--queue-frames N] [--no-realtime]
# Prints shell assignments (NB_WAN_PREFIX=..., NB_WAN_NS_A=..., NB_WAN_ADDR_B=...) on stdout, so
# `eval "$(wan-up.sh ...)"` works. Tear down with `wan-down.sh --prefix P`.
set -euo pipefail
# shellcheck source=deploy/wan/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prefix="nbw-$$"
rate=100
rate_ba=""
delay=25
ipv6=0
qframes=16384
realtime=(--realtime)
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --rate-mbit) rate=$2; shift 2 ;;
    --rate-ba-mbit) rate_ba=$2; shift 2 ;;
    --delay-ms) delay=$2; shift 2 ;;
    --ipv6) ipv6=1; shift ;;
    --queue-frames) qframes=$2; shift 2 ;;
    --no-realtime) realtime=(); shift ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) wan_die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$rate_ba" ] || rate_ba=$rate
wan_check_prefix "$prefix"
wan_is_number "$rate" || wan_die "--rate-mbit must be a number >= 0 (0 = unshaped), got '$rate'"
wan_is_number "$rate_ba" || wan_die "--rate-ba-mbit must be a number >= 0, got '$rate_ba'"
wan_is_number "$delay" || wan_die "--delay-ms must be a number >= 0, got '$delay'"
[ "$(id -u)" -eq 0 ] || wan_die "needs root (network namespaces)"
command -v ip >/dev/null || wan_die "ip (iproute2) not found"

ns_a="$prefix-a"
ns_b="$prefix-b"
state="$NB_WAN_STATE_ROOT/$prefix"
if ip netns list | awk '{print $1}' | grep -qxF "$ns_a"; then
  wan_die "namespace $ns_a already exists: pick another --prefix or run wan-down.sh --prefix $prefix"
fi

# From here on, any failure tears down whatever was created.
ok=0
cleanup() {
  if [ "$ok" -ne 1 ]; then
    wan_log "set-up failed; tearing down $prefix"
    "$NB_WAN_DIR/wan-down.sh" --prefix "$prefix" >&2 || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$state"
ip netns add "$ns_a"
ip netns add "$ns_b"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  # Like a host tuned for a long fat pipe: a connection that paused (between rounds) keeps its
  # congestion window instead of slow-starting again after every idle RTO.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
  if [ "$ipv6" -eq 0 ]; then
    # No IPv6 chatter (router solicitations, DAD) on a link that is measured.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  fi
done

use_delayline=0
if awk -v d="$delay" 'BEGIN { exit !(d > 0) }'; then
  use_delayline=1
  dl=$(wan_find_delayline)
  ip -n "$ns_a" tuntap add dev "$NB_WAN_DEV" mode tap
  ip -n "$ns_b" tuntap add dev "$NB_WAN_DEV" mode tap
else
  ip -n "$ns_a" link add "$NB_WAN_DEV" type veth peer name "$NB_WAN_DEV" netns "$ns_b"
fi

for side in a b; do
  if [ "$side" = a ]; then ns=$ns_a addr=$NB_WAN_ADDR_A addr6=$NB_WAN_ADDR6_A r=$rate
  else ns=$ns_b addr=$NB_WAN_ADDR_B addr6=$NB_WAN_ADDR6_B r=$rate_ba; fi
  # A long TAP ring (txqueuelen) absorbs a delay line that was briefly not scheduled.
  ip -n "$ns" link set "$NB_WAN_DEV" mtu 1500 txqueuelen 5000
  ip -n "$ns" addr add "$addr/24" dev "$NB_WAN_DEV"
  if [ "$ipv6" -eq 1 ]; then
    ip -n "$ns" addr add "$addr6/64" dev "$NB_WAN_DEV" nodad
  fi
  ip -n "$ns" link set "$NB_WAN_DEV" up
  wan_shape "$ns" "$r" "$delay"
done

if [ "$use_delayline" -eq 1 ]; then
  rm -f "$state/delayline.pid"
  # setsid: the delay line outlives this script and is not hit by the caller's terminal signals.
  setsid "$dl" --ns-a "$ns_a" --tap-a "$NB_WAN_DEV" --ns-b "$ns_b" --tap-b "$NB_WAN_DEV" \
    --delay-ms "$delay" --queue-frames "$qframes" --pidfile "$state/delayline.pid" "${realtime[@]}" \
    </dev/null >"$state/delayline.log" 2>&1 &
  dlpid=$!
  for _ in $(seq 1 100); do
    [ -s "$state/delayline.pid" ] && break
    wan_pid_alive "$dlpid" || { cat "$state/delayline.log" >&2; wan_die "nb-delayline exited"; }
    sleep 0.05
  done
  [ -s "$state/delayline.pid" ] || wan_die "nb-delayline did not start within 5 s"
fi

# The link is up when a ping crosses it (the first one also resolves ARP).
wait_s=$(awk -v d="$delay" 'BEGIN { printf "%d", 4 * d / 1000 + 2 }')
up=0
for _ in 1 2 3; do
  if ip netns exec "$ns_a" ping -q -n -c 1 -W "$wait_s" "$NB_WAN_ADDR_B" >/dev/null 2>&1; then
    up=1
    break
  fi
done
[ "$up" -eq 1 ] || wan_die "no ping across the new link $ns_a -> $ns_b"

cat >"$state/env" <<EOF
NB_WAN_PREFIX=$prefix
NB_WAN_NS_A=$ns_a
NB_WAN_NS_B=$ns_b
NB_WAN_DEV=$NB_WAN_DEV
NB_WAN_ADDR_A=$NB_WAN_ADDR_A
NB_WAN_ADDR_B=$NB_WAN_ADDR_B
NB_WAN_ADDR6_A=$([ "$ipv6" -eq 1 ] && echo "$NB_WAN_ADDR6_A")
NB_WAN_ADDR6_B=$([ "$ipv6" -eq 1 ] && echo "$NB_WAN_ADDR6_B")
NB_WAN_RATE_MBIT=$rate
NB_WAN_RATE_BA_MBIT=$rate_ba
NB_WAN_DELAY_MS=$delay
NB_WAN_DELAYLINE_PID=$([ "$use_delayline" -eq 1 ] && cat "$state/delayline.pid")
NB_WAN_STATE=$state
EOF
ok=1
wan_log "up: $ns_a ($NB_WAN_ADDR_A) <-> $ns_b ($NB_WAN_ADDR_B), ${rate}/${rate_ba} Mbit/s, ${delay} ms one way"
cat "$state/env"
