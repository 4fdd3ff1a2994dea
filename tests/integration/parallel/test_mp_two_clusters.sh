#!/usr/bin/env bash
# Two clusters with different layouts train one model: dc-a runs model parallelism over 2 MPI
# ranks (LAYOUT "tensor": spec.clusters[0].parallel.tensor 2; "pipeline": parallel.pipeline 2,
# the step's batch in 4 micro-batches through the 1F1B schedule) or over 4 ("both": two stages
# of two tensor-parallel shards), dc-b one unsharded process.
# The outer rounds work on the logical parameters, so both clusters apply every round and end
# with the same theta_global hash and the same final.safetensors bytes; dc-a's evaluations and
# checkpoints are collective over its two ranks, and a checkpoint it wrote loads into an
# unsharded model (`nebula eval`). Then both clusters resume (--resume) for 6 more rounds with
# dc-a as one unsharded process: its model-parallel checkpoint resumes in another layout, and
# both end again with the same theta_global. Loopback, no root; skipped (77) without mpirun.
# usage: test_mp_two_clusters.sh NEBULA DATA_DIR [tensor|pipeline|both]
set -euo pipefail
nebula=$1
data=$2
layout=${3:-tensor}
case "$layout" in
  tensor) parallel='{"tensor": 2}' ranks=2 grid="tensor 2 x pipeline 1" ;;
  pipeline) parallel='{"pipeline": 2, "microBatches": 4}' ranks=2 grid="tensor 1 x pipeline 2" ;;
  both) parallel='{"tensor": 2, "pipeline": 2, "microBatches": 4}' ranks=4
    grid="tensor 2 x pipeline 2" ;;
  *) echo "usage: $0 NEBULA DATA_DIR [tensor|pipeline|both]"; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
. "$here/../faults/lib.sh"

export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1
mp_job() { # FILE DC_A_CLUSTER_FIELDS MAX_STEPS
  cat >"$1" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "mp-2dc"},
 "spec": {"task": "pretrain",
  "clusters": [
   {"id": "dc-a", $2,
    "data": {"tier": "quick", "languages": ["en", "de"]}},
   {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 2, "width": 64, "heads": 2, "context": 64},
  "training": {"seed": 7, "batchSize": 8, "maxSteps": $3,
               "optimizer": {"lr": 0.003, "warmupSteps": 2}, "eval": {"everyRounds": 2}},
  "sync": {"mode": "outer", "innerSteps": 8},
  "compression": {"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8",
                  "adaptive": false},
  "checkpoint": {"everyRounds": 3},
  "link": {"rateMbit": 50}}}
JOB
}
mp_job "$tmp/job.json" "\"workers\": $ranks, \"parallel\": $parallel" 48
"$nebula" validate "$tmp/job.json" >/dev/null || fail "the job does not validate"
make_pki "$tmp/pki" 127.0.0.1 127.0.0.1
port_a=$((20000 + ($$ % 20000)))
port_b=$((port_a + 1))
args() { # CLUSTER LISTEN_PORT PEER PEER_PORT
  echo worker --job "$tmp/job.json" --cluster "$1" --out "$tmp/$1" --listen "127.0.0.1:$2" \
    --peer "$3=127.0.0.1:$4" --pki "$tmp/pki" --secret-file "$tmp/pki/job.secret" --data-dir "$data"
}
(exec setsid mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
   -np "$ranks" "$nebula" $(args dc-a "$port_a" dc-b "$port_b")) >"$tmp/a.log" 2>&1 &
apid=$!
pids+=("$apid")
("$nebula" $(args dc-b "$port_b" dc-a "$port_a")) >"$tmp/b.log" 2>&1 &
bpid=$!
pids+=("$bpid")
wait "$apid" || fail "dc-a ($layout parallel, $ranks ranks) failed"
wait "$bpid" || fail "dc-b failed"
pids=()
same_hash "$tmp/dc-a" "$tmp/dc-b"
[ "$(json_field "$tmp/dc-a/summary.json" ranks)" = "$ranks" ] || fail "dc-a did not run $ranks ranks"
grep -q "dc-a: $ranks ranks: data 1 x $grid" "$tmp/a.log" || fail "dc-a did not run $layout parallel"
for c in dc-a dc-b; do
  n=$(tsv_count "$tmp/$c/rounds.tsv" applied 1)
  [ "$n" = 6 ] || fail "$c applied $n of 6 rounds"
done
cmp "$tmp/dc-a/final.safetensors" "$tmp/dc-b/final.safetensors" ||
  fail "final.safetensors differ between the $layout-parallel and the unsharded cluster"
# dc-a's checkpoint (written in the logical layout by its ranks) loads unsharded
ck=$(ls -d "$tmp/dc-a/checkpoints"/step-* | sort -t- -k2 -n | tail -1)
"$nebula" eval "$ck/model.safetensors" --data-dir "$data" --langs en --batches 1 \
  >"$tmp/eval.log" 2>&1 || fail "nebula eval of dc-a's checkpoint $ck: $(tail -3 "$tmp/eval.log")"
echo "dc-a ($layout parallel, $ranks ranks) and dc-b (one process): 6 rounds applied on both, same" \
  "theta_global and final model;" \
  "dc-a's $(basename "$ck") evaluates unsharded"
# the resume in another layout: dc-a one process, both clusters 6 more rounds
mp_job "$tmp/job2.json" '"workers": 1' 96
args2() { args "$@" | sed "s|$tmp/job.json|$tmp/job2.json|"; }
("$nebula" $(args2 dc-a "$port_a" dc-b "$port_b") --resume) >"$tmp/a2.log" 2>&1 &
apid=$!
pids+=("$apid")
("$nebula" $(args2 dc-b "$port_b" dc-a "$port_a") --resume) >"$tmp/b2.log" 2>&1 &
bpid=$!
pids+=("$bpid")
wait "$apid" || fail "dc-a (resumed as one process) failed"
wait "$bpid" || fail "dc-b (resumed) failed"
pids=()
grep -q "dc-a resumes at round 6 (step 48)" "$tmp/a2.log" || fail "dc-a did not resume at round 6"
same_hash "$tmp/dc-a" "$tmp/dc-b"
for c in dc-a dc-b; do
  n=$(tsv_count "$tmp/$c/rounds.tsv" applied 1)
  [ "$n" = 12 ] || fail "$c applied $n of 12 rounds after the resume"
done
echo "dc-a's $layout-parallel checkpoint resumed as one process: 12 rounds on both, same theta_global"
echo "PASS"
