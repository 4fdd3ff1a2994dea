#!/usr/bin/env bash
# `nebula run` restarts a cluster whose worker was killed (SIGKILL) mid-run, with --rejoin: the
# run completes with exit 0 by itself, the restarted cluster pulled the global state from the
# other, and both end with the same theta_global hash. Loopback, no root; nothing left behind.
# usage: test_faults_run_restart.sh NEBULA DATA_DIR
set -euo pipefail
nebula=$1
data=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
run_pid=
cleanup() {
  [ -n "$run_pid" ] && { kill "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; }
  pkill -9 -f -- "--out $tmp/" 2>/dev/null || true
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
. "$here/lib.sh"

export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 NB_ROUND_DEADLINE_S=8
write_job "$tmp/job.json" 48 0.25
"$nebula" run "$tmp/job.json" --out "$tmp/run" --data-dir "$data" --loopback >"$tmp/run.log" 2>&1 &
run_pid=$!

# wait for 4 applied rounds on dc-b, then kill its worker (not nebula run)
for _ in $(seq 1 400); do
  [ -f "$tmp/run/dc-b/rounds.tsv" ] && [ "$(tsv_count "$tmp/run/dc-b/rounds.tsv" applied 1)" -ge 4 ] && break
  sleep 0.05
done
[ "$(tsv_count "$tmp/run/dc-b/rounds.tsv" applied 1)" -ge 4 ] || fail "dc-b did not apply 4 rounds"
wpid=$(pgrep -f -- "worker --job $tmp/job.json --cluster dc-b " | head -1)
[ -n "$wpid" ] || fail "no dc-b worker process"
kill -9 "$wpid"
echo "dc-b's worker (pid $wpid) killed"

rc=0
wait "$run_pid" || rc=$?
run_pid=
[ "$rc" -eq 0 ] || fail "nebula run exited $rc"
grep -q "cluster dc-b killed by signal 9; restarting it with --rejoin (restart 1 of" "$tmp/run.log" ||
  fail "no restart line"
grep -q "dc-b rejoined from dc-a at round" "$tmp/run/dc-b/worker.log" || fail "no rejoin line"
same_hash "$tmp/run/dc-a" "$tmp/run/dc-b"
rj=$(json_field "$tmp/run/dc-b/summary.json" rejoined_at_round)
[ "$rj" -gt 0 ] || fail "dc-b's summary has no rejoin round"
[ -z "$(pgrep -f -- "--out $tmp/" || true)" ] || fail "processes left behind"
echo "dc-b restarted by nebula run, rejoined at round $rj; $(json_field "$tmp/run/dc-a/summary.json" rounds_applied) rounds applied"
echo "PASS"
