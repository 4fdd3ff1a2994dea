#!/usr/bin/env bash
# The WAN link down for 20 s mid-run, between the two network namespaces of deploy/wan
# (veth, 50 Mbit/s): `ip link set wan0 down` in namespace a, back up 20 s later. Both clusters
# must keep training (their rounds are skipped, not applied, on both), apply rounds again once
# the link is back, complete the run, and end with the same theta_global hash; both summaries
# count the skipped rounds. Needs root (namespaces); exits 77 (skipped) without it.
# usage: test_faults_linkdown.sh NEBULA DATA_DIR WAN_DIR
set -euo pipefail
nebula=$1
data=$2
wan=$3
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: needs root (network namespaces)"
  exit 77
fi
. "$here/lib.sh"
prefix="nbf-$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  "$wan/wan-down.sh" --prefix "$prefix" >/dev/null 2>&1 || true
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "== $f"; tail -n 25 "$f"; done
  exit 1
}

eval "$("$wan/wan-up.sh" --prefix "$prefix" --rate-mbit 50 --delay-ms 0)"
export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 NB_ROUND_DEADLINE_S=8
write_job "$tmp/job.json" 80 0.3
make_pki "$tmp/pki" "$NB_WAN_ADDR_A" "$NB_WAN_ADDR_B"
worker() { # NS CLUSTER ADDR PEER PEER_ADDR
  exec ip netns exec "$1" "$nebula" worker --job "$tmp/job.json" --cluster "$2" \
    --out "$tmp/$2" --listen "$3:7500" --peer "$4=$5:7500" --pki "$tmp/pki" \
    --secret-file "$tmp/pki/job.secret" --data-dir "$data"
}
(worker "$NB_WAN_NS_A" dc-a "$NB_WAN_ADDR_A" dc-b "$NB_WAN_ADDR_B") >"$tmp/a.log" 2>&1 &
apid=$!
pids+=("$apid")
(worker "$NB_WAN_NS_B" dc-b "$NB_WAN_ADDR_B" dc-a "$NB_WAN_ADDR_A") >"$tmp/b.log" 2>&1 &
bpid=$!
pids+=("$bpid")

for _ in $(seq 1 300); do
  [ -f "$tmp/dc-a/rounds.tsv" ] && [ "$(tsv_count "$tmp/dc-a/rounds.tsv" applied 1)" -ge 4 ] && break
  sleep 0.05
done
[ "$(tsv_count "$tmp/dc-a/rounds.tsv" applied 1)" -ge 4 ] || fail "no 4 applied rounds before the outage"
ip -n "$NB_WAN_NS_A" link set "$NB_WAN_DEV" down
echo "link down at $(date +%s.%N)"
sleep 20
ip -n "$NB_WAN_NS_A" link set "$NB_WAN_DEV" up
echo "link up at $(date +%s.%N)"
kill -0 "$apid" 2>/dev/null || fail "dc-a stopped during the outage"
kill -0 "$bpid" 2>/dev/null || fail "dc-b stopped during the outage"
wait "$apid" || fail "dc-a failed"
wait "$bpid" || fail "dc-b failed"
pids=()
ha=$(json_field "$tmp/dc-a/summary.json" global_xxh3)
hb=$(json_field "$tmp/dc-b/summary.json" global_xxh3)
echo "theta_global: dc-a $ha, dc-b $hb"
[ "$ha" = "$hb" ] || fail "theta_global differs: $ha vs $hb"
for c in dc-a dc-b; do
  s=$(json_field "$tmp/$c/summary.json" rounds_skipped)
  n=$(json_field "$tmp/$c/summary.json" rounds_applied)
  echo "$c: $n rounds applied, $s skipped, $(json_field "$tmp/$c/summary.json" rounds_late) late, $(json_field "$tmp/$c/summary.json" round_jumps) jumps"
  [ "$s" -ge 10 ] || fail "$c skipped only $s rounds during a 20 s outage"
  # skipped rounds still trained, and rounds were applied again after the outage
  awk -F'\t' 'NR > 1 && $13 == 0 && $2 < 1 { bad++ } END { exit bad > 0 }' "$tmp/$c/rounds.tsv" ||
    fail "$c: a skipped round without inner steps"
  after=$(awk -F'\t' 'NR > 1 { if ($13 == 0) last = NR; rows[NR] = $13 }
    END { n = 0; for (i = last + 1; i <= NR; i++) if (rows[i] == 1) n++; print n }' "$tmp/$c/rounds.tsv")
  [ "$after" -ge 3 ] || fail "$c: only $after rounds applied after the outage"
done
[ "$(json_field "$tmp/dc-a/summary.json" rounds_applied)" = "$(json_field "$tmp/dc-b/summary.json" rounds_applied)" ] ||
  fail "the clusters applied different numbers of rounds"
"$wan/wan-down.sh" --prefix "$prefix" >/dev/null
ip netns list | grep -q "^$prefix-" && fail "namespaces left behind"
echo "PASS"
