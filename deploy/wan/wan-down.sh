#!/usr/bin/env bash
# Tears down an emulated WAN link made by wan-up.sh: stops its delay line (printing its
# statistics), stops every process left inside its two namespaces, deletes the namespaces and the
# state directory. Idempotent: a prefix that is already gone is not an error.
#
# usage: wan-down.sh --prefix P
set -uo pipefail
# shellcheck source=deploy/wan/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) wan_die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$prefix" ] || wan_die "--prefix is required"
wan_check_prefix "$prefix"
[ "$(id -u)" -eq 0 ] || wan_die "needs root (network namespaces)"

state="$NB_WAN_STATE_ROOT/$prefix"

# Waits up to $2 hundredths of a second for pid $1 to exit.
wait_gone() {
  local i
  for ((i = 0; i < $2; i++)); do
    wan_pid_alive "$1" || return 0
    sleep 0.01
  done
  return 1
}

# 1. The delay line: SIGTERM makes it print its statistics and exit.
pids=$(wan_delayline_pids "$prefix")
if [ -s "$state/delayline.pid" ]; then
  p=$(cat "$state/delayline.pid")
  if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "nb-delayline" ]; then pids="$pids $p"; fi
fi
# shellcheck disable=SC2086 # $pids is a whitespace-separated list
for p in $(printf '%s\n' $pids | sort -u); do
  kill -TERM "$p" 2>/dev/null || continue
  wait_gone "$p" 300 || { wan_log "nb-delayline $p ignored SIGTERM; killing"; kill -KILL "$p" 2>/dev/null; }
done
if [ -f "$state/delayline.log" ]; then
  grep -E '^nb-delayline: (a->b|b->a)' "$state/delayline.log" | tail -2 >&2 || true
fi

# 2. Whatever still runs inside the namespaces (servers a test left behind), then the namespaces.
for ns in "$prefix-a" "$prefix-b"; do
  ip netns list | awk '{print $1}' | grep -qxF "$ns" || continue
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
  for p in $(ip netns pids "$ns" 2>/dev/null); do
    wait_gone "$p" 200 || kill -KILL "$p" 2>/dev/null || true
  done
  ip netns del "$ns" 2>/dev/null || wan_log "could not delete namespace $ns"
done

rm -rf "$state"

# Report anything that survived, and fail so callers notice.
left=""
for ns in "$prefix-a" "$prefix-b"; do
  ip netns list | awk '{print $1}' | grep -qxF "$ns" && left="$left namespace:$ns"
done
for p in $(wan_delayline_pids "$prefix"); do left="$left pid:$p"; done
if [ -n "$left" ]; then
  wan_log "left behind:$left"
  exit 1
fi
wan_log "down: $prefix"
exit 0
