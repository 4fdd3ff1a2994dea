#!/usr/bin/env bash
# The square sgemm rate of every OpenBLAS core type this CPU can run, each in its own process
# (OpenBLAS fixes its kernel when it loads), as `nebula bench sgemm` measures it: the table that
# justifies the core type nebula asks for (docs/blas.md). Types the CPU lacks the instructions
# for are not run (they would die of SIGILL); a type this OpenBLAS was built without reports the
# kernel it ran instead. Rounds go through the types in turn, so that other load hits them alike.
# usage: scripts/blas-candidates.sh [BUILD_DIR] [N] [ROUNDS]   (default build, 1024, 3)
#        threads: OPENBLAS_NUM_THREADS (default: all CPUs)
set -euo pipefail
build="${1:-build}"
n="${2:-1024}"
rounds="${3:-3}"
nebula="$build/nebula"
[ -x "$nebula" ] || { echo "blas-candidates.sh: no $nebula (build first, or give BUILD_DIR)" >&2; exit 2; }
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
types="Prescott Nehalem"
has avx && types="$types Sandybridge"
has avx2 && has fma && types="$types Haswell Zen"
if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd; then
  types="$types SkylakeX"
  has avx512_bf16 && types="$types Cooperlake"
fi
echo "OpenBLAS: $(NB__BLAS_CHECKED=measure "$nebula" bench sgemm --n 64 --reps 1 --json |
  python3 -c 'import json,sys; o=json.load(sys.stdin); print("detected", o["core"], "-", o["threads"], "threads; nebula asks for", o["best_coretype"] or "nothing")')"
echo "sgemm ${n}x${n}x${n}, best of $rounds rounds (each the best of 3 calls), $(cut -d' ' -f1 /proc/loadavg) load"
declare -A best kern
for r in $(seq "$rounds"); do
  for t in $types; do
    line=$(OPENBLAS_CORETYPE=$t NB__BLAS_CHECKED=measure "$nebula" bench sgemm --n "$n" --json) || continue
    read -r k g < <(printf '%s' "$line" | python3 -c 'import json,sys; o=json.load(sys.stdin); print(o["core"], o["gflops"])')
    kern[$t]=$k
    if [ -z "${best[$t]:-}" ] || python3 -c "import sys; sys.exit(not $g > ${best[$t]})"; then best[$t]=$g; fi
  done
done
printf '%-12s %-12s %10s\n' "CORETYPE" "ran" "GFLOP/s"
for t in $types; do
  note=""
  [ "${kern[$t]:-}" = "$t" ] || note="  (not in this OpenBLAS: it ran ${kern[$t]:-nothing})"
  printf '%-12s %-12s %10.1f%s\n' "$t" "${kern[$t]:-?}" "${best[$t]:-0}" "$note"
done
