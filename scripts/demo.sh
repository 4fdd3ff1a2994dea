#!/usr/bin/env bash
# `make demo`: runs the most complete real job nebula can run today on an embedded default: the
# update codec (error feedback, exact top-k, quantization, index coding, zstd, framing, strict
# decode-and-accumulate) on a realistic heavy-tailed 16M-parameter update, with a summary.
set -euo pipefail
build="${1:-build}"
n=16777216
echo "== nebula demo: the update codec on a realistic 16M-parameter update =="
"$build/nebula" bench codec --n "$n" --density 0.01 --values int8
echo
echo "== value types and densities (median of 3 runs each) =="
printf '%-6s %-8s %12s %14s %12s %12s\n' values density wire_bytes bits/param encode_GB/s decode_GB/s
field() { sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p"; }
for spec in "int8 0.001" "int8 0.01" "int8 0.1" "fp16 0.01" "bf16 0.01"; do
  set -- $spec
  json=$("$build/nebula" bench codec --n "$n" --density "$2" --values "$1" --runs 3 --json)
  printf '%-6s %-8s %12s %14.4f %12.2f %12.2f\n' "$1" "$2" "$(field wire_bytes <<<"$json")" \
    "$(field bits_per_param <<<"$json")" "$(field encode_gbps <<<"$json")" \
    "$(field decode_gbps <<<"$json")"
done
echo
echo "fp32 would be 32 bits per parameter; plain zstd of the same fp32 update is shown above."
