#!/usr/bin/env bash
# `nebula bench train --json` at a tiny shape: the honest fields exist and are finite numbers
# (tokens/s, model GFLOP/s, the best sgemm of the core types measured in the same run and its
# mfu, vs_torch), not their values. vs_torch is null only with a reason, when PyTorch is not
# importable. Each sgemm candidate names its type; the best is one of them.
# usage: bench_train_json.sh NEBULA
set -u
nebula=${1:?usage: bench_train_json.sh NEBULA}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$nebula" bench train --layers 1 --dim 32 --heads 1 --ctx 16 --batch 1 --steps 1 --json \
  >"$tmp/out" 2>"$tmp/err"; then
  echo "FAIL: nebula bench train exit $?: $(tail -3 "$tmp/err")"
  exit 1
fi
python3 - "$tmp/out" <<'PY' || { echo "FAIL: $(head -c 3000 "$tmp/out") $(tail -3 "$tmp/err")"; exit 1; }
import importlib.util, json, math, platform, sys
o = json.load(open(sys.argv[1]))
def finite(k):
    v = o.get(k)
    assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0, (k, v)
for k in ("tokens_per_s", "model_gflops", "best_sgemm_gflops", "mfu_vs_best_sgemm", "threads",
          "params"):
    finite(k)
assert o["best_sgemm_n"] == 1024 and o["blas_core"], o
assert o["flops_per_token"] == "6*params + 12*layers*dim*ctx", o
cands = o["sgemm_candidates"]
if platform.machine() in ("x86_64", "i686"):  # elsewhere one row: the loaded kernel
    assert cands and cands[0]["coretype"] == "Prescott", cands
assert o["best_sgemm_core"] in [c["coretype"] for c in cands if c["gflops"] is not None], o
assert max(c["gflops"] or 0 for c in cands) == o["best_sgemm_gflops"], o
if importlib.util.find_spec("torch") is not None:
    finite("vs_torch")
    finite("torch_tokens_per_s")
else:
    assert o["vs_torch"] is None and "not importable" in o["vs_torch_reason"], o
PY
echo "bench train --json: every field there and finite"
