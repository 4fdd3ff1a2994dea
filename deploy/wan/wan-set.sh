#!/usr/bin/env bash
# Changes a running emulated WAN link (made by wan-up.sh) without tearing it down: the tbf rate of
# either direction, or the link state (down = both devices down, as in a cut cable; up = back).
# The one-way delay is fixed for the life of the link.
#
# usage: wan-set.sh --prefix P [--rate-mbit R] [--rate-ba-mbit R] [--down | --up]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prefix=""
rate=""
rate_ba=""
state_op=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --rate-mbit) rate=$2; shift 2 ;;
    --rate-ba-mbit) rate_ba=$2; shift 2 ;;
    --down) state_op=down; shift ;;
    --up) state_op=up; shift ;;
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
wan_log "set $prefix:${rate:+ rate a->b $rate Mbit/s}${rate_ba:+ b->a $rate_ba Mbit/s}${state_op:+ link $state_op}"
