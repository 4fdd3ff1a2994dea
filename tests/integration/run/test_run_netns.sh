#!/usr/bin/env bash
# `nebula run` through the emulated WAN (root only, else exit 77): a tiny two-cluster job whose
# link has 25 ms one way runs each cluster in its own namespace; it completes with identical
# hashes, the certificates name the namespace addresses only, the RTT the scheduler measured is
# about 50 ms, and nothing is left (namespaces, delay line, state, workers). Then a run stopped
# with SIGINT mid-round and a run whose cluster fails also leave nothing, a cluster of two mpirun
# ranks works inside its namespace, and --loopback keeps a root run on loopback.
# usage: test_run_netns.sh NEBULA DATA_DIR WAN_DIR
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
tmp=$(mktemp -d /tmp/nb_run_netns.XXXXXX)
pid=""
runs=() # every nebula run started here: its link is nbr-<pid>
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  for p in $(pgrep -f -- "worker --job $tmp" || true); do kill -9 "$p" 2>/dev/null || true; done
  for p in "${runs[@]}"; do
    [ -e "/run/nebula-wan/nbr-$p" ] && "$NB_WAN_DIR/wan-down.sh" --prefix "nbr-$p" >/dev/null 2>&1
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

write_job "$tmp/job.json" ns-test \
  '[{"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
    {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}]' \
  '{"layers": 1, "width": 32, "heads": 2, "context": 32}' 40 \
  '{"mode": "outer", "innerSteps": 4}' \
  '{"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8"}' \
  '{"rateMbit": 20, "delayMs": 25}'

# 1. a complete run through the namespaces
"$nebula" run "$tmp/job.json" --out "$tmp/run" --data-dir "$data" >"$tmp/run.log" 2>&1 &
pid=$!
runs+=("$pid")
rc=0
wait "$pid" || rc=$?
prefix="nbr-$pid"
pid=""
grep -v '^\[dc-.\] \(round\|eval\|sched\)' "$tmp/run.log" || true
[ "$rc" -eq 0 ] || fail "nebula run exited $rc"
grep -q "in network namespaces behind an emulated WAN link" "$tmp/run.log" || fail "not run in namespaces"
grep -q "WAN link $prefix: .* 20 Mbit/s each way, 25 ms one way" "$tmp/run.log" || fail "link line"
ha=$(jq -r .global_xxh3 "$tmp/run/dc-a/summary.json")
hb=$(jq -r .global_xxh3 "$tmp/run/dc-b/summary.json")
[ -n "$ha" ] && [ "$ha" = "$hb" ] || fail "theta_global differs: $ha vs $hb"
[ "$(jq .rounds "$tmp/run/dc-a/summary.json")" -eq 10 ] || fail "dc-a did not run 10 rounds"
for c in a b; do
  san=$(openssl x509 -in "$tmp/run/pki/clusters/dc-$c.crt" -noout -ext subjectAltName)
  case "$c" in a) want=169.254.100.1 ;; b) want=169.254.100.2 ;; esac
  grep -q "IP Address:$want" <<<"$san" || fail "dc-$c certificate lacks $want: $san"
  grep -q "127.0.0.1" <<<"$san" && fail "dc-$c certificate still names 127.0.0.1"
  rtt=$(jq '.decisions[-1].rtt_s' "$tmp/run/dc-$c/summary.json")
  echo "dc-$c: RTT the scheduler used: $rtt s"
  gt "$rtt" 0.045 && gt 0.080 "$rtt" || fail "dc-$c RTT $rtt s is not about 50 ms"
done
grep -q "WAN link $prefix torn down" "$tmp/run.log" || fail "no tear-down line"
assert_nothing_left "$prefix" "$tmp"

# 2. SIGINT in the middle of the rounds: every worker stopped, the link torn down
"$nebula" run "$tmp/job.json" --out "$tmp/int" --data-dir "$data" --steps 4000 >"$tmp/int.log" 2>&1 &
pid=$!
runs+=("$pid")
for _ in $(seq 1 300); do
  grep -q "^round 3/" "$tmp/int/dc-a/worker.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^round 3/" "$tmp/int/dc-a/worker.log" || fail "the interrupted run never reached round 3"
