#!/usr/bin/env bash
# Runs the example as two clusters, east and west, on 127.0.0.1, the way a launcher would: a
# federation PKI made with `nebula certs` (every connection mutual TLS), a fresh job secret (every
# frame sealed), and each cluster's session described by the NEBULA_* environment. Waits for
# both, prints their output, and fails unless both exit 0 with the same theta_global.
#
#   run_two_clusters.sh [--rounds N] [--dir DIR] [--ports EAST,WEST] [--peer-timeout S]
#
# DIR (default ./run) keeps the PKI (made once), the job secret and each cluster's log
# (DIR/east.log) and exit status (DIR/east.rc). The `nebula` program comes from $NEBULA, else the
# bindir of pkg-config's nebula, else PATH; the example from $EXAMPLE, else beside this script.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rounds=15
peer_timeout=30
dir=run
ports=7400,7401
die() {
  echo "run_two_clusters: $*" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --dir) dir=${2:?--dir needs a folder}; shift 2 ;;
    --ports) ports=${2:?--ports needs EAST,WEST}; shift 2 ;;
    --peer-timeout) peer_timeout=${2:?--peer-timeout needs seconds}; shift 2 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (--rounds N, --dir DIR, --ports EAST,WEST, --peer-timeout S)" ;;
  esac
done
[[ $ports =~ ^([0-9]+),([0-9]+)$ ]] || die "--ports wants two port numbers EAST,WEST, got '$ports'"
port_east=${BASH_REMATCH[1]}
port_west=${BASH_REMATCH[2]}
program=${EXAMPLE:-$here/two_cluster_regression}
[ -x "$program" ] || die "$program is not built: run make in $here first"

nebula=${NEBULA:-}
if [ -z "$nebula" ]; then
  bindir=$(pkg-config --variable=bindir nebula 2>/dev/null || true)
  if [ -n "$bindir" ] && [ -x "$bindir/nebula" ]; then nebula=$bindir/nebula; else nebula=nebula; fi
fi
command -v "$nebula" >/dev/null || die "no nebula program (set NEBULA=PREFIX/bin/nebula)"

mkdir -p "$dir"
pki=$dir/pki
if [ ! -f "$pki/ca.crt" ]; then
  "$nebula" certs init --dir "$pki" >/dev/null
  for c in east west; do
    "$nebula" certs issue --dir "$pki" --cluster "$c" --san 127.0.0.1 >/dev/null
  done
fi
# a new secret per run: the sealing keys are per job, and a rerun must not reuse a nonce
secret=$dir/job.secret
rm -f "$secret"
(umask 077 && head -c 32 /dev/urandom >"$secret")

pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster() { # ID INDEX PORT PEER
  NEBULA_JOB_ID=two-cluster-regression NEBULA_CLUSTER_ID=$1 NEBULA_CLUSTER_INDEX=$2 \
    NEBULA_N_CLUSTERS=2 NEBULA_LISTEN=127.0.0.1:$3 NEBULA_PEERS=$4 NEBULA_PKI_DIR=$pki \
    NEBULA_JOB_SECRET_FILE=$secret "$program" --rounds "$rounds" \
    --peer-timeout "$peer_timeout" >"$dir/$1.log" 2>&1 &
  pids+=($!)
}
start_cluster east 0 "$port_east" "west=127.0.0.1:$port_west"
start_cluster west 1 "$port_west" "east=127.0.0.1:$port_east"
i=0
for c in east west; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "$rc" >"$dir/$c.rc"
  i=$((i + 1))
done
pids=()

ok=1
for c in east west; do
  sed "s/^/[$c] /" "$dir/$c.log"
  rc=$(cat "$dir/$c.rc")
  echo "[$c] exit $rc"
  [ "$rc" = 0 ] || ok=0
done
h_east=$(awk '/^final/ {print $NF}' "$dir/east.log")
h_west=$(awk '/^final/ {print $NF}' "$dir/west.log")
if [ "$ok" = 1 ] && [ -n "$h_east" ] && [ "$h_east" = "$h_west" ]; then
  echo "both clusters hold theta_global $h_east"
  exit 0
fi
echo "run_two_clusters: the clusters failed or disagree (east '$h_east', west '$h_west')" >&2
exit 1
