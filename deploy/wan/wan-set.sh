#!/usr/bin/env bash
# Changes a running emulated WAN link (made by wan-up.sh) without tearing it down: the tbf rate of
# either direction; --cut / --restore (the delay line drops every frame, both ways: endpoints see
# silence, as on a real WAN outage; needs delay > 0); --down / --up (both devices down: endpoints
# see "network unreachable" at once). The one-way delay is fixed for the life of the link.
#
# usage: wan-set.sh --prefix P [--rate-mbit R] [--rate-ba-mbit R] [--cut | --restore | --down | --up]
set -euo pipefail
# shellcheck source=deploy/wan/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prefix=""
rate=""
rate_ba=""
state_op=""
cut_op=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --rate-mbit) rate=$2; shift 2 ;;
    --rate-ba-mbit) rate_ba=$2; shift 2 ;;
    --down) state_op="down"; shift ;;
    --up) state_op="up"; shift ;;
    --cut) cut_op="cut"; shift ;;
    --restore) cut_op="restore"; shift ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) wan_die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$prefix" ] || wan_die "--prefix is required"
wan_check_prefix "$prefix"
[ "$(id -u)" -eq 0 ] || wan_die "needs root (network namespaces)"
envf="$NB_WAN_STATE_ROOT/$prefix/env"
[ -f "$envf" ] || wan_die "no link with prefix $prefix: run wan-up.sh first"
# shellcheck disable=SC1090
. "$envf"
if [ -n "$rate" ] && [ -z "$rate_ba" ]; then rate_ba=$rate; fi

if [ -n "$rate" ]; then
  wan_is_number "$rate" || wan_die "--rate-mbit must be a number >= 0, got '$rate'"
  wan_shape "$NB_WAN_NS_A" "$rate" "$NB_WAN_DELAY_MS"
  sed -i "s/^NB_WAN_RATE_MBIT=.*/NB_WAN_RATE_MBIT=$rate/" "$envf"
fi
if [ -n "$rate_ba" ]; then
  wan_is_number "$rate_ba" || wan_die "--rate-ba-mbit must be a number >= 0, got '$rate_ba'"
  wan_shape "$NB_WAN_NS_B" "$rate_ba" "$NB_WAN_DELAY_MS"
  sed -i "s/^NB_WAN_RATE_BA_MBIT=.*/NB_WAN_RATE_BA_MBIT=$rate_ba/" "$envf"
fi
if [ -n "$state_op" ]; then
  ip -n "$NB_WAN_NS_A" link set "$NB_WAN_DEV" "$state_op"
  ip -n "$NB_WAN_NS_B" link set "$NB_WAN_DEV" "$state_op"
fi
if [ -n "$cut_op" ]; then
  pid=${NB_WAN_DELAYLINE_PID:-}
  [ -n "$pid" ] || wan_die "--$cut_op needs a link with a delay line (wan-up.sh --delay-ms > 0); use --down/--up"
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "nb-delayline" ] || wan_die "delay line $pid of $prefix is not running"
  if [ "$cut_op" = cut ]; then kill -s RTMIN "$pid"; else kill -s RTMIN+1 "$pid"; fi
fi
wan_log "set $prefix:${rate:+ rate a->b $rate Mbit/s}${rate_ba:+ b->a $rate_ba Mbit/s}${state_op:+ link $state_op}${cut_op:+ link $cut_op}"
