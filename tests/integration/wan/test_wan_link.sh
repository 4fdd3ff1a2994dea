#!/usr/bin/env bash
# Integration test of the emulated WAN link (needs root and network namespaces; otherwise exits 77
# = skipped): a 50 Mbit/s, 10 ms one-way link must show a ping RTT of about 20 ms and an iperf3
# rate near 50 Mbit/s; halving the rate at run time must halve the iperf3 rate; a cut link must be
# silent and a restored one answer; a veth link without delay must work too; and tear-down must
# leave no namespace or process of this test behind.
set -u
wan=$1
SKIP=77
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { echo "skip: ip netns unavailable"; exit $SKIP; }
[ -c /dev/net/tun ] || { echo "skip: no /dev/net/tun"; exit $SKIP; }
for t in iperf3 ping jq tc; do
  command -v $t >/dev/null || { echo "skip: $t not installed (scripts/setup.sh)"; exit $SKIP; }
done
# Probe: can this machine make a namespace at all (containers may forbid it)?
probe="nbt-probe-$$"
if ! ip netns add "$probe" 2>/dev/null; then echo "skip: cannot create a namespace"; exit $SKIP; fi
ip netns del "$probe"

p="nbt-$$"
p0="nbt0-$$"
fail=0
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  "$wan/wan-down.sh" --prefix "$p" >/dev/null 2>&1
  "$wan/wan-down.sh" --prefix "$p0" >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 1' INT TERM
check() { # check "what" condition-expression-for-awk
  if awk "BEGIN { exit !($2) }"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

t0=$(date +%s.%N)
upout=$("$wan/wan-up.sh" --prefix "$p" --rate-mbit 50 --delay-ms 10) || { echo "FAIL: wan-up"; exit 1; }
dlpid=$(sed -n 's/^NB_WAN_DELAYLINE_PID=//p' <<<"$upout")
statedir=$(sed -n 's/^NB_WAN_STATE=//p' <<<"$upout")
check "a delay line runs (pid '$dlpid')" "\"$dlpid\" != \"\""
j=$("$wan/measure.sh" --prefix "$p" --streams 1 --time 2 --omit 1 --pings 8 --json) ||
  { echo "FAIL: measure"; exit 1; }
echo "50 Mbit/s, 10 ms: $j"
rmin=$(jq .rtt_ms_min <<<"$j")
ravg=$(jq .rtt_ms_avg <<<"$j")
mb=$(jq '.iperf3_mbit["1"]' <<<"$j")
loss=$(jq .ping_loss_pct <<<"$j")
check "ping min RTT $rmin ms >= 2 x 10 ms (the delay line never forwards early)" "$rmin >= 19.9"
check "ping avg RTT $ravg ms <= 2 x 10 ms x 1.25 + 3 ms" "$ravg <= 28"
check "ping loss $loss% is 0" "$loss == 0"
check "iperf3 $mb Mbit/s within [0.80, 1.05] x 50" "$mb >= 40 && $mb <= 52.5"
# measure.sh stopped its iperf3 server: nothing of ours runs in the namespaces now.
left=$(ip netns pids "$p-a"; ip netns pids "$p-b")
check "no process left in the namespaces after measure.sh ('$left')" "\"$left\" == \"\""

# Halve the rate at run time (what the scheduler tests do mid-run).
"$wan/wan-set.sh" --prefix "$p" --rate-mbit 25 2>/dev/null || { echo "FAIL: wan-set"; fail=1; }
j=$("$wan/measure.sh" --prefix "$p" --streams 1 --time 2 --omit 1 --pings 2 --json)
mb2=$(jq '.iperf3_mbit["1"]' <<<"$j")
echo "after wan-set --rate-mbit 25: $j"
check "iperf3 after halving $mb2 Mbit/s within [0.75, 1.05] x 25" "$mb2 >= 18.75 && $mb2 <= 26.25"

# A cut link is silent (every ping lost), a restored one answers again.
"$wan/wan-set.sh" --prefix "$p" --cut 2>/dev/null || { echo "FAIL: wan-set --cut"; fail=1; }
lc=$(ip netns exec "$p-a" ping -n -q -c 3 -i 0.2 -W 1 169.254.100.2 | sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')
check "cut link loses every ping ($lc%)" "\"$lc\" == \"100\""
"$wan/wan-set.sh" --prefix "$p" --restore 2>/dev/null || { echo "FAIL: wan-set --restore"; fail=1; }
lr=$(ip netns exec "$p-a" ping -n -q -c 3 -i 0.2 -W 1 169.254.100.2 | sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')
check "restored link loses no ping ($lr%)" "\"$lr\" == \"0\""

out=$("$wan/wan-down.sh" --prefix "$p" 2>&1) || { echo "FAIL: wan-down: $out"; fail=1; }
echo "$out"
grep -q 'a->b frames=[1-9]' <<<"$out" || { echo "FAIL: no delay-line statistics"; fail=1; }
check "wan-down is idempotent" "$("$wan/wan-down.sh" --prefix "$p" >/dev/null 2>&1; echo $?) == 0"

# Without delay: a veth pair, still shaped.
"$wan/wan-up.sh" --prefix "$p0" --rate-mbit 50 --delay-ms 0 >/dev/null || { echo "FAIL: wan-up veth"; fail=1; }
r0=$(ip netns exec "$p0-a" ping -n -q -c 3 -i 0.2 169.254.100.2 | awk -F'[/ =]+' '/^rtt/ {print $7}')
check "veth link ping avg ${r0:-none} ms < 5 ms" "\"$r0\" != \"\" && $r0 < 5"
"$wan/wan-down.sh" --prefix "$p0" >/dev/null 2>&1 || { echo "FAIL: wan-down veth"; fail=1; }

# Nothing of this test is left: namespaces, delay line, state.
for ns in "$p-a" "$p-b" "$p0-a" "$p0-b"; do
  if ip netns list | awk '{print $1}' | grep -qxF "$ns"; then echo "FAIL: namespace $ns left"; fail=1; fi
done
# shellcheck source=deploy/wan/lib.sh
. "$wan/lib.sh"
if [ -n "$dlpid" ] && wan_pid_alive "$dlpid"; then echo "FAIL: delay line $dlpid left"; fail=1; fi
if [ -n "$statedir" ] && [ -e "$statedir" ]; then echo "FAIL: state $statedir left"; fail=1; fi
echo "took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
[ "$fail" -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
