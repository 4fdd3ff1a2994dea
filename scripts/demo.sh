#!/usr/bin/env bash
# `make demo`: the main job on an embedded default. Two datacenters on this machine, each with
# its own gateway, federated over mutual TLS: (1) multilingual pretraining across both (DC-A
# en/de/fr/es, DC-B en/ru/zh/fa; the text never leaves its cluster) with outer (DiLoCo-style)
# sync, where only compressed updates cross, sealed; (2) a translation fine-tune (LoRA, with
# distillation from the pretrained teacher) submitted at DC-A to run in DC-B from (1)'s
# checkpoint, which DC-B's gateway fetches by content hash. As root the gateways sit in two
# network namespaces joined by an emulated 100 Mbit/s, 25 ms link; otherwise on loopback with
# the jobs' rate cap. First a look at the codec that makes the updates small.
set -euo pipefail
build="${1:-build}"
export NB_DEMO_DATA="${NB_DEMO_DATA:-data/quick}"

echo "== the update codec on a realistic heavy-tailed 16M-parameter update =="
"$build/nebula" bench codec --n 16777216 --density 0.01 --values int8 --runs 3
echo
exec bash "$(dirname "$0")/demo-gateways.sh" "$build"
