#!/usr/bin/env bash
# The Debian package: built with CPack from the build folder into a temporary folder, listed with
# dpkg-deb -c, and checked to hold the binary, the library (and its soname link), the header and
# pkg-config file, the gateway's systemd unit (its ExecStart the package's /usr/bin/nebula), the
# WAN scripts and the delay line; its control data names the package, a Depends computed from
# the libraries, and the postinst that adds the service user. Prints the listing. Skipped (77)
# without cpack or dpkg-deb. Slow (a full staged install): registered with
# -DNB_PACKAGE_TESTS=ON, or run it by hand: test_deb.sh CPACK BUILD_DIR
set -euo pipefail
cpack=$1
build=$(cd "$2" && pwd)
fail() {
  echo "FAIL: $*"
  exit 1
}
command -v "$cpack" >/dev/null || { echo "SKIP: cpack not found"; exit 77; }
command -v dpkg-deb >/dev/null || { echo "SKIP: dpkg-deb not found"; exit 77; }
tmp=$(mktemp -d /tmp/nb_deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
(cd "$build" && "$cpack" -G DEB -B "$tmp/out" --config "$build/CPackConfig.cmake") >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; fail "cpack -G DEB failed"; }
deb=$(ls "$tmp"/out/nebula_*.deb)
[ -f "$deb" ] || fail "no .deb in $tmp/out"
dpkg-deb -c "$deb" >"$tmp/list"
echo "== dpkg-deb -c $(basename "$deb")"
awk '{print $1, $6}' "$tmp/list"
has() { grep -q " \./$1\( \|$\)" <(awk '{print "", $6}' "$tmp/list") || fail "$1 is not in the package"; }
for f in usr/bin/nebula usr/include/nebula.h usr/lib/systemd/system/nebula-gateway.service \
  usr/share/nebula/wan/wan-up.sh usr/share/nebula/wan/wan-down.sh usr/share/nebula/wan/wan-set.sh \
  usr/share/nebula/wan/measure.sh usr/share/nebula/wan/lib.sh usr/libexec/nebula/nb-delayline \
  usr/share/doc/nebula/operations.md; do
  has "$f"
done
grep -Eq " \./usr/lib/([^/]+/)?libnebula\.so\.[0-9]+\.[0-9]+\.[0-9]+$" "$tmp/list" || fail "libnebula.so.X.Y.Z is not in the package"
grep -Eq " \./usr/lib/([^/]+/)?libnebula\.so\.0 -> " "$tmp/list" || fail "the soname link libnebula.so.0 is not in the package"
grep -Eq " \./usr/lib/([^/]+/)?pkgconfig/nebula\.pc$" "$tmp/list" || fail "nebula.pc is not in the package"
grep -q "^-rwxr-xr-x .* \./usr/bin/nebula$" "$tmp/list" || fail "usr/bin/nebula is not executable"
dpkg-deb -f "$deb" Package Version Depends >"$tmp/control"
echo "== control"
cat "$tmp/control"
grep -q "^Package: nebula$" "$tmp/control" || fail "Package"
grep -q "^Depends: .*libgrpc" "$tmp/control" || fail "Depends does not name libgrpc"
dpkg-deb -e "$deb" "$tmp/control.d"
grep -q "adduser --system" "$tmp/control.d/postinst" || fail "the postinst does not add the service user"
dpkg-deb -x "$deb" "$tmp/root"
grep -qx "ExecStart=/usr/bin/nebula gateway --config /etc/nebula/gateway.json" \
  "$tmp/root/usr/lib/systemd/system/nebula-gateway.service" || fail "the packaged unit's ExecStart"
echo "deb: ok ($(basename "$deb"))"
