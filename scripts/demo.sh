#!/usr/bin/env bash
# `make demo`: runs the most complete real job nebula can run today on an embedded default.
set -euo pipefail
build="${1:-build}"
echo "== nebula demo: the update codec on a realistic 16M-parameter update =="
exec "$build/nebula" bench codec --n 16777216 --density 0.01 --values int8
