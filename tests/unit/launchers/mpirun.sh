#!/bin/sh
# The gateway with launcher "mpirun": a 2-worker job runs as 2 ranks (OMPI_COMM_WORLD_*), each
# with its own ranks/<r>/ folder (stdout, stderr, exit status), the job's logs holding both; a
# rank exiting 3 fails the job with code 3 and per-rank codes [0, 3] in the exit event; after a
# SIGKILLed gateway restarts, cancel kills mpirun and every rank (they sit in process groups of
# their own). Usage: mpirun.sh NEBULA
set -u
NB=$1
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed"; exit 77; }
. "$(dirname "$0")/common.sh"
make_pki
cat > "$T/job.sh" <<'SCRIPT'
r=$OMPI_COMM_WORLD_RANK
case "$1" in
ok-*) echo "rank $r of $OMPI_COMM_WORLD_SIZE in $NB_JOB_ID"; echo "err $r" >&2
  [ "$r" = 0 ] && echo '{"step": 5, "max_steps": 5, "loss": 1.5, "source": "rank0"}' >> "$NB_JOB_PROGRESS"
  exit 0;;
bad-*) [ "$r" = 1 ] && { sleep 0.3; exit 3; }; exit 0;;
sleepy-*) echo $$ >> "$NB_JOB_DIR/pids"; sleep 300 & echo $! >> "$NB_JOB_DIR/pids"; wait;;
esac
SCRIPT
cat > "$T/gw.json" <<CFG
{"cluster_id": "dc-a", "listen": "127.0.0.1:0",
 "tls": {"ca": "pki/ca.crt", "cert": "pki/clusters/dc-a.crt", "key": "pki/clusters/dc-a.key"},
 "launcher": "mpirun",
 "command": ["/bin/sh", "$T/job.sh", "{job}"],
 "resources": {"slots": 4},
 "acl": [{"user": "alice", "clusters": ["dc-a"], "max_workers": 2}],
 "cancel_grace_ms": 1000, "poll_ms": 20}
CFG
start_gw

# a job of 2 ranks that succeeds
ID=$(submit ok 2)
"$NB" watch "$ID" > "$T/watch.out"; rc=$?
[ $rc -eq 0 ] || fail "watch exit $rc: $(cat "$T/watch.out")"
grep -q "state succeeded" "$T/watch.out" || fail "ok job not succeeded: $(cat "$T/watch.out")"
W="$T/work/$ID"
"$NB" logs "$ID" > "$T/logs.out"
grep -q "rank 0 of 2 in $ID" "$T/logs.out" || fail "job log lacks rank 0: $(cat "$T/logs.out")"
grep -q "rank 1 of 2 in $ID" "$T/logs.out" || fail "job log lacks rank 1"
for r in 0 1; do
  [ "$(cat "$W/ranks/$r/stdout.log")" = "rank $r of 2 in $ID" ] || fail "ranks/$r/stdout.log: $(cat "$W/ranks/$r/stdout.log")"
  [ "$(cat "$W/ranks/$r/stderr.log")" = "err $r" ] || fail "ranks/$r/stderr.log"
  [ "$(cat "$W/ranks/$r/exit_code")" = 0 ] || fail "ranks/$r/exit_code"
done
[ "$(cat "$W/exit_code")" = 0 ] || fail "job exit_code"
"$NB" watch "$ID" --json > "$T/watch.json"
grep -q '"kind":"progress"\|"kind": "progress"' "$T/watch.json" || fail "no progress event: $(cat "$T/watch.json")"
grep '"launch"' "$T/watch.json" | grep -q '"launcher":"mpirun"' || fail "launch event lacks the launcher: $(grep launch "$T/watch.json")"
grep '"exit"' "$T/watch.json" | grep -q '"ranks":\[0,0\]' || fail "exit event lacks ranks [0,0]: $(grep '"exit"' "$T/watch.json")"

