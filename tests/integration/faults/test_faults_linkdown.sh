#!/usr/bin/env bash
# The WAN link down for 20 s mid-run. As root: between the two network namespaces of deploy/wan
# (veth, 50 Mbit/s), `ip link set wan0 down` in namespace a, back up 20 s later (or when only 15
# rounds are left, whichever comes first). Without root
# (or with NB_FAULTS_PROXY=1): over loopback through cutproxy.py, whose link is cut for 20 s
# (every connection closed, new ones refused). Both clusters must keep training (their rounds
# are skipped, not applied, on both), apply rounds again once the link is back, complete the
# run, and end with the same theta_global hash; both summaries count the skipped rounds.
# NB_FAULTS_OVERLAP=1: the same with sync.overlap (overlapSteps 1: each round's exchange and vote
# run during the next round, decided one step into it), a shorter run and an 8 s outage.
# NB_FAULTS_LATE=N: the link comes back only when N rounds are left (N = 3: about 1 s before the
# last round; N = 0: after dc-a's last round, while the final check waits): the last rounds may
# be skipped, and the final check, which asks a silent peer again for up to NB_FINAL_WAIT_S, must
# still end with the same theta_global on both clusters and exit 0.
# Each run prints how long after the link came back the first round was applied again.
# usage: test_faults_linkdown.sh NEBULA DATA_DIR WAN_DIR
set -euo pipefail
nebula=$1
data=$2
wan=$3
here=$(cd "$(dirname "$0")" && pwd)
mode=netns
if [ "$(id -u)" -ne 0 ] || [ -n "${NB_FAULTS_PROXY:-}" ]; then mode=proxy; fi
if [ "$mode" = proxy ] && ! /usr/bin/python3 -c 'import asyncio' 2>/dev/null; then
  echo "SKIP: needs root (network namespaces) or python3 (the loopback proxy)"
  exit 77
