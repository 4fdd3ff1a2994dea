#!/usr/bin/env bash
# NEBULA_METRICS_LISTEN through the real binary: `nebula env` lists it; a one-cluster
# `nebula worker` (tiny model, 2 rounds) with 127.0.0.1:0 prints where its metrics are and ends
# as it does without; one with an address that cannot serve stops, naming the variable and the
# problem; one whose port is taken stops too. The descriptor's spec.clusters[0].metrics.listen
# does the same (its run ends with the same theta), a taken port in it stops the worker naming
# the key, and the variable overrides the key. Then a live leader (its metrics from the key):
# cluster dc-a of a two-cluster job whose dc-b agrees at the start, then sends nothing (its
# rounds are 100000 steps long) and is killed: dc-a skips both rounds and waits in its final
# check (NB_FINAL_WAIT_S), serving its metrics meanwhile: a scrape shows round 2 of 2, both
# rounds skipped, none applied, the peer not alive; and when Debian's prometheus is installed it
# scrapes that leader every second and the same values come back through its query API.
# Args: NEBULA DATA_DIR.
set -u
nebula=${1:?usage: worker_metrics.sh NEBULA DATA_DIR}
data=${2:?usage: worker_metrics.sh NEBULA DATA_DIR}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nb_wkm.XXXXXX")
holder=
worker=
peer=
prom=
cleanup() {
  for p in $holder $worker $peer $prom; do
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
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

# the descriptor's key (spec.clusters[i].metrics.listen) instead of the variable
sed 's|"languages": \["en"\]}}\]|"languages": ["en"]}, "metrics": {"listen": "LISTEN"}}]|' \
  "$tmp/job.json" >"$tmp/job_key.tmpl"
grep -q '"metrics": {"listen": "LISTEN"}' "$tmp/job_key.tmpl" || bad "no metrics key in the job"
sed 's|LISTEN|127.0.0.1:0|' "$tmp/job_key.tmpl" >"$tmp/job_key.json"
runjob() { # JOB OUT_NAME [env assignments...]
  local job=$1 name=$2
  shift 2
  env "$@" "$nebula" worker --job "$job" --cluster dc-a --out "$tmp/$name" \
    --data-dir "$data" --insecure >"$tmp/$name.log" 2>&1
}
runjob "$tmp/job_key.json" key
rc=$?
[ "$rc" -eq 0 ] || bad "worker with the metrics key: exit $rc: $(tail -3 "$tmp/key.log")"
grep -Eq '^nebula worker: dc-a metrics at http://127\.0\.0\.1:[1-9][0-9]*/metrics$' "$tmp/key.log" ||
  bad "no metrics line from the key: $(head -5 "$tmp/key.log")"
grep -q 'dc-a done: 2 rounds' "$tmp/key.log" || bad "worker with the key did not finish its rounds"
c=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_xxh3"])' \
  "$tmp/key/summary.json" 2>/dev/null)
[ -n "$c" ] && [ "$c" = "$a" ] || bad "the metrics key changed the run: theta $a vs $c"

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
  # the key on the taken port: the worker stops naming the key; the variable overrides the key
  sed "s|LISTEN|127.0.0.1:$port|" "$tmp/job_key.tmpl" >"$tmp/job_busy.json"
  runjob "$tmp/job_busy.json" busykey
  rc=$?
  [ "$rc" -ne 0 ] || bad "worker with the key on a taken port: exit 0"
  grep -q "\$.spec.clusters\[0\].metrics.listen=127.0.0.1:$port: .*cannot listen on 127.0.0.1:$port" \
    "$tmp/busykey.log" || bad "taken port in the key: $(tail -3 "$tmp/busykey.log")"
  runjob "$tmp/job_busy.json" override NEBULA_METRICS_LISTEN=127.0.0.1:0
  rc=$?
  [ "$rc" -eq 0 ] || bad "NEBULA_METRICS_LISTEN over the key: exit $rc: $(tail -3 "$tmp/override.log")"
  oport=$(sed -n 's|^nebula worker: dc-a metrics at http://127\.0\.0\.1:\([0-9]*\)/metrics$|\1|p' \
    "$tmp/override.log")
  [ -n "$oport" ] && [ "$oport" != "$port" ] ||
    bad "NEBULA_METRICS_LISTEN did not override the key: '$oport' (key's $port)"
fi

kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
holder=

# GET URL; prints the body, exit 1 when it cannot
http_get() {
  python3 -c '
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except Exception as e:
    sys.exit(1)' "$1"
}
# the value of the exposition line `SERIES VALUE`
sample() { printf '%s\n' "$1" | awk -v s="$2" '$1 == s {print $2}'; }

cat > "$tmp/job2.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "metrics-2dc"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]},
                "metrics": {"listen": "127.0.0.1:0"}},
               {"id": "dc-b", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"everyRounds": 1, "batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4, "peerTimeoutSeconds": 1}}}
JOB
# dc-b: the same job but rounds of 100000 steps, so that after the start it sends nothing
sed 's|"maxSteps": 8|"maxSteps": 100000|; s|"innerSteps": 4|"innerSteps": 100000|' \
  "$tmp/job2.json" >"$tmp/job2b.json"
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
pa=$(free_port)
pb=$(free_port)
"$nebula" worker --job "$tmp/job2b.json" --cluster dc-b --out "$tmp/peer" --data-dir "$data" \
  --insecure --listen "127.0.0.1:$pb" --peer "dc-a=127.0.0.1:$pa" >"$tmp/peer.log" 2>&1 &
peer=$!
NB_ROUND_DEADLINE_S=1 NB_FINAL_WAIT_S=600 \
  "$nebula" worker --job "$tmp/job2.json" --cluster dc-a --out "$tmp/live" --data-dir "$data" \
  --insecure --listen "127.0.0.1:$pa" --peer "dc-b=127.0.0.1:$pb" >"$tmp/live.log" 2>&1 &
worker=$!
mport=
for _ in $(seq 1200); do
  mport=$(sed -n 's|^nebula worker: dc-a metrics at http://127\.0\.0\.1:\([0-9]*\)/metrics$|\1|p' \
    "$tmp/live.log")
  [ -n "$mport" ] && break
  kill -0 "$worker" 2>/dev/null || break
  sleep 0.1
done
[ -n "$mport" ] || bad "the live leader announced no metrics: $(tail -3 "$tmp/live.log")"
# once the start is agreed (dc-a's banner follows it), dc-b goes for good
for _ in $(seq 1200); do
  grep -q '^nebula worker: job metrics-2dc, cluster dc-a' "$tmp/live.log" && break
  kill -0 "$worker" 2>/dev/null || break
  sleep 0.1
done
grep -q '^nebula worker: job metrics-2dc, cluster dc-a' "$tmp/live.log" ||
  bad "the live leader did not start: $(tail -3 "$tmp/live.log")"
kill -9 "$peer" 2>/dev/null && wait "$peer" 2>/dev/null
peer=
want="nebula_leader_round=2 nebula_leader_rounds=2 nebula_leader_step=8 nebula_leader_max_steps=8
nebula_leader_rounds_skipped_total=2 nebula_leader_rounds_applied_total=0 nebula_leader_peers=1
nebula_leader_peers_alive=0 nebula_leader_eval_round=1 nebula_leader_wan_received_bytes_total=0"
got=
if [ -n "$mport" ]; then
  # until the rounds are over (the leader then waits in its final check): a generous deadline
  for _ in $(seq 600); do
    text=$(http_get "http://127.0.0.1:$mport/metrics") || text=
    got=
    for kv in $want; do got="$got ${kv%%=*}=$(sample "$text" "${kv%%=*}")"; done
    [ "$(echo $got)" = "$(echo $want)" ] && break
    kill -0 "$worker" 2>/dev/null || break
    sleep 0.1
  done
  [ "$(echo $got)" = "$(echo $want)" ] || bad "live leader: got$got, want $(echo $want)"
  printf '%s\n' "$text" | grep -q '^nebula_leader_info{job_name="metrics-2dc",cluster="dc-a"} 1$' ||
    bad "live leader: no info line"
  bpb=$(sample "$text" nebula_leader_eval_bpb)
  python3 -c 'import math,sys; v=float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v > 0 else 1)' \
    "${bpb:-x}" 2>/dev/null || bad "live leader: eval bpb '$bpb'"
fi

# Debian's prometheus scraping the live leader (skipped without it)
pbin=${NB_PROMETHEUS:-$(command -v prometheus || true)}
if [ -n "$mport" ] && [ -n "$pbin" ] && [ -x "$pbin" ]; then
  pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$tmp/prom"
  cat > "$tmp/prom/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: nebula-leader
    static_configs:
      - targets: ['127.0.0.1:$mport']
YML
  "$pbin" --config.file="$tmp/prom/prometheus.yml" --storage.tsdb.path="$tmp/prom/tsdb" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$tmp/prom/log" 2>&1 &
  prom=$!
  q() { # QUERY -> the first sample's value, or nothing
    http_get "http://127.0.0.1:$pport/api/v1/query?query=$(python3 -c 'import sys,urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1")" |
      python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null
  }
  pgot=
  for _ in $(seq 360); do
    pgot="$(q 'up{job="nebula-leader"}') $(q 'nebula_leader_round{job="nebula-leader"}') $(q 'nebula_leader_rounds_skipped_total') $(q 'nebula_leader_info{cluster="dc-a",job_name="metrics-2dc"}')"
    [ "$pgot" = "1 2 2 1" ] && break
    kill -0 "$prom" 2>/dev/null || break
    sleep 0.25
  done
  [ "$pgot" = "1 2 2 1" ] || bad "prometheus read '$pgot' (want up 1, round 2, skipped 2, info 1): $(tail -5 "$tmp/prom/log")"
  kill "$prom" 2>/dev/null
  wait "$prom" 2>/dev/null
  prom=
  [ "$fail" -eq 0 ] && echo "prometheus scraped the live leader"
else
  echo "no prometheus binary (apt install prometheus, or NB_PROMETHEUS): its case skipped"
fi
kill "$worker" 2>/dev/null
wait "$worker" 2>/dev/null
worker=

[ "$fail" -eq 0 ] && echo "worker_metrics: ok"
exit "$fail"
