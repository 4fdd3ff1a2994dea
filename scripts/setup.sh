#!/usr/bin/env bash
# Installs what nebula needs to build, test and run, from Debian's repository (and pinned PyPI
# packages for the interop checks). Idempotent: when everything is present it returns in well
# under a second. It never changes anything that is already installed.
set -euo pipefail

# Debian packages (build, test and run time). Keep sorted; docs/building.md explains each.
DEB_PKGS=(
  build-essential
  chromium
  clang
  cmake
  iperf3
  iproute2
  iputils-ping
  jq
  libcmocka-dev
  libgrpc-dev
  libjansson-dev
  libopenblas-dev
  libopenmpi-dev
  libprotobuf-c-dev
  libsqlite3-dev
  libssl-dev
  libxxhash-dev
  libzstd-dev
  munge
  openmpi-bin
  openssl
  pkg-config
  prometheus
  protobuf-c-compiler
  python3-grpcio
  slurm-wlm
  stress-ng
  zlib1g-dev
)

# Python packages for interop and reference checks and the Python binding (python/: cffi, numpy),
# and the offline check of deploy/k8s against the Kubernetes schema (kubernetes-validate),
# pinned; installed into the python3 on PATH.
PIP_PKGS=(
  cffi==2.0.0
  numpy==1.26.4
  safetensors==0.4.5
  sacrebleu==2.4.3
  kubernetes-validate==1.37.0
)
# The PyTorch adapter's test (nebula.torch). Its own pip call: a 4 GB download (PyPI's wheel
# carries the CUDA libraries; about 2.5 min here) whose failure must not cost the set above.
PIP_TORCH=(
  torch==2.15.0
)
# examples/torch/t5_lora.py (a transformers T5 from a config, peft LoRA): its own call after
# torch's, so that its failure costs only the LoRA example's test
PIP_HF=(
  transformers==4.57.6
  peft==0.17.1
)

# tests/unit/worker/worker_tensorboard.sh reads nebula's event files back with TensorBoard's
# EventAccumulator: its own call, so that its failure costs only that test (it skips)
PIP_TB=(
  tensorboard==2.21.0
)

stamp_dir="${NB_SETUP_STAMP_DIR:-.cache}"
mkdir -p "$stamp_dir"

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi

missing=()
for p in "${DEB_PKGS[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$status" in
    *"install ok installed"*) ;;
    *) missing+=("$p") ;;
  esac
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# pip: each set only when it changed since its last successful install.
pip_install_set() { # LABEL PKG==VER...
  local label=$1
  shift
  local stamp
  stamp="$stamp_dir/pip-$(printf '%s\n' "$@" | sha256sum | cut -c1-16)"
  [ "${NB_SETUP_SKIP_PIP:-0}" != "1" ] && [ ! -f "$stamp" ] || return 0
  local py
  py=$(command -v python3 || true)
  [ -n "$py" ] || return 0
  if ! "$py" - "$@" <<'PYEOF'
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, ver = spec.split("==")
    try:
        if metadata.version(name) != ver:
            sys.exit(1)
    except metadata.PackageNotFoundError:
        sys.exit(1)
PYEOF
  then
    echo "setup: installing Python packages: $*"
    "$py" -m pip install -q --disable-pip-version-check "$@" ||
      { echo "setup: pip install failed; $label tests will skip" >&2; return 0; }
  fi
  touch "$stamp"
}
pip_install_set interop "${PIP_PKGS[@]}"
pip_install_set torch "${PIP_TORCH[@]}"
pip_install_set hf "${PIP_HF[@]}"
pip_install_set tensorboard "${PIP_TB[@]}"
