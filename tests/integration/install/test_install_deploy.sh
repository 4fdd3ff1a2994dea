#!/usr/bin/env bash
# The deployment files of `make install`, as an installed nebula meets them: the build installed
# into a temporary prefix holds the WAN scripts (share/nebula/wan), the delay line
# (libexec/nebula), the gateway's systemd unit naming the prefix's binary (checked by
# systemd-analyze verify when it is there) and the docs. Then, as root, the installed binary
# (NB_WAN_DIR and NB_DELAYLINE unset) runs a two-cluster job whose link has a delay in network
# namespaces behind the emulated WAN, and so does a copy of the build's binary with its
# deploy/wan folder moved away from the source tree (an out-of-tree build); a prefix without the
# scripts or without the delay line refuses the job naming what is missing and --loopback,
# instead of running it over loopback. Not as root: the WAN part is skipped (the files are still
# checked). No time is asserted.
# usage: test_install_deploy.sh CMAKE BUILD_DIR DATA_DIR
set -euo pipefail
cmake=$1
build=$(cd "$2" && pwd)
data=$3
unset NB_WAN_DIR NB_DELAYLINE

fail() {
  echo "FAIL: $*"
  exit 1
}
tmp=$(mktemp -d /tmp/nb_install_deploy.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null || true
    if [ -e "/run/nebula-wan/nbr-$p" ]; then
      bash "$tmp/prefix/share/nebula/wan/wan-down.sh" --prefix "nbr-$p" >/dev/null 2>&1 || true
    fi
  done
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install failed"
}
for f in bin/nebula include/nebula.h share/nebula/wan/wan-up.sh share/nebula/wan/wan-down.sh \
  share/nebula/wan/wan-set.sh share/nebula/wan/measure.sh share/nebula/wan/lib.sh \
  lib/systemd/system/nebula-gateway.service share/doc/nebula/operations.md; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
[ -x "$prefix/libexec/nebula/nb-delayline" ] || fail "libexec/nebula/nb-delayline not installed"
unit=$prefix/lib/systemd/system/nebula-gateway.service
grep -qx "ExecStart=$prefix/bin/nebula gateway --config /etc/nebula/gateway.json" "$unit" ||
  fail "the unit's ExecStart does not name the prefix's binary: $(grep ^ExecStart "$unit")"
if command -v systemd-analyze >/dev/null; then
  # any complaint about the file (an unknown key, a binary that is not there) fails
  out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
  if grep -q "nebula-gateway.service" <<<"$out"; then fail "systemd-analyze verify: $out"; fi
  echo "systemd-analyze verify: ok"
else
  echo "systemd-analyze not found: the unit is not verified"
fi

probe=nbprobe-$$
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! ip netns add "$probe" 2>/dev/null; then
  echo "install_deploy: files ok; WAN part skipped (needs root, ip and network namespaces)"
  exit 0
fi
ip netns del "$probe"

cat >"$tmp/job.json" <<'JOB'
{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "inst-wan"},
 "spec": {"task": "pretrain",
  "clusters": [{"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
               {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": 8, "eval": {"batches": 1},
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": {"mode": "outer", "innerSteps": 4},
  "compression": {"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8"},
  "link": {"rateMbit": 50, "delayMs": 5}}}
JOB

# run_job NEBULA OUT: nebula run in the background (its pid kept for the clean-up), its exit
# status returned
run_job() {
  local rc=0
  "$1" run "$tmp/job.json" --out "$tmp/$2" --data-dir "$data" --no-mpi >"$tmp/$2.log" 2>&1 &
  local p=$!
  pids+=("$p")
  wait "$p" || rc=$?
  return "$rc"
}

# 1. the installed binary finds its emulator
run_job "$prefix/bin/nebula" inst || { cat "$tmp/inst.log"; fail "installed nebula run failed"; }
grep -q "in network namespaces behind an emulated WAN link" "$tmp/inst.log" ||
  fail "installed: not run in namespaces: $(head -5 "$tmp/inst.log")"
grep -q "WAN link nbr-.*50 Mbit/s each way, 5 ms one way" "$tmp/inst.log" || fail "installed: link line"
grep -q "WAN link nbr-.* torn down" "$tmp/inst.log" || fail "installed: no tear-down"
echo "installed binary: ran behind the emulated WAN (5 ms)"

# 2. a build folder away from the source tree (what cmake -S . -B ../elsewhere gives)
mkdir -p "$tmp/elsewhere/deploy"
cp "$build/nebula" "$tmp/elsewhere/"
cp -r "$build/deploy/wan" "$tmp/elsewhere/deploy/wan"
run_job "$tmp/elsewhere/nebula" oot || { cat "$tmp/oot.log"; fail "out-of-tree nebula run failed"; }
grep -q "in network namespaces behind an emulated WAN link" "$tmp/oot.log" ||
  fail "out of tree: not run in namespaces: $(head -5 "$tmp/oot.log")"
echo "out-of-tree build: ran behind the emulated WAN"

# 3. the emulator missing: refused, naming what is missing and the way out
cp -r "$prefix" "$tmp/noscripts"
rm -rf "$tmp/noscripts/share/nebula/wan"
rc=0
run_job "$tmp/noscripts/bin/nebula" nos || rc=$?
[ "$rc" -eq 1 ] || fail "no scripts: exit $rc, not 1: $(cat "$tmp/nos.log")"
grep -q "link.delayMs 5, but the WAN emulator is missing: the WAN scripts (wan-up.sh)" \
  "$tmp/nos.log" || fail "no scripts: message: $(cat "$tmp/nos.log")"
grep -q -- "--loopback" "$tmp/nos.log" || fail "no scripts: --loopback not named"
grep -q "running over loopback" "$tmp/nos.log" && fail "no scripts: ran over loopback"
cp -r "$prefix" "$tmp/nodelay"
rm -rf "$tmp/nodelay/libexec"
rc=0
run_job "$tmp/nodelay/bin/nebula" nod || rc=$?
[ "$rc" -eq 1 ] || fail "no delay line: exit $rc, not 1: $(cat "$tmp/nod.log")"
grep -q "the delay line nb-delayline is not in" "$tmp/nod.log" ||
  fail "no delay line: message: $(cat "$tmp/nod.log")"
echo "emulator missing: refused ($(grep -o 'the WAN emulator is missing: [^:]*' "$tmp/nos.log"))"
echo "install_deploy: ok"
