#!/bin/sh
# The gateway with launcher "slurm" against a private single-node Slurm started here (root only):
# slurm.conf in a temp folder (auth/none, free ports on 127.0.0.1, state and spool inside), then a
# 2-task job succeeds (job.sbatch as generated, logs, per-task folders, exit status), a job whose
# task exits 3 fails with code 3, and a long job survives a SIGKILLed gateway, is re-attached by
# its Slurm job id, and is cancelled (scancel) with no task left; a spec.program job runs the
# user's own program (on libnebula) as 2 tasks under srun. Every daemon started here is
# stopped. Skips (77) when not root, without Slurm, or when its daemons do not come up.
# Usage: slurm.sh NEBULA [USER_PROGRAM]  (USER_PROGRAM: tests/unit/gateway/user_program.c, built:
# a spec.program job then runs it as 2 Slurm tasks)
set -u
NB=$1
PROG=${2:-}
[ "$(id -u)" = 0 ] || { echo "SKIP: a private Slurm needs root (slurmd runs jobs as any user)"; exit 77; }
for t in slurmctld slurmd sbatch squeue scancel sinfo; do
  command -v $t >/dev/null 2>&1 || PATH=$PATH:/usr/sbin
  command -v $t >/dev/null 2>&1 || { echo "SKIP: $t not installed (slurm-wlm)"; exit 77; }
done
. "$(dirname "$0")/common.sh"
CTLD_PID= SLURMD_PID=
slurm_cleanup() {
  if [ -n "$CTLD_PID" ]; then
    scancel --full --signal=KILL -p nbtest >/dev/null 2>&1
    i=0; while [ -n "$(squeue -h -t PD,R,CG,S -o %i 2>/dev/null)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  fi
  for p in $SLURMD_PID $CTLD_PID; do kill -TERM "$p" 2>/dev/null; done
  for p in $SLURMD_PID $CTLD_PID; do
    i=0; while alive "$p" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
}
EXTRA_CLEANUP=slurm_cleanup

# free ports on 127.0.0.1
PORTS=$(python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1", 0)) for s in ss]
print(" ".join(str(s.getsockname()[1]) for s in ss))') || fail "no free ports"
set -- $PORTS
S="$T/slurm"
mkdir -p "$S/state" "$S/spool"
cat > "$S/slurm.conf" <<CONF
ClusterName=nbtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$1
SlurmdPort=$2
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ReturnToService=2
KillWait=2
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=nbtest Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$S/slurm.conf"
slurmctld -D -i > "$S/ctld.out" 2>&1 &
CTLD_PID=$!
slurmd -D -N localhost > "$S/slurmd.out" 2>&1 &
SLURMD_PID=$!
i=0
until [ "$(sinfo -h -p nbtest -o %t 2>/dev/null)" = idle ]; do
  i=$((i+1))
  if [ $i -gt 150 ] || ! alive "$CTLD_PID" || ! alive "$SLURMD_PID"; then
    echo "SKIP: the private Slurm did not come up: $(tail -3 "$S/slurmctld.log" "$S/slurmd.log" "$S/ctld.out" "$S/slurmd.out" 2>/dev/null | tr '\n' ' ')"
    exit 77
  fi
  sleep 0.1
done

make_pki
cat > "$T/job.sh" <<'SCRIPT'
r=$SLURM_PROCID
case "$1" in
mpi-*) echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE in $NB_JOB_ID"; exit 0;;
ok-*) echo "task $r of $SLURM_NTASKS in $NB_JOB_ID"; echo "err $r" >&2
  [ "$r" = 0 ] && echo '{"step": 5, "max_steps": 5, "loss": 1.5, "source": "task0"}' >> "$NB_JOB_PROGRESS"
  exit 0;;
bad-*) [ "$r" = 1 ] && exit 3; exit 0;;
sleepy-*) echo $$ >> "$NB_JOB_DIR/pids"; sleep 300 & echo $! >> "$NB_JOB_DIR/pids"; wait;;
esac
SCRIPT
cat > "$T/gw.json" <<CFG
{"cluster_id": "dc-a", "listen": "127.0.0.1:0",
 "tls": {"ca": "pki/ca.crt", "cert": "pki/clusters/dc-a.crt", "key": "pki/clusters/dc-a.key"},
 "launcher": "slurm",
 "slurm": {"partition": "nbtest", "sbatch_args": ["--time=5"], "poll_ms": 100},
 "command": ["/bin/sh", "$T/job.sh", "{job}"],
 "resources": {"slots": 8},
 "acl": [{"user": "alice", "clusters": ["dc-a"], "max_workers": 2}],
 "cancel_grace_ms": 3000, "poll_ms": 20}
