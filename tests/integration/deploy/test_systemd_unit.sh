#!/usr/bin/env bash
# deploy/systemd/nebula-gateway.service checked by systemd-analyze verify (skipped, 77, without
# it), with ExecStart pointed at the build's nebula as an install does; any complaint about the
# unit fails, and so does a copy with an unknown key (the check bites). Also: stopping the unit
# must leave jobs running (KillMode=process), reload must send SIGHUP (certificate rotation) and
# the hardening options are set.
# usage: test_systemd_unit.sh NEBULA UNIT
set -euo pipefail
nebula=$1
unit=$2
fail() {
  echo "FAIL: $*"
  exit 1
}
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not found"; exit 77; }
tmp=$(mktemp -d /tmp/nb_unit.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/bin/nebula |$nebula |" "$unit" >"$tmp/nebula-gateway.service"
grep -q "^ExecStart=$nebula gateway --config " "$tmp/nebula-gateway.service" || fail "ExecStart not rewritten"
out=$(systemd-analyze verify "$tmp/nebula-gateway.service" 2>&1) || fail "verify: $out"
if grep -q "nebula-gateway.service" <<<"$out"; then fail "verify complained: $out"; fi
mkdir "$tmp/bad"
sed 's/^UMask=/NoSuchOption=1\nUMask=/' "$tmp/nebula-gateway.service" >"$tmp/bad/nebula-gateway.service"
bad=$(systemd-analyze verify "$tmp/bad/nebula-gateway.service" 2>&1 || true)
grep -q "NoSuchOption" <<<"$bad" || fail "an unknown key was not reported: $bad"
grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$unit" || fail "the unit lacks ExecReload (SIGHUP)"
for opt in KillMode=process NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
  CapabilityBoundingSet= StateDirectory=nebula RestrictAddressFamilies=; do
  grep -q "^$opt" "$unit" || fail "the unit lacks $opt"
done
echo "systemd unit: ok ($(systemd-analyze --version | head -1))"
