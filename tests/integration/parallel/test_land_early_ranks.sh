#!/usr/bin/env bash
# Early landing with a cluster of several ranks: dc-a runs 2 data-parallel MPI ranks, dc-b one
# process; overlap (tau 6 of H 8) with the adaptive scheduler, so each update lands at the first
# step after its exchange is over. The leader then runs its steps one at a time and tells the
# other rank "more steps" without a parameter broadcast between them (worker/ranks.c,
# NB__RK_MORE): a rank that expected one would hang, one that missed a landing would diverge.
# Dense int8 frames over a 10 Mbit/s cap on loopback take a few steps, so most landings fall
# between step 1 and tau (which step depends on the machine; the checks do not). Both clusters
# end with the same theta_global, nothing left running. Skipped (77) without mpirun.
# usage: test_land_early_ranks.sh NEBULA DATA_DIR
set -euo pipefail
nebula=$1
data=$2
command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
cat >"$tmp/job.json" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "land-early-ranks"},
 "spec": {"task": "pretrain",
  "clusters": [
   {"id": "dc-a", "workers": 2, "data": {"tier": "quick", "languages": ["en", "de"]}},
   {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 2, "width": 64, "heads": 2, "context": 64},
  "training": {"seed": 7, "batchSize": 8, "maxSteps": 80,
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": {"mode": "outer", "innerSteps": 8, "overlap": true, "overlapSteps": 6},
  "compression": {"density": {"initial": 1, "min": 0.5, "max": 1}, "values": "int8",
                  "adaptive": true},
  "link": {"rateMbit": 10}}}
JOB
rc=0
OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 timeout 200 "$nebula" run "$tmp/job.json" \
  --out "$tmp/run" --data-dir "$data" --loopback >"$tmp/run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -40 "$tmp/run.log"; fail "nebula run exited $rc"; }
grep -q "dc-a: 2 ranks under mpirun" "$tmp/run.log" || fail "dc-a did not run 2 ranks"
grep -q "theta_global identical on every cluster" "$tmp/run.log" || fail "theta_global differs"
# where the updates landed (the scheduler may let one land at a round's end: no line then)
echo "dc-a landings (count, after step): $(grep -o 'landed after step [0-9]*' \
  "$tmp/run/dc-a/worker.log" | awk '{print $4}' | sort -n | uniq -c | tr -s ' \n' ' ')"
echo "PASS: land early with 2 ranks"
