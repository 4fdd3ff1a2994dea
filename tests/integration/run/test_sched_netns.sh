#!/usr/bin/env bash
# The adaptive scheduler follows a link whose rate changes mid-run (root only, else exit 77):
# `nebula run` through the emulated WAN (8 Mbit/s, 25 ms one way), frames well under the
# estimator's 64 KiB transfer threshold (so only the link probes measure goodput), wall-time
# rounds of 0.8 s; after round 8 the test halves the tbf rate with deploy/wan/wan-set.sh. The
# decisions in summary.json must show the measured goodput falling to about half of the first
# half's and the density following it; hashes identical; nothing left behind.
# usage: test_sched_netns.sh NEBULA DATA_DIR WAN_DIR
set -euo pipefail
nebula=$1
data=$2
export NB_WAN_DIR=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/integration/run/lib.sh
. "$here/lib.sh"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: needs root (network namespaces)"
  exit 77
fi
command -v jq >/dev/null || fail "jq not found (scripts/setup.sh installs it)"
tmp=$(mktemp -d /tmp/nb_sched_netns.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && "$NB_WAN_DIR/wan-down.sh" --prefix "nbr-$pid" >/dev/null 2>&1
  for p in $(pgrep -f -- "worker --job $tmp" || true); do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# 434k parameters; the density that fits 0.13 x 0.8 s less one round trip (51 ms) at 8 Mbit/s is
# about 0.05 (~40 KiB frames)
write_job "$tmp/job.json" sched-halve \
  '[{"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
    {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}]' \
  '{"layers": 2, "width": 128, "heads": 4, "context": 32}' 1000 \
  '{"mode": "outer", "roundSeconds": 0.8}' \
  '{"density": {"initial": 0.05, "min": 0.002, "max": 0.065}, "values": "int8",
    "budgetFraction": 0.13}' \
  '{"rateMbit": 8, "delayMs": 25}'

half=8
NB_LINK_PROBE_MS=1000 "$nebula" run "$tmp/job.json" --out "$tmp/run" --data-dir "$data" \
  >"$tmp/run.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "^round $half/" "$tmp/run/dc-a/worker.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^round $half/" "$tmp/run/dc-a/worker.log" || { cat "$tmp/run.log"; fail "round $half never ended"; }
"$NB_WAN_DIR/wan-set.sh" --prefix "nbr-$pid" --rate-mbit 4 || fail "wan-set.sh"
rc=0
wait "$pid" || rc=$?
prefix="nbr-$pid"
pid=""
grep -v '^\[dc-.\] \(round\|eval\)' "$tmp/run.log" || true
[ "$rc" -eq 0 ] || fail "nebula run exited $rc"
ha=$(jq -r .global_xxh3 "$tmp/run/dc-a/summary.json")
hb=$(jq -r .global_xxh3 "$tmp/run/dc-b/summary.json")
[ -n "$ha" ] && [ "$ha" = "$hb" ] || fail "theta_global differs: $ha vs $hb"
for c in a b; do
  s="$tmp/run/dc-$c/summary.json"
  # decisions made after rounds 2..half (before the change) against the last four; the density
  # only of those the rate decided ("fit", "hold"): a loaded machine's longer round trips can put
  # a round at the floor (floor_lengthen: not even the least density fits what is left of the
  # budget after them), which says nothing about the rate
  read -r g1 d1 g2 d2 <<<"$(jq -r --argjson h "$half" '
    def mean(f): (map(f) | if length > 0 then add / length else 0 end);
    def rate_bound: select(.reason == "fit" or .reason == "hold");
    [.decisions[] | select(.round >= 2 and .round <= $h and .goodput_Bps > 0)] as $a
    | .decisions[-4:] as $b
    | ([.decisions[] | select(.round >= 2 and .round <= $h) | rate_bound]) as $da
    | ([.decisions[-6:][] | rate_bound]) as $db
    | "\($a | mean(.goodput_Bps)) \($da | mean(.density)) \($b | mean(.goodput_Bps)) \($db | mean(.density))"' "$s")"
  echo "dc-$c: goodput $(awk -v a="$g1" -v b="$g2" 'BEGIN { printf "%.2f -> %.2f Mbit/s (x%.2f)", a * 8e-6, b * 8e-6, b / a }'), density $(awk -v a="$d1" -v b="$d2" 'BEGIN { printf "%.4f -> %.4f (x%.2f)", a, b, b / a }')"
  gt "$g2" "$g1" 0.30 && gt "$g1" "$g2" 1.4 || fail "dc-$c: goodput did not follow the halved link ($g1 -> $g2)"
  gt "$d2" 0 0 || fail "dc-$c: no rate-bound decision in the last rounds"
  gt "$d1" "$d2" 1.15 || fail "dc-$c: density did not follow the halved link ($d1 -> $d2)"
  # the first probe ends a second or so in (NB_LINK_PROBE_MS), after the first rounds (how many
  # depends on this machine's step time): those may have no estimate, none after the first that had
  [ "$(jq '[.decisions | to_entries[] | select(.value.reason != "no_estimate") | .key] as $has
           | ($has | if length > 0 then min else 1e9 end) as $first
           | [.decisions | to_entries[] | select(.value.reason == "no_estimate" and .key > $first)]
           | length' "$s")" -eq 0 ] ||
    fail "dc-$c: the scheduler lost its estimate after it had one"
  # every frame stayed under the estimator's transfer threshold: the probes did the measuring
  big=$(awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "msg_bytes") c = i; next }
    $c >= 65536 { n++ } END { print n + 0 }' "$tmp/run/dc-$c/rounds.tsv")
  [ "$big" -eq 0 ] || fail "dc-$c: $big frames of 64 KiB or more"
done
assert_nothing_left "$prefix" "$tmp"
echo "PASS"
