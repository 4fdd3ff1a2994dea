#!/usr/bin/env bash
# Heterogeneous clusters: `nebula run --loopback` of a two-cluster job with wall-time rounds
# (sync.roundSeconds 0.6) where dc-b is slowed 8x (the descriptor's cluster `slowdown`: it sleeps
# 7x each step's own time after it). The model is large enough that a round's step cap
# (innerSteps' default, 50) never fits in the budget on a fast, quiet machine, or the fast
# cluster would stop early and wait. The slowed cluster must do fewer inner steps per round, the
# fast one must not wait on it, each round's weights must come from the samples processed
# (samples differ, samples_all = their sum on both sides), and the final hash must agree.
# Every margin is derived from what the run itself measured, so that the verdict holds on a
# loaded machine: a round that waited on the slowed cluster (lockstep, the same steps on both)
# would cost the fast cluster (slowdown - 1) x its own compute in exchange wait, while a
# wall-time round costs it at most one slowed step (slowdown x its own step time) past the
# deadline; the test asserts under half the former.
# usage: test_run_hetero.sh NEBULA DATA_DIR
set -euo pipefail
nebula=$1
data=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/integration/run/lib.sh
. "$here/lib.sh"
command -v jq >/dev/null || { echo "SKIP: jq not found"; exit 77; }
tmp=$(mktemp -d /tmp/nb_run_hetero.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

slowdown=8
write_job "$tmp/job.json" hetero \
  '[{"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
    {"id": "dc-b", "slowdown": '"$slowdown"', "data": {"tier": "quick", "languages": ["en", "ru"]}}]' \
  '{"layers": 2, "width": 128, "heads": 4, "context": 64}' 300 \
  '{"mode": "outer", "roundSeconds": 0.6}' \
  '{"density": {"initial": 0.05, "min": 0.01, "max": 0.1}, "values": "int8"}' \
  '{"rateMbit": 50}'

"$nebula" run "$tmp/job.json" --out "$tmp/run" --data-dir "$data" --loopback >"$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log"; fail "nebula run failed"; }
grep -v '^\[dc-.\] \(round\|eval\|sched\)' "$tmp/run.log" || true
ha=$(jq -r .global_xxh3 "$tmp/run/dc-a/summary.json")
hb=$(jq -r .global_xxh3 "$tmp/run/dc-b/summary.json")
[ -n "$ha" ] && [ "$ha" = "$hb" ] || fail "theta_global differs: $ha vs $hb"
ra="$tmp/run/dc-a/rounds.tsv"
rb="$tmp/run/dc-b/rounds.tsv"
sa=$(tsv_mean "$ra" steps)
sb=$(tsv_mean "$rb" steps)
ca=$(tsv_mean "$ra" compute_s)
xa=$(tsv_mean "$ra" exchange_s)
echo "steps per round: dc-a $sa, dc-b (slowed) $sb; dc-a compute $ca s, exchange wait $xa s per round"
gt "$sa" "$sb" 2 || fail "the slowed cluster did not do clearly fewer steps ($sb vs $sa)"
lockstep=$(awk -v c="$ca" -v f="$slowdown" 'BEGIN { printf "%.6g", (f - 1) * c }')
echo "a lockstep round would make dc-a wait about $lockstep s; it waited $xa s"
gt "$lockstep" "$xa" 2 ||
  fail "the fast cluster waited on the slow one (exchange $xa s, lockstep would be $lockstep s)"
# per round: own samples differ, and both sides weight by the same total = the sum of both
paste "$ra" "$rb" | awk -F'\t' '
  NR == 1 { for (i = 1; i <= NF / 2; i++) { if ($i == "samples") s = i; if ($i == "samples_all") t = i }
            h = NF / 2; next }
  { if ($s == $(s + h)) { print "round " $1 ": equal samples " $s; bad = 1 }
    if ($t != $s + $(s + h) || $(t + h) != $t) { print "round " $1 ": samples_all " $t "/" $(t + h) " != " $s " + " $(s + h); bad = 1 } }
  END { exit bad }' || fail "contributions are not weighted by the samples processed"
echo "PASS"
