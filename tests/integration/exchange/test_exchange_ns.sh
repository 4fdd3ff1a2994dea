#!/usr/bin/env bash
# The exchange between two processes in the two namespaces of deploy/wan/wan-up.sh (40 Mbit/s,
# 10 ms one way): three rounds of 4 MiB each way over mTLS with sealing, byte-identical; then the
# peer in namespace b is killed with SIGKILL and the leader in namespace a must report it
# (NB_ERR_UNAVAILABLE naming dc-b) within 3 s. Needs root; exits 77 (skipped) without it.
# usage: test_exchange_ns.sh EXCHANGE_PEER_BINARY WAN_DIR
set -euo pipefail
peer_bin=$1
wan=$2
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: needs root (network namespaces)"
  exit 77
fi
prefix="nbx-$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  "$wan/wan-down.sh" --prefix "$prefix" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

eval "$("$wan/wan-up.sh" --prefix "$prefix" --rate-mbit 40 --delay-ms 10)"
"$peer_bin" --make-certs "$tmp" || fail "certificates"

run_pair() { # rounds
  ip netns exec "$NB_WAN_NS_B" "$peer_bin" --certs "$tmp" --self dc-b --listen "$NB_WAN_ADDR_B:7400" \
    --peer dc-a --target "$NB_WAN_ADDR_A:7400" --rounds "$1" --mib 4 >"$tmp/b.out" 2>"$tmp/b.err" &
  pids+=($!)
  bpid=$!
  ip netns exec "$NB_WAN_NS_A" "$peer_bin" --certs "$tmp" --self dc-a --listen "$NB_WAN_ADDR_A:7400" \
    --peer dc-b --target "$NB_WAN_ADDR_B:7400" --rounds "$1" --mib 4 >"$tmp/a.out" 2>"$tmp/a.err" &
  pids+=($!)
  apid=$!
}

# 1. three rounds, both ways
run_pair 3
wait "$apid" || { cat "$tmp/a.out" "$tmp/a.err"; fail "leader a failed"; }
wait "$bpid" || { cat "$tmp/b.out" "$tmp/b.err"; fail "leader b failed"; }
cat "$tmp/a.out"
[ "$(grep -c '^ROUND [0-9]* OK' "$tmp/a.out")" -eq 3 ] || fail "a: not 3 good rounds"
[ "$(grep -c '^ROUND [0-9]* OK' "$tmp/b.out")" -eq 3 ] || fail "b: not 3 good rounds"
pids=()

# 2. the peer in namespace b dies after round 1
run_pair 5
for _ in $(seq 1 200); do grep -q '^ROUND 1 OK' "$tmp/b.out" 2>/dev/null && break; sleep 0.05; done
grep -q '^ROUND 1 OK' "$tmp/b.out" || fail "round 1 did not complete"
kill -9 "$bpid"
t0=$(date +%s.%N)
wait "$apid" && fail "leader a did not notice the dead peer"
t1=$(date +%s.%N)
cat "$tmp/a.out"
line=$(grep '^ROUND 2 FAIL' "$tmp/a.out") || fail "no failure line for round 2"
case "$line" in *NB_ERR_UNAVAILABLE*dc-b*) ;; *) fail "unexpected failure: $line" ;; esac
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "peer killed in namespace b: reported after $secs s"
awk -v s="$secs" 'BEGIN { exit !(s < 3.0) }' || fail "detection took $secs s (limit 3 s)"
pids=()
"$wan/wan-down.sh" --prefix "$prefix" >/dev/null
ip netns list | grep -q "^$prefix-" && fail "namespaces left behind"
echo "PASS"
