#!/usr/bin/env bash
# A cluster of two MPI ranks killed (SIGKILL to its mpirun and ranks) mid-run and restarted with
# --rejoin under mpirun: its leader pulls the global state from the other cluster and hands it
# to its second rank, both clusters apply rounds together again and end with the same
# theta_global hash. Loopback, no root; skipped (77) without mpirun.
# usage: test_faults_rejoin_mpi.sh NEBULA DATA_DIR
set -euo pipefail
nebula=$1
data=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
. "$here/lib.sh"

export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 NB_ROUND_DEADLINE_S=8
# several ranks need H-step rounds (no roundSeconds): 30 rounds of 8 steps, a model slow
# enough that the run spans the kill and the restart
cat >"$tmp/job.json" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "faults-mpi"},
 "spec": {"task": "pretrain",
  "clusters": [
   {"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
   {"id": "dc-b", "workers": 2, "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 2, "width": 64, "heads": 2, "context": 64},
  "training": {"seed": 7, "batchSize": 16, "maxSteps": 240,
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": {"mode": "outer", "innerSteps": 8, "peerTimeoutSeconds": 2},
  "compression": {"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8",
                  "adaptive": false},
  "link": {"rateMbit": 50}}}
JOB
make_pki "$tmp/pki" 127.0.0.1 127.0.0.1
port_a=$((20000 + ($$ % 20000)))
port_b=$((port_a + 1))
args() { # CLUSTER LISTEN_PORT PEER PEER_PORT
  echo worker --job "$tmp/job.json" --cluster "$1" --out "$tmp/$1" --listen "127.0.0.1:$2" \
    --peer "$3=127.0.0.1:$4" --pki "$tmp/pki" --secret-file "$tmp/pki/job.secret" --data-dir "$data"
}
mpi_b() { # extra args: dc-b as 2 ranks in its own process group
  exec setsid mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
    -np 2 "$nebula" $(args dc-b "$port_b" dc-a "$port_a") "$@"
}
("$nebula" $(args dc-a "$port_a" dc-b "$port_b")) >"$tmp/a.log" 2>&1 &
apid=$!
pids+=("$apid")
(mpi_b) >"$tmp/b.log" 2>&1 &
bpid=$!
pids+=("$bpid")

for _ in $(seq 1 600); do
  [ -f "$tmp/dc-b/rounds.tsv" ] && [ "$(tsv_count "$tmp/dc-b/rounds.tsv" applied 1)" -ge 4 ] && break
  sleep 0.05
done
[ "$(tsv_count "$tmp/dc-b/rounds.tsv" applied 1)" -ge 4 ] || fail "dc-b did not apply 4 rounds"
# mpirun and both ranks (the ranks are not in mpirun's process group)
kill -9 -- "-$bpid" 2>/dev/null || kill -9 "$bpid"
pkill -9 -f -- "worker --job $tmp/job.json --cluster dc-b " || true
wait "$bpid" 2>/dev/null || true
for _ in $(seq 1 100); do pgrep -f -- "--cluster dc-b --out $tmp/" >/dev/null || break; sleep 0.05; done
pids=("$apid")
echo "dc-b (mpirun, 2 ranks) killed"
sleep 0.5
kill -0 "$apid" 2>/dev/null || fail "dc-a stopped after the kill"

(mpi_b --rejoin) >"$tmp/b2.log" 2>&1 &
bpid=$!
pids+=("$bpid")
wait "$apid" || fail "dc-a failed"
wait "$bpid" || fail "dc-b (rejoined under mpirun) failed"
pids=()
grep -q "dc-b rejoined from dc-a at round" "$tmp/b2.log" || fail "no rejoin line"
same_hash "$tmp/dc-a" "$tmp/dc-b"
[ "$(json_field "$tmp/dc-b/summary.json" ranks)" = 2 ] || fail "dc-b did not run 2 ranks"
rj=$(json_field "$tmp/dc-b/summary.json" rejoined_at_round)
after=$(awk -F'\t' -v r="$rj" 'NR > 1 && $1 >= r && $13 == 1 { n++ } END { print n + 0 }' "$tmp/dc-a/rounds.tsv")
[ "$after" -ge 3 ] || fail "only $after rounds applied on dc-a after the rejoin at round $rj"
echo "dc-b rejoined at round $rj under mpirun; $after rounds applied together afterwards"
echo "PASS"
