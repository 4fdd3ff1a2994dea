#!/usr/bin/env bash
# Every benchmark's --json output is JSON (written with jansson; a number that is not finite is
# null, never "nan"): each bench with tiny settings, piped through Python's json module. e2e
# with --no-dense has no dense run, so its dense_over_nebula_bytes ratio is NaN: null here.
# usage: bench_json.sh NEBULA DATA_DIR (the trainer's tiny corpus)
set -u
nebula=${1:?usage: bench_json.sh NEBULA DATA_DIR}
data=${2:?usage: bench_json.sh NEBULA DATA_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # NAME [python assertion on o]
  if ! python3 -c 'import json, sys
o = json.load(open(sys.argv[1]))
assert isinstance(o, dict) and o, o
exec(sys.argv[2])' "$tmp/out" "${2:-pass}"; then
    echo "FAIL: nebula bench $1 --json: $(head -c 2000 "$tmp/out") $(tail -3 "$tmp/err")"
    fail=1
  fi
}
run() { # NAME ARGS...: the bench's stdout into $tmp/out
  "$nebula" bench "$@" --json >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: nebula bench $* exit $?: $(tail -3 "$tmp/err")"; fail=1; }
}
run codec --n 4096 --runs 1; check codec
run seal --mib 1 --reps 1; check seal
run rpc --mib 1 --reps 1; check rpc
run allreduce --mib 1 --iters 1 --device cpu; check allreduce
run wan --loopback-only --mib 1 --reps 1; check wan
run train --layers 1 --dim 32 --heads 1 --ctx 16 --batch 1 --steps 1 --torch none; check train
run sgemm --n 64 --reps 1; check sgemm 'assert o["gflops"] > 0 and o["core"], o'
run decode --layers 1 --dim 32 --heads 1 --ctx 16 --prompt 4 --new 2 --batch 1 --reps 1; check decode
run parallel --layers 4 --dim 32 --heads 4 --ctx 16 --batch 8 --micro 2 --steps 1
check parallel 'assert [(r["ranks"], r["tensor"], r["pipeline"]) for r in o["runs"]] == [(2, 1, 1), (2, 2, 1), (2, 1, 2), (4, 1, 1), (4, 2, 1), (4, 1, 2), (4, 4, 1), (4, 1, 4), (4, 2, 2)] and all(r["tokens_per_s"] > 0 and r["state_mib_per_rank"] > 0 for r in o["runs"]) and o["runs"][1]["state_vs_data"] < 0.75 and o["runs"][2]["state_vs_data"] < 0.75 and o["runs"][8]["state_vs_data"] < 0.5, o'
cat >"$tmp/job.json" <<JSON
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "bench-tiny"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"dir": "$data", "languages": ["en", "de"]}},
               {"id": "dc-b", "data": {"dir": "$data", "languages": ["en", "ru"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 1, "batchSize": 2, "maxSteps": 8, "eval": {"batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4}, "link": {"rateMbit": 100}}}
JSON
run e2e --job "$tmp/job.json" --steps 8 --eval-batches 1 --out "$tmp/e2e" --no-dense
check e2e 'assert o["dense_over_nebula_bytes"] is None and o["dense"] == "skipped (--no-dense)", o'
run pareto --job "$tmp/job.json" --seeds 1 --points top10-int8 --steps 8 --eval-batches 1 --out "$tmp/pareto"
check pareto 'assert o["points"][0]["name"] == "top10-int8" and len(o["points"][0]["eval_bpb"]) == 1, o'
[ "$fail" -eq 0 ] && echo "bench --json: every benchmark's output parses"
exit "$fail"
