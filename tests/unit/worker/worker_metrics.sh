#!/usr/bin/env bash
# NEBULA_METRICS_LISTEN through the real binary: `nebula env` lists it; a one-cluster
# `nebula worker` (tiny model, 2 rounds) with 127.0.0.1:0 prints where its metrics are and ends
# as it does without; one with an address that cannot serve stops, naming the variable and the
# problem; one whose port is taken stops too. Args: NEBULA DATA_DIR.
set -u
nebula=${1:?usage: worker_metrics.sh NEBULA DATA_DIR}
data=${2:?usage: worker_metrics.sh NEBULA DATA_DIR}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nb_wkm.XXXXXX")
holder=
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
  [ -n "${NB_KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

row=$("$nebula" env NEBULA_METRICS_LISTEN) || bad "nebula env NEBULA_METRICS_LISTEN failed"
printf '%s\n' "$row" | grep -Eq '^NEBULA_METRICS_LISTEN +- +default .*Prometheus' ||
  bad "env row: $row"
row=$(NEBULA_METRICS_LISTEN=127.0.0.1:9464 "$nebula" env NEBULA_METRICS_LISTEN)
printf '%s\n' "$row" | grep -Eq '^NEBULA_METRICS_LISTEN +127.0.0.1:9464 +environment ' ||
  bad "env row from the environment: $row"

cat > "$tmp/job.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "metrics-1dc"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"everyRounds": 1, "batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4}}}
JOB

run() { # OUT_NAME [env assignments...]
  local name=$1
  shift
  env "$@" "$nebula" worker --job "$tmp/job.json" --cluster dc-a --out "$tmp/$name" \
    --data-dir "$data" --insecure >"$tmp/$name.log" 2>&1
}

run plain
rc=$?
[ "$rc" -eq 0 ] || bad "worker without metrics: exit $rc: $(tail -3 "$tmp/plain.log")"
grep -q 'metrics at' "$tmp/plain.log" && bad "metrics announced without NEBULA_METRICS_LISTEN"

run on NEBULA_METRICS_LISTEN=127.0.0.1:0
rc=$?
[ "$rc" -eq 0 ] || bad "worker with metrics: exit $rc: $(tail -3 "$tmp/on.log")"
grep -Eq '^nebula worker: dc-a metrics at http://127\.0\.0\.1:[1-9][0-9]*/metrics$' "$tmp/on.log" ||
  bad "no metrics line: $(head -5 "$tmp/on.log")"
grep -q 'dc-a done: 2 rounds' "$tmp/on.log" || bad "worker with metrics did not finish its rounds"
a=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_xxh3"])' \
  "$tmp/plain/summary.json" 2>/dev/null)
b=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_xxh3"])' \
  "$tmp/on/summary.json" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || bad "metrics changed the run: theta $a vs $b"

run bad NEBULA_METRICS_LISTEN=localhost
rc=$?
[ "$rc" -ne 0 ] || bad "worker with NEBULA_METRICS_LISTEN=localhost: exit 0"
grep -q 'NEBULA_METRICS_LISTEN=localhost: metrics: listen .localhost.: expected HOST:PORT' \
  "$tmp/bad.log" || bad "bad address: $(tail -3 "$tmp/bad.log")"

# a port already taken (held by a listener of the test's own)
python3 -c '
import os, socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)' "$tmp/port" &
holder=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port" 2>/dev/null)
[ -n "$port" ] || bad "the port holder did not start"
if [ -n "$port" ]; then
  run busy NEBULA_METRICS_LISTEN=127.0.0.1:$port
  rc=$?
  [ "$rc" -ne 0 ] || bad "worker on a taken port: exit 0"
  grep -q "cannot listen on 127.0.0.1:$port" "$tmp/busy.log" ||
    bad "taken port: $(tail -3 "$tmp/busy.log")"
fi

[ "$fail" -eq 0 ] && echo "worker_metrics: ok"
exit "$fail"
