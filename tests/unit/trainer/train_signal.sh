#!/usr/bin/env bash
# SIGTERM during `nebula train`: the step under way finishes, the trainer writes a checkpoint,
# summary.json says "interrupted" (signal, the checkpoint, no final model) and the exit status
# is 143 (128 + SIGTERM); --resume then continues from that checkpoint to the end.
# usage: train_signal.sh NEBULA DATA_DIR
set -u
nebula=${1:?usage: train_signal.sh NEBULA DATA_DIR}
data=${2:?usage: train_signal.sh NEBULA DATA_DIR}
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/err" ] && cat "$tmp/err"; exit 1; }
cat >"$tmp/job.json" <<JSON
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "sig"},
 "spec": {"clusters": [{"id": "dc-a", "data": {"dir": "$data", "languages": ["en", "ru"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"batchSize": 2, "maxSteps": 100000000, "eval": {"everyRounds": 4, "batches": 1}},
  "sync": {"innerSteps": 5}, "checkpoint": {"everyRounds": 1000000, "keep": 2}}}
JSON
"$nebula" train "$tmp/job.json" --out "$tmp/out" >"$tmp/log" 2>"$tmp/err" &
pid=$!
# the first progress line: training is under way (a bound on waiting, not on the verdict)
for _ in $(seq 600); do
  grep -q '^step ' "$tmp/log" && break
  kill -0 "$pid" 2>/dev/null || fail "train ended before its first step: $(cat "$tmp/log")"
  sleep 0.1
done
grep -q '^step ' "$tmp/log" || fail "no step line after 60 s"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq 143 ] || fail "exit status $rc after SIGTERM, expected 143"
grep -q '^interrupted by SIGTERM after step ' "$tmp/log" || fail "no closing line: $(tail -2 "$tmp/log")"
[ -e "$tmp/out/final.safetensors" ] && fail "an interrupted run wrote final.safetensors"
step=$(python3 - "$tmp/out" <<'PY'
import json, os, sys
out = sys.argv[1]
s = json.load(open(os.path.join(out, "summary.json")))
assert s["interrupted"] is True and s["signal"] == "SIGTERM", s
assert s["final_model"] is None, s
latest = open(os.path.join(out, "checkpoints", "LATEST")).read().strip()
assert latest == "step-%d" % s["steps"], (latest, s["steps"])
assert s["checkpoint"].endswith("/" + latest), s["checkpoint"]
for f in ("model.safetensors", "optim.safetensors"):
    assert os.path.getsize(os.path.join(out, "checkpoints", latest, f)) > 0, f
# the optimizer state as docs/model.md describes it: flat adam.m and adam.v over the trainable
# buffer (shape [trainable_params]), and the metadata a resume reads
import struct
with open(os.path.join(out, "checkpoints", latest, "optim.safetensors"), "rb") as f:
    hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
meta = hdr.pop("__metadata__")
assert set(hdr) == {"adam.m", "adam.v"}, sorted(hdr)
assert hdr["adam.m"]["shape"] == [s["trainable_params"]] == hdr["adam.v"]["shape"], hdr
assert {"step", "adam_steps", "samples", "tokens", "seed", "data_rank", "lora"} <= set(meta), meta
assert int(meta["step"]) == s["steps"], meta
rows = [l.split("\t") for l in open(os.path.join(out, "rounds.tsv")).read().splitlines()[1:]]
assert sum(int(r[1]) for r in rows) == s["steps"], (len(rows), s["steps"])  # partial round too
print(s["steps"])
PY
) || fail "summary or checkpoint of the interrupted run"
# --resume continues from the checkpoint the signal left
"$nebula" train "$tmp/job.json" --out "$tmp/out" --resume --steps $((step + 5)) >"$tmp/log" 2>"$tmp/err" ||
  fail "--resume after the interruption failed"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["interrupted"] is False and s["steps"] == int(sys.argv[2]) and s["steps_this_run"] == 5, s
' "$tmp/out/summary.json" $((step + 5)) || fail "resumed summary"
echo "train: SIGTERM after step $step left a checkpoint and an interrupted summary; resumed"
