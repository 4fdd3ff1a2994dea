#!/usr/bin/env bash
# The start of `nebula worker` is the public session's (api/driven.h), through the real binary on
# loopback: two clusters whose models differ (width 32 and 48) both stop at the start, each
# naming the other cluster and both sizes, and neither trains a round; a cluster whose peer never
# comes stops after NB_START_TIMEOUT_S naming the peer (serving its metrics while it waits); two
# clusters of one job agree and end with one theta (summary.json). Args: NEBULA DATA_DIR.
set -u
nebula=${1:?usage: worker_start.sh NEBULA DATA_DIR}
data=${2:?usage: worker_start.sh NEBULA DATA_DIR}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nb_wks.XXXXXX")
pids=
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  [ -n "${NB_KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
job() { # FILE WIDTH
  cat >"$1" <<JOB
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "start-2dc"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]}},
               {"id": "dc-b", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": $2, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8},
  "sync": {"mode": "outer", "innerSteps": 4}}}
JOB
}
pair() { # NAME JOB_A JOB_B [env assignments...]: both clusters, waits for both
  local name=$1 ja=$2 jb=$3
  shift 3
  local pa pb
  pa=$(free_port)
  pb=$(free_port)
  env "$@" "$nebula" worker --job "$ja" --cluster dc-a --out "$tmp/$name-a" --data-dir "$data" \
    --insecure --listen "127.0.0.1:$pa" --peer "dc-b=127.0.0.1:$pb" >"$tmp/$name-a.log" 2>&1 &
  local a=$!
  env "$@" "$nebula" worker --job "$jb" --cluster dc-b --out "$tmp/$name-b" --data-dir "$data" \
    --insecure --listen "127.0.0.1:$pb" --peer "dc-a=127.0.0.1:$pa" >"$tmp/$name-b.log" 2>&1 &
  local b=$!
  pids="$a $b"
  wait "$a"
  rc_a=$?
  wait "$b"
  rc_b=$?
  pids=
}
job "$tmp/w32.json" 32
job "$tmp/w48.json" 48

pair mismatch "$tmp/w32.json" "$tmp/w48.json"
[ "$rc_a" -ne 0 ] && [ "$rc_b" -ne 0 ] || bad "different models: exits $rc_a and $rc_b"
for side in a b; do
  other=$([ $side = a ] && echo dc-b || echo dc-a)
  grep -Eq "starting the session: .*synced parameters here, [0-9]+ at cluster $other" \
    "$tmp/mismatch-$side.log" || bad "dc-$side: no size mismatch named: $(tail -2 "$tmp/mismatch-$side.log")"
  grep -q '^round 1/' "$tmp/mismatch-$side.log" && bad "dc-$side trained a round with another model"
done
na=$(sed -n 's/.*model has \([0-9]*\) synced parameters here, \([0-9]*\) at.*/\1 \2/p' "$tmp/mismatch-a.log")
nb=$(sed -n 's/.*model has \([0-9]*\) synced parameters here, \([0-9]*\) at.*/\2 \1/p' "$tmp/mismatch-b.log")
[ -n "$na" ] && [ "$na" = "$nb" ] || bad "the two sides name other sizes: '$na' vs '$nb'"

dead=$(free_port)
NB_START_TIMEOUT_S=2 NEBULA_METRICS_LISTEN=127.0.0.1:0 "$nebula" worker --job "$tmp/w32.json" \
  --cluster dc-a --out "$tmp/alone" --data-dir "$data" --insecure \
  --peer "dc-b=127.0.0.1:$dead" >"$tmp/alone.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] || bad "a worker whose peer never comes: exit 0"
grep -q "peer dc-b has not answered in 2 s" "$tmp/alone.log" ||
  bad "no start timeout named: $(tail -2 "$tmp/alone.log")"
# its metrics were served while it waited at the start
grep -Eq '^nebula worker: dc-a metrics at http://127\.0\.0\.1:[1-9][0-9]*/metrics$' \
  "$tmp/alone.log" || bad "no metrics while waiting at the start: $(head -3 "$tmp/alone.log")"

pair agree "$tmp/w32.json" "$tmp/w32.json"
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] || bad "one job: exits $rc_a and $rc_b: $(tail -2 "$tmp/agree-a.log")"
ha=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_xxh3"])' \
  "$tmp/agree-a/summary.json" 2>/dev/null)
hb=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_xxh3"])' \
  "$tmp/agree-b/summary.json" 2>/dev/null)
[ -n "$ha" ] && [ "$ha" = "$hb" ] || bad "one job, two thetas: '$ha' vs '$hb'"
grep -q "dc-a done: 2 rounds" "$tmp/agree-a.log" || bad "dc-a did not run its 2 rounds"
[ "$fail" -eq 0 ] && echo "worker_start: OK"
exit "$fail"