CFG
start_gw

# a 2-task job that succeeds
ID=$(submit ok 2)
W="$T/work/$ID"
"$NB" watch "$ID" > "$T/watch.out"; rc=$?
[ $rc -eq 0 ] || fail "watch exit $rc: $(cat "$T/watch.out")"
grep -q "state succeeded" "$T/watch.out" || fail "ok job not succeeded: $(cat "$T/watch.out")"
for l in "#SBATCH --job-name=nebula-$ID" "#SBATCH --ntasks=2" "#SBATCH --output=$W/stdout.log" \
         "#SBATCH --error=$W/stderr.log" "#SBATCH --chdir=$W" "#SBATCH --partition=nbtest" \
         "#SBATCH --time=5"; do
  grep -qx -- "$l" "$W/job.sbatch" || fail "job.sbatch lacks '$l': $(cat "$W/job.sbatch")"
done
grep -q "^srun " "$W/job.sbatch" || fail "job.sbatch has no srun"
"$NB" logs "$ID" > "$T/logs.out"
grep -q "task 0 of 2 in $ID" "$T/logs.out" || fail "job log lacks task 0: $(cat "$T/logs.out")"
grep -q "task 1 of 2 in $ID" "$T/logs.out" || fail "job log lacks task 1"
for r in 0 1; do
  [ "$(cat "$W/ranks/$r/stdout.log")" = "task $r of 2 in $ID" ] || fail "ranks/$r/stdout.log"
  [ "$(cat "$W/ranks/$r/stderr.log")" = "err $r" ] || fail "ranks/$r/stderr.log"
  [ "$(cat "$W/ranks/$r/exit_code")" = 0 ] || fail "ranks/$r/exit_code"
done
"$NB" watch "$ID" --json > "$T/watch.json"
grep '"launch"' "$T/watch.json" | grep -q '"launcher":"slurm","pid":0,"start_ticks":0,"slurm_id":"[0-9]' ||
  fail "launch event: $(grep '"launch"' "$T/watch.json")"
grep -q '"kind":"progress"' "$T/watch.json" || fail "no progress event"
grep '"exit"' "$T/watch.json" | grep -q '"exit_code":0.*"ranks":\[0,0\]' || fail "exit event: $(grep '"exit"' "$T/watch.json")"
SID=$(grep '"launch"' "$T/watch.json" | sed -n 's/.*"slurm_id":"\([0-9]*\)".*/\1/p')
[ "$(squeue -h -j "$SID" -t all -o %T)" = COMPLETED ] || fail "Slurm job $SID not COMPLETED"

# a task exits 3: the job fails with code 3
ID=$(submit bad 2)
"$NB" watch "$ID" > /dev/null; rc=$?
[ $rc -eq 10 ] || fail "watch of the failing job exit $rc"
"$NB" get "$ID" --json > "$T/bad.json"
grep -q '"exit_code": 3' "$T/bad.json" || fail "exit code not 3: $(cat "$T/bad.json")"
grep -q 'Slurm job [0-9]* exited with code 3' "$T/bad.json" || fail "reason: $(cat "$T/bad.json")"
[ "$(cat "$T/work/$ID/ranks/1/exit_code")" = 3 ] || fail "task 1 exit_code"

# a long job: the gateway is SIGKILLed, restarted, re-attaches by Slurm id; cancel = scancel
ID=$(submit sleepy 2)
wait_lines "$T/work/$ID/pids" 4
kill -9 "$GW_PID"; wait "$GW_PID" 2>/dev/null; GW_PID=
start_gw
"$NB" get "$ID" | grep -q "state: *running" || fail "Slurm job not running after a restart: $("$NB" get "$ID")"
grep -q "Slurm job [0-9]* still runs: re-attached" "$T/gw.err" || fail "no re-attach in the log"
"$NB" cancel "$ID" --reason "enough" | grep -q "cancelled by alice: enough" || fail "cancel"
for p in $(cat "$T/work/$ID/pids"); do alive "$p" && fail "task pid $p survived cancel"; done
SID=$("$NB" watch "$ID" --json | grep '"launch"' | sed -n 's/.*"slurm_id":"\([0-9]*\)".*/\1/p')
[ "$(squeue -h -j "$SID" -t all -o %T)" = CANCELLED ] || fail "Slurm job $SID: $(squeue -h -j "$SID" -t all -o %T)"
"$NB" watch "$ID" > /dev/null; [ $? -eq 11 ] || fail "watch of a cancelled job: not 11"
[ -z "$(squeue -h -t PD,R,CG,S -o %i)" ] || fail "Slurm jobs left: $(squeue -h)"
stop_gw

