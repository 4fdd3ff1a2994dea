#!/usr/bin/env bash
# The suite as a statement about behaviour: `make test` several times in a row, each time with
#   - every core kept busy by a background load (stress-ng --cpu <nproc>, for the whole run),
#   - OPENBLAS_CORETYPE set to another of the OpenBLAS kernels this CPU can run (in turn), and
#   - ctest running 4 tests at once (-j 4; the RUN_SERIAL tests still run alone).
# A test that asserts wall time, machine load or what one BLAS kernel's rounding happens to give
# fails here. Stops at the first failing run and says which; prints each run's wall time.
# usage: scripts/stress-suite.sh [RUNS]   (default 3; BUILD=dir as for make)
# Takes about RUNS x 4 minutes on 2 cores after the first build (3 runs: 727 s here).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
build=${BUILD:-build}

bash scripts/setup.sh # installs stress-ng with the rest
command -v stress-ng >/dev/null || { echo "stress-suite: stress-ng is missing" >&2; exit 1; }

# OpenBLAS kernels this CPU can execute, fastest family first (a kernel whose instructions the
# CPU lacks would die with SIGILL, which says nothing about the tests).
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
kernels=()
case " $flags " in *" avx512_bf16 "*) kernels+=(Cooperlake) ;; esac
case " $flags " in *" avx512f "*) kernels+=(SkylakeX) ;; esac
case " $flags " in *" avx2 "*) kernels+=(Haswell) ;; esac
case " $flags " in *" avx "*) kernels+=(Sandybridge) ;; esac
kernels+=(Nehalem Prescott)
echo "stress-suite: $runs runs of make test; OpenBLAS kernels in turn: ${kernels[*]:0:$runs}"

load_pid=
stop_load() {
  if [ -n "$load_pid" ]; then
    kill "$load_pid" 2>/dev/null || true
    wait "$load_pid" 2>/dev/null || true
    load_pid=
  fi
}
trap stop_load EXIT

mkdir -p "$build"
t_all=$(date +%s)
for ((i = 0; i < runs; i++)); do
  kernel=${kernels[$((i % ${#kernels[@]}))]}
  stress-ng --cpu "$(nproc)" --timeout 3600 --quiet &
  load_pid=$!
  t0=$(date +%s)
  echo "== run $((i + 1))/$runs: OPENBLAS_CORETYPE=$kernel, stress-ng --cpu $(nproc), ctest -j 4"
  if ! OPENBLAS_CORETYPE=$kernel make --no-print-directory test BUILD="$build" JOBS=4 \
    >"$build/stress-$((i + 1)).log" 2>&1; then
    tail -n 40 "$build/stress-$((i + 1)).log"
    echo "stress-suite: run $((i + 1)) FAILED (OPENBLAS_CORETYPE=$kernel); log: $build/stress-$((i + 1)).log"
    exit 1
  fi
  stop_load
  grep -E "tests passed|Total Test time" "$build/stress-$((i + 1)).log" || true
  echo "== run $((i + 1)) passed in $(($(date +%s) - t0)) s"
done
echo "stress-suite: $runs of $runs runs passed in $(($(date +%s) - t_all)) s"
