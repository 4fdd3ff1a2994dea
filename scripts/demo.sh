#!/usr/bin/env bash
# `make demo`: the main job on an embedded default. Two datacenters on this machine train one
# byte-level transformer on their own languages (DC-A en/de/fr/es, DC-B en/ru/zh/fa; the text
# never leaves its cluster) with outer (DiLoCo-style) sync: only int8 top-k updates with error
# feedback cross, sealed, over mutual TLS with the link's 100 Mbit/s cap. First a look at the
# codec that makes the updates small. Not yet here: gateways and the namespace-emulated delay.
set -euo pipefail
build="${1:-build}"
data="${NB_DEMO_DATA:-data/quick}"
out="${NB_DEMO_OUT:-runs/demo-2dc}"

echo "== 1/2  the update codec on a realistic heavy-tailed 16M-parameter update =="
"$build/nebula" bench codec --n 16777216 --density 0.01 --values int8 --runs 3
echo

echo "== 2/2  multilingual pretraining across two datacenters (outer sync, int8 top-k) =="
rm -rf "$out"
"$build/nebula" run jobs/examples/pretrain-2dc-small.json --out "$out" --data-dir "$data"
echo
echo "Report: $out/report.html (self-contained, inline SVG) and $out/summary.json;"
echo "per cluster: $out/<cluster>/summary.json, rounds.tsv and worker.log"
