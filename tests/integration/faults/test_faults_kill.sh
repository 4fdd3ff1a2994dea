#!/usr/bin/env bash
# One cluster's leader killed (SIGKILL) mid-run, over loopback with mTLS and sealing: the other
# cluster must log the dead peer within 3 s of the kill (from its own timestamps) and keep
# training with its rounds skipped; the killed cluster restarted with --rejoin pulls the global
# state from the survivor, both apply rounds together again, and both end with the same
# theta_global hash. No root needed. NB_FAULTS_OVERLAP=1: the same with sync.overlap
# (overlapSteps 1).
# usage: test_faults_kill.sh NEBULA DATA_DIR
set -euo pipefail
nebula=$1
data=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
. "$here/lib.sh"

export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 NB_ROUND_DEADLINE_S=8
if [ -n "${NB_FAULTS_OVERLAP:-}" ]; then
  write_job "$tmp/job.json" 48 0.25 ', "overlap": true, "overlapSteps": 1'
else
  write_job "$tmp/job.json" 48 0.25
fi
make_pki "$tmp/pki" 127.0.0.1 127.0.0.1
port_a=$((20000 + ($$ % 20000)))
port_b=$((port_a + 1))
worker() { # CLUSTER LISTEN_PORT PEER PEER_PORT [extra]
  local c=$1 lp=$2 p=$3 pp=$4
  shift 4
  exec "$nebula" worker --job "$tmp/job.json" --cluster "$c" --out "$tmp/$c" \
    --listen "127.0.0.1:$lp" --peer "$p=127.0.0.1:$pp" --pki "$tmp/pki" \
    --secret-file "$tmp/pki/job.secret" --data-dir "$data" "$@"
}
(worker dc-a "$port_a" dc-b "$port_b") >"$tmp/a.log" 2>&1 &
apid=$!
pids+=("$apid")
(worker dc-b "$port_b" dc-a "$port_a") >"$tmp/b.log" 2>&1 &
bpid=$!
pids+=("$bpid")

# wait for 4 applied rounds on dc-b, then kill it
for _ in $(seq 1 300); do
  [ -f "$tmp/dc-b/rounds.tsv" ] && [ "$(tsv_count "$tmp/dc-b/rounds.tsv" applied 1)" -ge 4 ] && break
  sleep 0.05
done
[ "$(tsv_count "$tmp/dc-b/rounds.tsv" applied 1)" -ge 4 ] || fail "dc-b did not apply 4 rounds"
kill -9 "$bpid"
t_kill=$(date +%s.%N)
wait "$bpid" 2>/dev/null || true
pids=("$apid")

# the survivor declares dc-b dead (heartbeat) and logs when
for _ in $(seq 1 100); do grep -q "peer dc-b .*declared dead at unix" "$tmp/a.log" && break; sleep 0.05; done
line=$(grep -m1 "peer dc-b .*declared dead at unix" "$tmp/a.log") || fail "dc-a did not report dc-b dead"
t_dead=$(echo "$line" | sed -n 's/.*declared dead at unix \([0-9.]*\).*/\1/p')
secs=$(awk -v a="$t_kill" -v b="$t_dead" 'BEGIN { printf "%.2f", b - a }')
echo "dc-b killed; dc-a declared it dead after $secs s"
awk -v s="$secs" 'BEGIN { exit !(s >= 0 && s <= 3.0) }' || fail "detection took $secs s (limit 3 s)"
kill -0 "$apid" 2>/dev/null || fail "dc-a stopped after the kill"

# dc-a keeps training: rounds go on, not applied, while dc-b is down
skipped0=$(tsv_count "$tmp/dc-a/rounds.tsv" applied 0)
sleep 1.2
skipped1=$(tsv_count "$tmp/dc-a/rounds.tsv" applied 0)
[ "$skipped1" -gt "$skipped0" ] || [ "$skipped1" -ge 2 ] || fail "dc-a did not go on with skipped rounds"
kill -0 "$apid" 2>/dev/null || fail "dc-a stopped while dc-b was down"

# restart dc-b: it rejoins from dc-a
(worker dc-b "$port_b" dc-a "$port_a" --rejoin) >"$tmp/b2.log" 2>&1 &
bpid=$!
pids+=("$bpid")
wait "$apid" || fail "dc-a failed"
wait "$bpid" || fail "dc-b (rejoined) failed"
pids=()
grep -q "dc-b rejoined from dc-a at round" "$tmp/b2.log" || fail "no rejoin line"
same_hash "$tmp/dc-a" "$tmp/dc-b"
rj=$(json_field "$tmp/dc-b/summary.json" rejoined_at_round)
[ "$rj" -gt 0 ] || fail "dc-b's summary has no rejoin round"
[ "$(json_field "$tmp/dc-a/summary.json" rounds_skipped)" -ge 2 ] || fail "dc-a skipped no rounds"
na=$(json_field "$tmp/dc-a/summary.json" rounds_applied)
nb=$(json_field "$tmp/dc-b/summary.json" rounds_applied)
[ "$na" = "$nb" ] || fail "rounds applied differ: $na vs $nb"
# after the rejoin both apply rounds again
after=$(awk -F'\t' -v r="$rj" 'NR > 1 && $1 >= r && $13 == 1 { n++ } END { print n + 0 }' "$tmp/dc-a/rounds.tsv")
[ "$after" -ge 3 ] || fail "only $after rounds applied on dc-a after the rejoin at round $rj"
grep -q "rejoined" "$tmp/dc-b/rounds.tsv" || fail "dc-b's rounds.tsv does not mark the rejoin"
echo "dc-a: $na rounds applied, $(json_field "$tmp/dc-a/summary.json" rounds_skipped) skipped; dc-b rejoined at round $rj"
echo "PASS"; [ -n "${NB_KEEP_TMP:-}" ] && echo "kept $tmp"; true
