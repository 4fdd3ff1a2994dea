#!/usr/bin/env bash
# TensorBoard event files of real runs, read back with TensorBoard's own EventAccumulator: a
# two-cluster `nebula worker` job on loopback (tiny model, 2 rounds, an evaluation each round)
# writes OUT/tb/events.out.tfevents.* per cluster, whose scalars hold the tags of
# docs/operations.md at steps 4 and 8 with loss and WAN bytes equal to rounds.tsv's and the last
# held-out bpb equal to summary.json's; `nebula train --out` writes its loss and evaluation the
# same way; NB_TENSORBOARD=0 writes none. Exits 77 (skipped) when the tensorboard Python package
# cannot be imported (scripts/setup.sh installs it), after the checks that need no TensorBoard.
# Args: NEBULA DATA_DIR.
set -u
nebula=${1:?usage: worker_tensorboard.sh NEBULA DATA_DIR}
data=${2:?usage: worker_tensorboard.sh NEBULA DATA_DIR}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nb_wktb.XXXXXX")
pa=
pb=
cleanup() {
  for p in $pa $pb; do
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  [ -n "${NB_KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/job.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "tb-2dc"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]}},
               {"id": "dc-b", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"everyRounds": 1, "batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4}}}
JOB

# two free loopback ports, one exchange server per cluster
read -r port_a port_b < <(python3 -c '
import socket
a = socket.socket(); a.bind(("127.0.0.1", 0)); b = socket.socket(); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
two() { # OUT [env assignments...]: both clusters of the job, dc-a and dc-b
  local out=$1
  shift
  env "$@" "$nebula" worker --job "$tmp/job.json" --cluster dc-a --out "$out/dc-a" \
    --data-dir "$data" --insecure --listen "127.0.0.1:$port_a" --peer "dc-b=127.0.0.1:$port_b" \
    >"$out.a.log" 2>&1 &
  pa=$!
  env "$@" "$nebula" worker --job "$tmp/job.json" --cluster dc-b --out "$out/dc-b" \
    --data-dir "$data" --insecure --listen "127.0.0.1:$port_b" --peer "dc-a=127.0.0.1:$port_a" \
    >"$out.b.log" 2>&1 &
  pb=$!
  wait "$pa" || bad "dc-a exited $?: $(tail -3 "$out.a.log")"
  wait "$pb" || bad "dc-b exited $?: $(tail -3 "$out.b.log")"
  pa=
  pb=
}

two "$tmp/run"
for c in dc-a dc-b; do
  n=$(ls "$tmp/run/$c/tb" 2>/dev/null | grep -c '^events\.out\.tfevents\.[0-9]*\..*')
  [ "$n" = 1 ] || bad "$c: $n event files in tb/: $(ls "$tmp/run/$c" "$tmp/run/$c/tb" 2>&1)"
done
two "$tmp/off" NB_TENSORBOARD=0
[ -e "$tmp/off/dc-a/tb" ] && bad "NB_TENSORBOARD=0: dc-a wrote $(ls "$tmp/off/dc-a/tb")"
[ -s "$tmp/off/dc-a/summary.json" ] || bad "NB_TENSORBOARD=0: no summary"

# `nebula train` (one cluster, this process)
cat >"$tmp/train.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "tb-train"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"everyRounds": 1, "batches": 1}},
  "sync": {"mode": "outer", "innerSteps": 4}}}
JOB
"$nebula" train "$tmp/train.json" --out "$tmp/train" --data-dir "$data" >"$tmp/train.log" 2>&1 ||
  bad "nebula train exited $?: $(tail -3 "$tmp/train.log")"
ls "$tmp/train/tb" 2>/dev/null | grep -q '^events\.out\.tfevents\.' ||
  bad "nebula train wrote no event file: $(ls "$tmp/train" 2>&1)"

# summary.json's evals (the evaluation after round 1; the final one is final_eval_*) carry each
# language's bpb beside the mean (the report's curves per language): one language here, so the
# mean is its value
python3 - "$tmp/run" <<'PY' || bad "summary.json evals lack the per-language bpb (above)"
import json, math, os, sys
ok = True
for c in ("dc-a", "dc-b"):
    ev = json.load(open(os.path.join(sys.argv[1], c, "summary.json")))["evals"]
    if [e["round"] for e in ev] != [1] or any(sorted(e.get("bpb", {})) != ["en"] or
                                                not math.isfinite(e["bpb"]["en"]) or
                                                e["bpb"]["en"] != e["mean_bpb"] for e in ev):
        print(f"FAIL: {c}: evals {ev}")
        ok = False
sys.exit(0 if ok else 1)
PY

if ! python3 -c 'import tensorboard.backend.event_processing.event_accumulator' 2>/dev/null; then
  [ "$fail" = 0 ] || exit 1
  echo "SKIP: the tensorboard Python package is not importable (scripts/setup.sh installs it)"
  exit 77
fi

# Each event file through EventAccumulator: tags, steps, and values against rounds.tsv (loss
# as printed with 6 decimals, bytes exactly) and summary.json (the final held-out bpb).
python3 - "$tmp" <<'PY' || bad "event files do not match the runs (above)"
import csv, glob, json, math, os, sys, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing import event_accumulator as ea

tmp = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("FAIL:", what)
        ok = False

def load(folder):
    files = glob.glob(os.path.join(folder, "tb", "events.out.tfevents.*"))
    check(len(files) == 1, f"{folder}: event files {files}")
    acc = ea.EventAccumulator(files[0], size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return acc, {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}

def rows(folder):
    with open(os.path.join(folder, "rounds.tsv")) as f:
        return list(csv.DictReader(f, delimiter="\t"))

def close(a, b, rel=1e-6, abs_=1e-6):
    return math.isfinite(a) and abs(a - b) <= max(abs_, rel * abs(b))

for c in ("dc-a", "dc-b"):
    d = os.path.join(tmp, "run", c)
    acc, s = load(d)
    want = {"loss", "density", "wan/bytes_sent", "wan/msg_bytes", "wan/goodput_bytes_per_s",
            "wan/rtt_s", "time/compute_s", "time/exchange_s", "peers_alive", "eval/bpb/en",
            "eval/bpb_mean"}
    check(want <= set(s), f"{c}: tags {sorted(s)} lack {sorted(want - set(s))}")
    r = rows(d)
    summary = json.load(open(os.path.join(d, "summary.json")))
    check([st for st, _ in s.get("loss", [])] == [4, 8], f"{c}: loss steps {s.get('loss')}")
    for i, row in enumerate(r):
        check(close(s["loss"][i][1], float(row["loss"]), abs_=2e-6),
              f"{c}: round {i} loss {s['loss'][i][1]} vs rounds.tsv {row['loss']}")
        check(s["wan/bytes_sent"][i][1] == float(row["bytes_sent"]),
              f"{c}: round {i} bytes {s['wan/bytes_sent'][i][1]} vs {row['bytes_sent']}")
        check(s["wan/msg_bytes"][i][1] == float(row["msg_bytes"]), f"{c}: round {i} msg bytes")
        check(close(s["density"][i][1], float(row["density"])), f"{c}: round {i} density")
    check(all(v > 0 for _, v in s["wan/bytes_sent"]), f"{c}: no WAN bytes {s['wan/bytes_sent']}")
    check(all(v == 1 for _, v in s["peers_alive"]), f"{c}: peers alive {s['peers_alive']}")
    # an evaluation after round 1 and the final one at step 8, equal to summary.json's
    bpb = s["eval/bpb_mean"]
    check([st for st, _ in bpb] == [4, 8], f"{c}: eval steps {bpb}")
    check(close(bpb[-1][1], summary["final_eval_mean_bpb"]),
          f"{c}: bpb {bpb[-1][1]} vs summary {summary['final_eval_mean_bpb']}")
    check(close(s["eval/bpb/en"][-1][1], summary["final_eval_bpb"]["en"]), f"{c}: bpb/en")
    check(close(bpb[0][1], summary["evals"][0]["mean_bpb"]), f"{c}: bpb after round 1")
    check(close(s["eval/bpb/en"][0][1], summary["evals"][0]["bpb"]["en"]),
          f"{c}: bpb/en after round 1")
    print(f"{c}: {len(s)} tags, loss {[v for _, v in s['loss']]}, bytes "
          f"{[v for _, v in s['wan/bytes_sent']]}, bpb {[v for _, v in bpb]}")

d = os.path.join(tmp, "train")
acc, s = load(d)
check({"loss", "eval/bpb/en", "eval/bpb_mean"} <= set(s), f"train: tags {sorted(s)}")
r = rows(d)
check([st for st, _ in s.get("loss", [])] == [4, 8], f"train: loss steps {s.get('loss')}")
for i, row in enumerate(r):
    check(close(s["loss"][i][1], float(row["loss"]), abs_=2e-6),
          f"train: round {i} loss {s['loss'][i][1]} vs rounds.tsv {row['loss']}")
# the evaluations of curve.tsv (step 0, 4, 8); the last one is summary.json's
summary = json.load(open(os.path.join(d, "summary.json")))
bpb = s["eval/bpb_mean"]
check([st for st, _ in bpb] == [0, 4, 8], f"train: eval steps {bpb}")
check(close(bpb[-1][1], summary["final_eval_mean_bpb"], rel=1e-5),
      f"train: bpb {bpb[-1][1]} vs summary {summary['final_eval_mean_bpb']}")
print(f"train: {len(s)} tags, loss {[v for _, v in s['loss']]}, bpb {[v for _, v in bpb]}")
sys.exit(0 if ok else 1)
PY
[ "$fail" = 0 ] && echo "worker_tensorboard: ok"
exit $fail
