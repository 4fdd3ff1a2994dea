#!/usr/bin/env bash
# NB_LOG_FORMAT through the real binary: `nebula env` lists it; a one-cluster `nebula worker`
# (tiny model, 2 rounds) with NB_LOG_FORMAT=json and NB_DEBUG=INFO writes stderr lines that
# each parse as one JSON object with ts (RFC 3339 UTC, milliseconds), level, host, pid, file,
# line and msg, the worker's with its cluster and rank, and trains as it does in text; a value
# that is neither text nor json stops the command before anything else, naming the variable.
# Args: NEBULA DATA_DIR.
set -u
nebula=${1:?usage: log_json.sh NEBULA DATA_DIR}
data=${2:?usage: log_json.sh NEBULA DATA_DIR}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nb_logjson.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

row=$("$nebula" env NB_LOG_FORMAT) || bad "nebula env NB_LOG_FORMAT failed"
printf '%s\n' "$row" | grep -Eq '^NB_LOG_FORMAT +text +default .*json' || bad "env row: $row"

err=$(NB_LOG_FORMAT=xml "$nebula" env 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || bad "NB_LOG_FORMAT=xml: exit $rc"
[ "$err" = "nebula: NB_LOG_FORMAT=xml: expected text or json" ] ||
  bad "NB_LOG_FORMAT=xml: '$err'"

cat >"$tmp/job.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "logjson-1dc"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"everyRounds": 1, "batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4}}}
JOB
run() { # NAME FORMAT
  NB_LOG_FORMAT=$2 NB_DEBUG=INFO "$nebula" worker --job "$tmp/job.json" --cluster dc-a \
    --out "$tmp/$1" --data-dir "$data" --insecure >"$tmp/$1.out" 2>"$tmp/$1.err"
}
run json json || bad "worker with NB_LOG_FORMAT=json: exit $?: $(tail -3 "$tmp/json.err")"
run text text || bad "worker with NB_LOG_FORMAT=text: exit $?: $(tail -3 "$tmp/text.err")"
grep -q 'dc-a done: 2 rounds' "$tmp/json.out" || bad "json: the worker did not finish its rounds"

python3 - "$tmp/json.err" "$tmp/text.err" <<'PY' || bad "stderr of the json run (above)"
import json, re, sys
ok = True
lines = open(sys.argv[1], "rb").read().split(b"\n")
if lines[-1] != b"":
    print("FAIL: the last line has no newline"); ok = False
lines = lines[:-1]
if len(lines) < 10:
    print(f"FAIL: only {len(lines)} lines at NB_DEBUG=INFO"); ok = False
ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
with_ident = 0
for i, raw in enumerate(lines):
    try:
        o = json.loads(raw.decode("utf-8"))
    except Exception as e:
        print(f"FAIL: line {i + 1} is not JSON ({e}): {raw[:200]!r}"); ok = False; continue
    if not isinstance(o, dict):
        print(f"FAIL: line {i + 1} is not an object"); ok = False; continue
    for k, t in (("ts", str), ("level", str), ("host", str), ("pid", int), ("file", str),
                 ("line", int), ("msg", str)):
        if not isinstance(o.get(k), t):
            print(f"FAIL: line {i + 1}: {k} missing or not {t.__name__}: {o}"); ok = False
    if not ts.match(o.get("ts", "")):
        print(f"FAIL: line {i + 1}: ts {o.get('ts')!r}"); ok = False
    if o.get("level") not in ("WARN", "INFO", "TRACE"):
        print(f"FAIL: line {i + 1}: level {o.get('level')!r}"); ok = False
    if o.get("level") != "WARN" and not isinstance(o.get("sub"), str):
        print(f"FAIL: line {i + 1}: no sub"); ok = False
    if o.get("cluster") == "dc-a" and o.get("rank") == 0:
        with_ident += 1
if with_ident == 0:
    print("FAIL: no line carries cluster dc-a, rank 0"); ok = False
# the same run in text: the same number of lines, none of them JSON
text = open(sys.argv[2]).read().splitlines()
if len(text) != len(lines):
    print(f"FAIL: {len(text)} text lines vs {len(lines)} json lines"); ok = False
if any(l.startswith("{") for l in text):
    print("FAIL: a text line looks like JSON"); ok = False
print(f"{len(lines)} JSON lines, {with_ident} with the worker's identity")
sys.exit(0 if ok else 1)
PY
[ "$fail" = 0 ] && echo "log_json: ok"
exit $fail
