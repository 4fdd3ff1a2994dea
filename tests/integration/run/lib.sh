# shellcheck shell=bash
# Helpers shared by the `nebula run` integration tests (sourced): a job writer, JSON and TSV
# readers, and the "nothing left behind" check. Not a test framework: each script asserts itself.

fail() {
  echo "FAIL: $*"
  exit 1
}

# write_job FILE NAME CLUSTERS_JSON MODEL_JSON STEPS SYNC_JSON COMPRESSION_JSON LINK_JSON
write_job() {
  cat >"$1" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "$2"},
 "spec": {"task": "pretrain",
  "clusters": $3,
  "model": $4,
  "training": {"seed": 5, "batchSize": 4, "maxSteps": $5,
               "eval": {"batches": 1},
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": $6,
  "compression": $7,
  "link": $8}}
JOB
}

# Mean of column NAME (by header) of a TSV file.
tsv_mean() {
  awk -F'\t' -v col="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    { s += $c; n++ } END { if (!c || !n) exit 1; printf "%.6g\n", s / n }' "$1"
}

# True (0) when a > b x factor, numerically.
gt() { awk -v a="$1" -v b="$2" -v f="${3:-1}" 'BEGIN { exit !(a > b * f) }'; }

# Fails if anything of the run with prefix $1 (namespaces, delay line, state) or any worker whose
# command line names $2 is still there.
assert_nothing_left() {
  local prefix=$1 tag=$2 p st
  ip netns list | awk '{print $1}' | grep -q "^$prefix-" && fail "namespaces of $prefix left behind"
  for p in $(pgrep -f -- "nb-delayline .*--ns-a $prefix-a" || true); do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo gone)
    [ "$st" = Z ] || [ "$st" = gone ] || fail "delay line $p of $prefix still running"
  done
  [ -e "/run/nebula-wan/$prefix" ] && fail "state of $prefix left behind"
  pgrep -f -- "worker --job .*$tag" >/dev/null && fail "worker processes left behind"
  return 0
}
