#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU and this repository, installs what is missing,
# builds with CUDA, runs every `gpu`-labelled test and the NCCL allreduce benchmark, and prints a
# short table. One command, a few minutes:   bash bench/gpu-check.sh
# It does not install a driver or CUDA itself (it says so and stops when they are absent).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${NB_GPU_BUILD:-build-gpu}
jobs=$(nproc)
log=$build/gpu-check.log
mib=${NB_GPU_CHECK_MIB:-256}

die() { echo "gpu-check: $*" >&2; exit 1; }

# 1. What must be there: a driver with a device, the CUDA toolkit (nvcc, NCCL), our packages.
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this machine has no NVIDIA driver"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "$ngpu" -ge 1 ] || die "nvidia-smi lists no GPU"
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
  done
fi
command -v nvcc >/dev/null || die "nvcc not found: install the CUDA toolkit (with NCCL) first"
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
echo "gpu-check: $ngpu x $gpu_name, CUDA at $cuda_home"
NB_SETUP_SKIP_PIP=1 bash scripts/setup.sh ||
  echo "gpu-check: warning: scripts/setup.sh failed (offline?); continuing with what is installed"
for tool in cmake mpirun pkg-config; do
  command -v "$tool" >/dev/null || die "$tool is missing and could not be installed"
done
if [ ! -e "$cuda_home/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ]; then
  echo "gpu-check: NCCL headers missing; trying the distribution's libnccl-dev"
  (apt-get install -y -qq --no-install-recommends libnccl-dev libnccl2 >/dev/null 2>&1) ||
    die "NCCL not found and libnccl-dev could not be installed"
fi

# 2. Build with CUDA (sm_90 unless NB_CUDA_ARCH says otherwise).
mkdir -p "$build"
arch=${NB_CUDA_ARCH:-90}
t0=$(date +%s)
{
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNB_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" &&
    cmake --build "$build" -j "$jobs"
} >"$log" 2>&1 || { tail -40 "$log"; die "build failed (full log: $log)"; }
grep -q 'NCCL=ON' "$log" || { grep 'nebula: CUDA' "$log"; die "the build did not find NCCL"; }
echo "gpu-check: built in $(($(date +%s) - t0)) s"

# 3. Every gpu test.
(cd "$build" && ctest -L gpu --output-on-failure --timeout 240) >"$build/gpu-ctest.log" 2>&1
ctest_rc=$?
# 4. The NCCL allreduce benchmark on every GPU (a single GPU is one rank: busbw is 0 there, as
#    in nccl-tests, and vs_raw compares times).
mpirun_args=(--allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$ngpu")
bench_json=$(GLIBC_TUNABLES=glibc.malloc.hugetlb=1 timeout 120 mpirun "${mpirun_args[@]}" \
  -x GLIBC_TUNABLES "$build/nebula" bench allreduce --device gpu --mib "$mib" --iters 30 \
  --json 2>"$build/gpu-bench.err" | grep '^{' | tail -1)
bench_human=$(timeout 120 mpirun "${mpirun_args[@]}" "$build/nebula" bench allreduce \
  --device gpu --mib 64 --iters 30 2>>"$build/gpu-bench.err")

# 5. The table.
echo
echo "| check | result |"
echo "|---|---|"
echo "| device | $ngpu x $gpu_name |"
grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$build/gpu-ctest.log" |
  sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) [. ]*(\*\*\*)?([A-Za-z]+).* ([0-9.]+ sec)$/| \1 | \3 (\4) |/'
echo "| gpu tests overall | $([ $ctest_rc -eq 0 ] && echo pass || echo FAIL) |"
if [ -n "$bench_json" ]; then
  echo "| bench allreduce ${mib} MiB (json) | \`$bench_json\` |"
else
  echo "| bench allreduce | FAIL (see $build/gpu-bench.err) |"
fi
echo
echo "$bench_human"
[ $ctest_rc -eq 0 ] && [ -n "$bench_json" ]
