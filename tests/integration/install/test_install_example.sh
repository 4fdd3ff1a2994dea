#!/usr/bin/env bash
# `make install` as a user meets it: the build installed into a temporary prefix (and staged under
# DESTDIR), examples/c copied out of the tree and built with the installed nebula.pc only, then
# run as two clusters on 127.0.0.1 (two processes, mutual TLS from the installed `nebula certs`,
# sealed frames) by the example's own run_two_clusters.sh. Asserts: both exit 0, each cluster's
# loss fell from the first round to the last, every round's and the final theta_global hash agree
# across the clusters, and the example refuses bad input naming it. No time is asserted.
# usage: test_install_example.sh CMAKE BUILD_DIR SOURCE_DIR CC [PYTHON3]
set -euo pipefail
cmake=$1
build=$(cd "$2" && pwd)
src=$(cd "$3" && pwd)
cc=$4
python=${5:-}
rounds=12

fail() {
  echo "FAIL: $*"
  exit 1
}
command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not found"; exit 77; }
tmp=$(mktemp -d /tmp/nb_install.XXXXXX)
runner=
cleanup() {
  # the runner leads its own process group (setsid): the group takes both clusters with it
  if [ -n "$runner" ]; then kill -TERM -- "-$runner" 2>/dev/null || true; fi
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- install: into a prefix, and staged under DESTDIR ----------------------------------------
prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install failed"
}
pc=$(find "$prefix" -name nebula.pc)
[ -n "$pc" ] || fail "no nebula.pc under the prefix"
for f in include/nebula.h bin/nebula; do [ -e "$prefix/$f" ] || fail "$f not installed"; done
libdir=$(cd "$(dirname "$pc")/.." && pwd)
for f in libnebula.so libnebula.a; do [ -e "$libdir/$f" ] || fail "$f not in $libdir"; done
DESTDIR=$tmp/stage "$cmake" --install "$build" --prefix /opt/nebula >/dev/null
for f in include/nebula.h bin/nebula lib; do
  [ -e "$tmp/stage/opt/nebula/$f" ] || fail "DESTDIR: $f not staged under DESTDIR/opt/nebula"
done

# ---- build the example outside the tree with the installed pkg-config file only --------------
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs nebula)
case $flags in
  *"$src"* | *"$build"*) fail "pkg-config nebula names the source or build tree: $flags" ;;
esac
[ "$(cd "$(pkg-config --variable=bindir nebula)" && pwd)" = "$prefix/bin" ] ||
  fail "nebula.pc's bindir is not the prefix's bin"
cp -r "$src/examples/c" "$tmp/example"
rm -f "$tmp/example/two_cluster_regression"
make -s -C "$tmp/example" CC="$cc" >"$tmp/make.log" 2>&1 || {
  cat "$tmp/make.log"
  fail "the example does not build against the installed nebula"
}
ex=$tmp/example/two_cluster_regression
# it runs without LD_LIBRARY_PATH, and on the installed library
deps=$(env -u LD_LIBRARY_PATH ldd "$ex")
[[ $deps == *"libnebula.so.0 => $libdir/libnebula.so.0 "* ]] ||
  fail "the example does not load $libdir/libnebula.so.0: $(grep nebula <<<"$deps")"

# ---- bad input: named, with the exit status the program documents ---------------------------
# expect_refused RC WORD CMD...: CMD exits RC with WORD in its stderr
expect_refused() {
  local want=$1 word=$2 err rc=0
  shift 2
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  if [ "$rc" != "$want" ] || [[ $err != *"$word"* ]]; then
    fail "$*: exit $rc (want $want, naming $word): $err"
  fi
}
expect_refused 1 NEBULA_DENSITY env NEBULA_DENSITY=1.5 "$ex"
expect_refused 2 --rounds "$ex" --rounds 0
expect_refused 2 NEBULA_JOB_ID env -u NEBULA_JOB_ID "$ex"

# ---- two clusters ------------------------------------------------------------------------------
# two free loopback ports (held together while they are picked, so they differ)
ports=
if [ -n "$python" ]; then
  ports=$("$python" -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(f"{a.getsockname()[1]},{b.getsockname()[1]}")')
fi
[ -n "$ports" ] || ports="$((20000 + RANDOM % 20000)),$((40000 + RANDOM % 20000))"
set +e
# timeout bounds the whole run (a cluster waiting on a dead peer ends at its peer timeout anyway)
# and signals its whole process group, which setsid made the runner's own
setsid timeout -k 5 60 bash "$tmp/example/run_two_clusters.sh" --rounds "$rounds" \
  --dir "$tmp/run" --ports "$ports" --peer-timeout 10 >"$tmp/run.out" 2>&1 &
runner=$!
wait "$runner"
rc=$?
set -e
runner=
cat "$tmp/run.out"
[ "$rc" = 0 ] || fail "run_two_clusters.sh exited $rc"
for c in east west; do
  [ "$(cat "$tmp/run/$c.rc")" = 0 ] || fail "cluster $c exited $(cat "$tmp/run/$c.rc")"
  n=$(grep -c '^round ' "$tmp/run/$c.log")
  [ "$n" = "$rounds" ] || fail "cluster $c printed $n rounds, not $rounds"
  first=$(awk '/^round / {print $4; exit}' "$tmp/run/$c.log")
  last=$(awk '/^round / {v = $4} END {print v}' "$tmp/run/$c.log")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 2) }' ||
    fail "cluster $c: the loss did not fall to under half (first round $first, last $last)"
  echo "cluster $c: loss $first -> $last over $rounds rounds"
done
hashes() { awk '/^round / {print $NF} /^final/ {print "final", $NF}' "$1"; }
[ "$(hashes "$tmp/run/east.log")" = "$(hashes "$tmp/run/west.log")" ] ||
  fail "the clusters' theta_global hashes differ: $(paste <(hashes "$tmp/run/east.log") \
    <(hashes "$tmp/run/west.log"))"
final=$(awk '/^final/ {print $NF}' "$tmp/run/east.log")
[[ $final =~ ^[0-9a-f]{16}$ ]] || fail "no final hash: '$final'"
echo "install_example: ok (theta_global $final on both clusters)"