# slurm.step "mpirun": OpenMPI's mpirun inside the allocation starts the ranks
sed -i 's/"poll_ms": 100}/"poll_ms": 100, "step": "mpirun"}/' "$T/gw.json"
start_gw
ID=$(submit mpi 2)
"$NB" watch "$ID" > "$T/mpi.out"; rc=$?
[ $rc -eq 0 ] || fail "mpirun step: watch exit $rc: $(cat "$T/mpi.out")"
grep -q "^mpirun .* -np 2 " "$T/work/$ID/job.sbatch" || fail "job.sbatch lacks mpirun: $(cat "$T/work/$ID/job.sbatch")"
for r in 0 1; do
  [ "$(cat "$T/work/$ID/ranks/$r/stdout.log")" = "rank $r of 2 in $ID" ] || fail "mpirun step: ranks/$r/stdout.log: $(cat "$T/work/$ID/ranks/$r/stdout.log")"
done
# and, when the quick data set is at hand, a real `nebula worker` job as 2 MPI ranks
DATA="$(cd "$(dirname "$0")/../../.." && pwd)/data/quick"
if [ -d "$DATA/mono" ]; then
  stop_gw
  sed -i "s|\"command\": .*|\"command\": [\"nebula\", \"worker\", \"--job\", \"{descriptor}\", \"--cluster\", \"{cluster}\", \"--out\", \"{jobdir}/out\", \"--insecure\", \"--data-dir\", \"$DATA\", \"--steps\", \"4\"],|" "$T/gw.json"
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
  [ $rc -eq 0 ] || fail "nebula worker under Slurm: watch exit $rc: $("$NB" logs "$ID" --stderr)"
  "$NB" logs "$ID" | grep -q "dc-a done: 2 rounds" || fail "worker log: $("$NB" logs "$ID")"
  grep ' exit {' "$T/tiny.out" | grep -q '"ranks":\[0,0\]' || fail "worker ranks: $(grep exit "$T/tiny.out")"
else
  echo "note: no data/quick in the source tree: the nebula worker part is left out"
fi
stop_gw

# spec.program under Slurm's srun: the user's own program (a C one on libnebula) as 2 tasks,
# its session from the NEBULA_* variables the gateway set; the leader task syncs its rounds
if [ -n "$PROG" ]; then
  PDIR=$(dirname "$PROG")
  sed -i 's/, "step": "mpirun"}/}/' "$T/gw.json"
  sed -i "s|\"acl\":|\"paths\": {\"allow\": [\"$PDIR\"]}, \"acl\":|" "$T/gw.json"
  start_gw
  cat > "$T/prog.json" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "prog"},
 "spec": {"clusters": [{"id": "dc-a", "workers": 2}],
  "program": {"command": ["$PROG", "--rounds", "2"], "workDir": "run"},
  "sync": {"innerSteps": 8}}}
JOB
  ID=$("$NB" submit "$T/prog.json") || fail "submit the program job"
  "$NB" watch "$ID" > "$T/prog.out"; rc=$?
  [ $rc -eq 0 ] || fail "program under Slurm: watch exit $rc: $("$NB" logs "$ID" --stderr)"
  grep -q "^srun " "$T/work/$ID/job.sbatch" || fail "program job.sbatch has no srun"
  "$NB" logs "$ID" > "$T/prog.log"
  for r in 0 1; do
    grep -q "rank $r env NEBULA_JOB_ID=$ID" "$T/prog.log" || fail "task $r lacks its session's environment: $(cat "$T/prog.log")"
  done
  grep -q "rank 0 cwd $T/work/$ID/run" "$T/prog.log" || fail "program not in its workDir"
  grep -q "^done 2 rounds, global " "$T/prog.log" || fail "the leader task did not sync: $(cat "$T/prog.log")"
  grep -q '"kind":"progress"' "$T/work/$ID/events.jsonl" 2>/dev/null ||
    "$NB" watch "$ID" --json | grep -q '"kind":"progress"' || fail "no progress event of the program"
  stop_gw
else
  echo "note: no user program given: the spec.program part is left out"
fi
echo "launcher slurm: ok"