fi
. "$here/lib.sh"
prefix="nbf-$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ "$mode" = netns ] && { "$wan/wan-down.sh" --prefix "$prefix" >/dev/null 2>&1 || true; }
  [ -n "${NB_KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

if [ "$mode" = netns ]; then
  eval "$("$wan/wan-up.sh" --prefix "$prefix" --rate-mbit 50 --delay-ms 0)"
  ns_a=$NB_WAN_NS_A ns_b=$NB_WAN_NS_B
  listen_a=$NB_WAN_ADDR_A:7500 listen_b=$NB_WAN_ADDR_B:7500
  target_a=$listen_a target_b=$listen_b
  san_a=$NB_WAN_ADDR_A san_b=$NB_WAN_ADDR_B
else
  port=$((20000 + ($$ % 20000)))
  listen_a=127.0.0.1:$port listen_b=127.0.0.1:$((port + 1))
  target_a=127.0.0.1:$((port + 2)) target_b=127.0.0.1:$((port + 3))
  san_a=127.0.0.1 san_b=127.0.0.1
  /usr/bin/python3 "$here/cutproxy.py" "$((port + 2))=$port" "$((port + 3))=$((port + 1))" \
    --pidfile "$tmp/proxy.pid" >"$tmp/proxy.log" 2>&1 &
  proxy=$!
  pids+=("$proxy")
  for _ in $(seq 1 100); do [ -s "$tmp/proxy.pid" ] && break; sleep 0.05; done
  [ -s "$tmp/proxy.pid" ] || fail "the proxy did not start"
fi
export OPENBLAS_NUM_THREADS=1 NB_TRAIN_THREADS=1 NB_ROUND_DEADLINE_S=8
late=${NB_FAULTS_LATE:-}
if [ -n "$late" ]; then
  total=30 outage=0 min_skipped=5 min_after=0
  write_job "$tmp/job.json" $total 0.3
elif [ -n "${NB_FAULTS_OVERLAP:-}" ]; then
  total=50 outage=8 min_skipped=5 min_after=3
  write_job "$tmp/job.json" $total 0.3 ', "overlap": true, "overlapSteps": 1'
else
  total=80 outage=20 min_skipped=10 min_after=3
  write_job "$tmp/job.json" $total 0.3
fi
make_pki "$tmp/pki" "$san_a" "$san_b"
worker() { # NS CLUSTER LISTEN PEER PEER_TARGET
  local ns=(ip netns exec "$1")
  [ "$mode" = netns ] || ns=()
  exec "${ns[@]}" "$nebula" worker --job "$tmp/job.json" --cluster "$2" \
    --out "$tmp/$2" --listen "$3" --peer "$4=$5" --pki "$tmp/pki" \
    --secret-file "$tmp/pki/job.secret" --data-dir "$data"
}
(worker "${ns_a:-}" dc-a "$listen_a" dc-b "$target_b") >"$tmp/a.log" 2>&1 &
apid=$!
pids+=("$apid")
(worker "${ns_b:-}" dc-b "$listen_b" dc-a "$target_a") >"$tmp/b.log" 2>&1 &
bpid=$!
pids+=("$bpid")

for _ in $(seq 1 300); do
  [ -f "$tmp/dc-a/rounds.tsv" ] && [ "$(tsv_count "$tmp/dc-a/rounds.tsv" applied 1)" -ge 4 ] && break
  sleep 0.05
done
[ "$(tsv_count "$tmp/dc-a/rounds.tsv" applied 1)" -ge 4 ] || fail "no 4 applied rounds before the outage"
if [ "$mode" = netns ]; then ip -n "$NB_WAN_NS_A" link set "$NB_WAN_DEV" down
else kill -USR1 "$(cat "$tmp/proxy.pid")"; fi
echo "link down ($mode) at $(date +%s.%N)"
if [ -n "$late" ]; then # up again when $late rounds are left
  while kill -0 "$apid" 2>/dev/null && [ "$(($(wc -l <"$tmp/dc-a/rounds.tsv") - 1))" -lt $((total - late)) ]; do
    sleep 0.05
  done
else # up again after the outage, or earlier when only 15 rounds are left (a loaded machine
  # makes rounds of one slow step, shorter than their budget, and the run shorter than the outage)
  end=$(($(date +%s%N) + outage * 1000000000))
  while [ "$(date +%s%N)" -lt "$end" ] && [ "$(($(wc -l <"$tmp/dc-a/rounds.tsv") - 1))" -lt $((total - 15)) ]; do
    sleep 0.05
  done
fi
rows_up=$(($(wc -l <"$tmp/dc-a/rounds.tsv") - 1))
if [ "$mode" = netns ]; then ip -n "$NB_WAN_NS_A" link set "$NB_WAN_DEV" up
else kill -USR2 "$(cat "$tmp/proxy.pid")"; fi
up_at=$(date +%s.%N)
echo "link up at $up_at, $rows_up of $total rounds done"
if [ -z "$late" ]; then # (with the link back late, the run may end right after)
  kill -0 "$apid" 2>/dev/null || fail "dc-a stopped during the outage"
  kill -0 "$bpid" 2>/dev/null || fail "dc-b stopped during the outage"
fi
# the first round applied after the link came back (a figure, not a verdict: it is wall time)
while kill -0 "$apid" 2>/dev/null; do
  [ "$(awk -F'\t' -v r="$rows_up" 'NR > r + 1 && $13 == 1 { n++ } END { print n + 0 }' "$tmp/dc-a/rounds.tsv")" -gt 0 ] && {
    echo "first round applied $(awk -v a="$up_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the link came back"
    break
  }
  sleep 0.05
done
wait "$apid" || fail "dc-a failed"
wait "$bpid" || fail "dc-b failed"
echo "both clusters done $(awk -v a="$up_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the link came back"
pids=(${proxy:+"$proxy"})
same_hash "$tmp/dc-a" "$tmp/dc-b"
for c in dc-a dc-b; do
  s=$(json_field "$tmp/$c/summary.json" rounds_skipped)
  n=$(json_field "$tmp/$c/summary.json" rounds_applied)
  echo "$c: $n rounds applied, $s skipped, $(json_field "$tmp/$c/summary.json" rounds_late) late, $(json_field "$tmp/$c/summary.json" round_jumps) jumps, final check in $(json_field "$tmp/$c/summary.json" final_check_attempts) attempts"
  [ "$s" -ge "$min_skipped" ] || fail "$c skipped only $s rounds during a $outage s outage"
  [ "$(json_field "$tmp/$c/summary.json" overlap)" = "$([ -n "${NB_FAULTS_OVERLAP:-}" ] && echo true || echo false)" ] ||
    fail "$c: overlap is not as asked"
  # skipped rounds still trained, and rounds were applied again after the outage
  awk -F'\t' 'NR > 1 && $13 == 0 && $2 < 1 { bad++ } END { exit bad > 0 }' "$tmp/$c/rounds.tsv" ||
    fail "$c: a skipped round without inner steps"
  after=$(awk -F'\t' 'NR > 1 { if ($13 == 0) last = NR; rows[NR] = $13 }
    END { n = 0; for (i = last + 1; i <= NR; i++) if (rows[i] == 1) n++; print n }' "$tmp/$c/rounds.tsv")
  [ "$after" -ge "$min_after" ] || fail "$c: only $after rounds applied after the outage"
done
[ "$(json_field "$tmp/dc-a/summary.json" rounds_applied)" = "$(json_field "$tmp/dc-b/summary.json" rounds_applied)" ] ||
  fail "the clusters applied different numbers of rounds"
if [ "$mode" = netns ]; then
  "$wan/wan-down.sh" --prefix "$prefix" >/dev/null
  ip netns list | grep -q "^$prefix-" && fail "namespaces left behind"
fi
echo "PASS"
