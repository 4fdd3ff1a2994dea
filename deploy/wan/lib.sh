# shellcheck shell=bash disable=SC2034
# Shared helpers for the emulated-WAN scripts (sourced, not run). Names, addresses and the tbf
# parameters live here so that wan-up.sh, wan-set.sh, wan-down.sh and measure.sh agree.
# Not a general network library: it only knows the two-namespace layout that wan-up.sh builds.

NB_WAN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NB_WAN_STATE_ROOT=${NB_WAN_STATE_DIR:-/run/nebula-wan}
NB_WAN_DEV=wan0                 # the link device in each namespace (same name on both sides)
NB_WAN_ADDR_A=169.254.100.1     # link-local only, never any other range
NB_WAN_ADDR_B=169.254.100.2
NB_WAN_ADDR6_A=fd00:6e62::1
NB_WAN_ADDR6_B=fd00:6e62::2

wan_log() { printf 'wan: %s\n' "$*" >&2; }
wan_die() {
  printf 'wan: error: %s\n' "$*" >&2
  exit 1
}

# A prefix becomes two namespace names (<prefix>-a, <prefix>-b) and a state directory; keep it
# short and plain so it is safe in paths and in `ip netns` names.
wan_check_prefix() {
  [[ "$1" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || wan_die "bad prefix '$1' (letters, digits, . _ - only)"
}

wan_is_number() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }

# tbf parameters for a rate in Mbit/s and a one-way delay in ms: burst of 5 ms at the rate, and a
# queue (limit) of max(2 x delay, 20 ms) at the rate, at least 64 KiB: about one bandwidth-delay
# product, like a sensibly sized WAN bottleneck. The burst is at least 32 KiB on the veth link
# (delay 0), so that a GSO segment fits; behind the delay line (delay > 0) the TAP devices carry
# frames of at most the MTU, so 4 frames suffice: a larger floor would let every frame below it
# through at line speed after an idle gap, and a link of 0.1 Mbit/s would carry a 20 KiB frame
# in a moment instead of 1.6 s.
wan_tbf_args() {
  local rate=$1 delay=$2
  awk -v r="$rate" -v d="$delay" 'BEGIN {
    bps = r * 1e6 / 8
    floor = d > 0 ? 4 * 1514 : 32768
    burst = bps * 0.005; if (burst < floor) burst = floor
    q = 2 * d; if (q < 20) q = 20
    limit = bps * q / 1000; if (limit < 65536) limit = 65536
    printf "rate %.6gmbit burst %d limit %d\n", r, burst, limit
  }'
}

# Applies (or removes, for rate 0) tbf on the link device of one namespace.
wan_shape() {
  local ns=$1 rate=$2 delay=$3
  if awk -v r="$rate" 'BEGIN { exit !(r > 0) }'; then
    # shellcheck disable=SC2046
    ip netns exec "$ns" tc qdisc replace dev "$NB_WAN_DEV" root tbf $(wan_tbf_args "$rate" "$delay")
  else
    ip netns exec "$ns" tc qdisc del dev "$NB_WAN_DEV" root 2>/dev/null || true
  fi
}

# Finds the nb-delayline program: $NB_DELAYLINE, the build tree next to the sources, or PATH.
wan_find_delayline() {
  if [ -n "${NB_DELAYLINE:-}" ]; then
    [ -x "$NB_DELAYLINE" ] || wan_die "NB_DELAYLINE=$NB_DELAYLINE is not executable"
    printf '%s\n' "$NB_DELAYLINE"
    return
  fi
  local c
  # beside the scripts (a build tree), an install tree's libexec (share/nebula/wan ->
  # libexec/nebula), the source tree's build/, then PATH
  for c in "$NB_WAN_DIR/nb-delayline" "$NB_WAN_DIR/../../../libexec/nebula/nb-delayline" \
    "$NB_WAN_DIR/../../build/deploy/wan/nb-delayline" "$(command -v nb-delayline || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      printf '%s\n' "$c"
      return
    fi
  done
  wan_die "nb-delayline not found: build it (cmake --build build --target nb-delayline) or set NB_DELAYLINE"
}

# True while pid $1 runs. A zombie counts as exited: a delay line is reparented to init when
# wan-up.sh returns, and init may reap it only later, so `kill -0` alone would wait for that.
wan_pid_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# PIDs of nb-delayline processes serving this prefix (found by their command line, so a delay
# line whose pidfile was never written is found too).
wan_delayline_pids() {
  local re=${1//./\\.}
  pgrep -f -- "nb-delayline .*--ns-a $re-a --" || true
}
