# Shared helpers of the fault tests: a small two-cluster job with wall-time rounds, a PKI and a
# job secret, and readers of summary.json and rounds.tsv. Sourced by the test scripts; expects
# $nebula to be set. The model is sized so that a round's 50-step cap takes longer than its time
# budget even on a fast idle machine: a round lasts its budget, so the run spans the outage.

# write_job FILE ROUNDS ROUND_SECONDS [SYNC_EXTRA] (SYNC_EXTRA: more sync fields, e.g.
# ', "overlap": true')
write_job() {
  local rounds=$2 secs=$3 extra=${4:-}
  cat >"$1" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "faults-2dc"},
 "spec": {"task": "pretrain",
  "clusters": [
   {"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
   {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 2, "width": 64, "heads": 2, "context": 64},
  "training": {"seed": 7, "batchSize": 16, "maxSteps": $((rounds * 50)),
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": {"mode": "outer", "roundSeconds": $secs, "peerTimeoutSeconds": 2$extra},
  "compression": {"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8",
                  "adaptive": false},
  "link": {"rateMbit": 50}}}
JOB
}

# make_pki DIR SAN_A SAN_B: a CA, dc-a and dc-b certificates, and DIR/job.secret
make_pki() {
  "$nebula" certs init --dir "$1" >/dev/null
  "$nebula" certs issue --dir "$1" --cluster dc-a --san "$2" >/dev/null
  "$nebula" certs issue --dir "$1" --cluster dc-b --san "$3" >/dev/null
  head -c 32 /dev/urandom >"$1/job.secret"
  chmod 600 "$1/job.secret"
}

# json_field FILE KEY: a top-level scalar of a summary.json
json_field() {
  /usr/bin/python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(str(v).lower() if isinstance(v,bool) else v)' "$1" "$2"
}

# tsv_count FILE COLUMN VALUE: rows of a rounds.tsv whose COLUMN equals VALUE
tsv_count() {
  awk -F'\t' -v col="$2" -v val="$3" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    c && $c == val { n++ } END { print n + 0 }' "$1"
}

# fail MESSAGE: prints it and the end of every log in $tmp, and exits 1
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "== $f"; tail -n 25 "$f"; done
  exit 1
}

# same_hash DIR_A DIR_B: both clusters' summary.json name the same final theta_global
same_hash() {
  local ha hb
  ha=$(json_field "$1/summary.json" global_xxh3)
  hb=$(json_field "$2/summary.json" global_xxh3)
  echo "theta_global: dc-a $ha, dc-b $hb"
  [ "$ha" = "$hb" ] || fail "theta_global differs: $ha vs $hb"
}