ip netns list | awk '{print $1}' | grep -q "^nbr-$pid-a" || fail "no namespace during the run"
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
prefix="nbr-$pid"
pid=""
[ "$rc" -ne 0 ] || fail "an interrupted run exited 0"
grep -q "interrupted; every worker stopped" "$tmp/int.log" || fail "no interruption message"
grep -q "WAN link $prefix torn down" "$tmp/int.log" || fail "interrupted run: no tear-down line"
assert_nothing_left "$prefix" "$tmp"

# 3. a cluster that cannot start (no "fa" in the test corpus): the run fails, the link goes
sed 's/"ru"/"fa"/' "$tmp/job.json" >"$tmp/bad.json"
"$nebula" run "$tmp/bad.json" --out "$tmp/bad" --data-dir "$data" >"$tmp/bad.log" 2>&1 &
pid=$!
runs+=("$pid")
rc=0
wait "$pid" || rc=$?
prefix="nbr-$pid"
pid=""
[ "$rc" -ne 0 ] || fail "a run with a failing cluster exited 0"
grep -q "cluster dc-b failed" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "no failure line"; }
grep -q "WAN link $prefix torn down" "$tmp/bad.log" || fail "failed run: no tear-down line"
assert_nothing_left "$prefix" "$tmp"

# 4. a cluster of two ranks under mpirun inside its namespace (skipped without mpirun)
if command -v mpirun >/dev/null; then
  sed 's/{"id": "dc-a",/{"id": "dc-a", "workers": 2,/' "$tmp/job.json" >"$tmp/mpi.json"
  "$nebula" run "$tmp/mpi.json" --out "$tmp/mpi" --data-dir "$data" --steps 12 >"$tmp/mpi.log" 2>&1 &
  pid=$!
  runs+=("$pid")
  rc=0
  wait "$pid" || rc=$?
  prefix="nbr-$pid"
  pid=""
  [ "$rc" -eq 0 ] || { cat "$tmp/mpi.log"; fail "the mpirun run exited $rc"; }
  grep -q "dc-a: 2 ranks under mpirun" "$tmp/mpi.log" || fail "dc-a did not run under mpirun"
  [ "$(jq .ranks "$tmp/mpi/dc-a/summary.json")" -eq 2 ] || fail "dc-a summary: not 2 ranks"
  [ "$(jq -r .global_xxh3 "$tmp/mpi/dc-a/summary.json")" = \
    "$(jq -r .global_xxh3 "$tmp/mpi/dc-b/summary.json")" ] || fail "mpirun run: hashes differ"
  assert_nothing_left "$prefix" "$tmp"
fi

# 5. --loopback as root: no namespaces
"$nebula" run "$tmp/job.json" --out "$tmp/lo" --data-dir "$data" --steps 8 --loopback >"$tmp/lo.log" 2>&1 ||
  { cat "$tmp/lo.log"; fail "--loopback run failed"; }
grep -q "2 clusters on loopback" "$tmp/lo.log" || fail "--loopback did not stay on loopback"

# 6. refused: both flags, and --netns for a job that is not two clusters
rc=0
"$nebula" run "$tmp/job.json" --netns --loopback >"$tmp/both.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "exclude each other" "$tmp/both.log" || fail "--netns --loopback not refused ($rc)"
sed 's/{"id": "dc-b",/{"id": "dc-c", "data": {"tier": "quick", "languages": ["en"]}}, {"id": "dc-b",/' \
  "$tmp/job.json" >"$tmp/three.json"
rc=0
"$nebula" run "$tmp/three.json" --out "$tmp/three" --data-dir "$data" --netns >"$tmp/three.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "joins exactly two clusters" "$tmp/three.log" ||
  { cat "$tmp/three.log"; fail "--netns with three clusters not refused ($rc)"; }
echo "PASS"