# a rank exits 3: the job fails with code 3, per-rank codes recorded
ID=$(submit bad 2)
"$NB" watch "$ID" > /dev/null; rc=$?
[ $rc -eq 10 ] || fail "watch of the failing job exit $rc"
"$NB" get "$ID" --json > "$T/bad.json"
grep -q '"exit_code": 3' "$T/bad.json" || fail "exit code not 3: $(cat "$T/bad.json")"
grep -q 'exited with code 3' "$T/bad.json" || fail "reason: $(cat "$T/bad.json")"
[ "$(cat "$T/work/$ID/ranks/1/exit_code")" = 3 ] || fail "rank 1 exit_code"
[ "$(cat "$T/work/$ID/ranks/0/exit_code")" = 0 ] || fail "rank 0 exit_code"
"$NB" watch "$ID" --json | grep '"exit"' | grep -q '"ranks":\[0,3\]' || fail "exit event lacks ranks [0,3]"

# a SIGKILLed gateway restarts and re-attaches; cancel then kills mpirun and both ranks with
# their children
ID=$(submit sleepy 2)
wait_lines "$T/work/$ID/pids" 4
kill -9 "$GW_PID"; wait "$GW_PID" 2>/dev/null; GW_PID=
start_gw
"$NB" get "$ID" | grep -q "state: *running" || fail "mpirun job not running after a restart"
grep -q "process [0-9]* still runs: re-attached" "$T/gw.err" || fail "no re-attach in the log"
LEADER=$("$NB" get "$ID" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')
[ -n "$LEADER" ] && [ "$LEADER" -gt 0 ] || fail "no leader pid"
MPI=$(ps -e -o pid=,sid=,comm= | awk -v s="$LEADER" '$2 == s && $3 ~ /mpirun/ {print $1}')
[ -n "$MPI" ] || fail "no mpirun in the job's session"
"$NB" cancel "$ID" --reason "enough" | grep -q "cancelled by alice: enough" || fail "cancel"
for p in $(cat "$T/work/$ID/pids") $MPI $LEADER; do alive "$p" && fail "pid $p survived cancel"; done
LEFT=$(ps -e -o sid=,pid=,stat=,args= | awk -v s="$LEADER" '$1 == s && $3 !~ /^Z/')
[ -z "$LEFT" ] || fail "processes left in the job's session: $LEFT"
"$NB" watch "$ID" > /dev/null; [ $? -eq 11 ] || fail "watch of a cancelled job: not 11"
stop_gw

# the real thing, when the quick data set is at hand: `nebula worker` as 2 MPI ranks of one
# cluster (rank 0 leads), 2 rounds of 2 steps of a tiny model
DATA="$(cd "$(dirname "$0")/../../.." && pwd)/data/quick"
if [ -d "$DATA/mono" ]; then
  cat > "$T/gw.json" <<CFG
{"cluster_id": "dc-a", "listen": "127.0.0.1:0",
 "tls": {"ca": "pki/ca.crt", "cert": "pki/clusters/dc-a.crt", "key": "pki/clusters/dc-a.key"},
 "launcher": "mpirun",
 "command": ["nebula", "worker", "--job", "{descriptor}", "--cluster", "{cluster}",
             "--out", "{jobdir}/out", "--insecure", "--data-dir", "$DATA", "--steps", "4"],
 "acl": [{"user": "alice", "clusters": ["dc-a"], "max_workers": 2}], "poll_ms": 50}
CFG
  start_gw
  cat > "$T/tiny.json" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "tiny"},
 "spec": {"task": "pretrain", "clusters": [{"id": "dc-a", "workers": 2, "device": "cpu",
   "data": {"tier": "quick", "languages": ["en", "de"]}}],
  "model": {"layers": 1, "width": 64, "heads": 2, "context": 32},
  "training": {"batchSize": 4, "maxSteps": 4}, "sync": {"mode": "outer", "innerSteps": 2}}}
JOB
  ID=$("$NB" submit "$T/tiny.json") || fail "submit tiny"
  "$NB" watch "$ID" > "$T/tiny.out"; rc=$?
  [ $rc -eq 0 ] || fail "nebula worker under mpirun: watch exit $rc: $("$NB" logs "$ID" --stderr)"
  "$NB" logs "$ID" | grep -q "dc-a done: 2 rounds" || fail "worker log: $("$NB" logs "$ID")"
  [ -f "$T/work/$ID/out/summary.json" ] || fail "no summary.json"
  grep ' exit {' "$T/tiny.out" | grep -q '"ranks":\[0,0\]' || fail "worker ranks: $(grep exit "$T/tiny.out")"
  stop_gw
else
  echo "note: no data/quick in the source tree: the nebula worker part is left out"
fi
echo "launcher mpirun: ok"
