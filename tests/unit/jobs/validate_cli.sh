#!/bin/sh
# `nebula validate` through the real binary: exit codes 0 (valid), 1 (invalid), 2 (usage), the
# normalized output of a valid descriptor validates again, and stdin works. A descriptor file
# that is missing is named with the system's words by every command that reads one, not as a
# descriptor error at the JSON path "$".
# usage: validate_cli.sh NEBULA SOURCE_DIR
set -u
nebula=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for f in "$src"/jobs/examples/*.json; do
  "$nebula" validate "$f" >"$tmp/norm.json" || fail "$f should be valid"
  "$nebula" validate "$tmp/norm.json" >"$tmp/norm2.json" || fail "normalized $f should be valid"
  cmp -s "$tmp/norm.json" "$tmp/norm2.json" || fail "normalizing $f twice changed it"
  "$nebula" validate - <"$f" >/dev/null || fail "$f on stdin should be valid"
done
"$nebula" validate "$src/tests/unit/jobs/bad/18-workers-negative.json" 2>"$tmp/err"
[ $? -eq 1 ] || fail "a bad descriptor should exit 1"
grep -q '\$.spec.clusters\[1\].workers: expected an integer in \[1, 4096\], found integer -2' "$tmp/err" ||
  fail "missing precise error: $(cat "$tmp/err")"
"$nebula" validate >/dev/null 2>&1
[ $? -eq 2 ] || fail "no FILE should exit 2"
"$nebula" validate --bogus x >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown option should exit 2"
cd "$tmp" || fail "cd $tmp"
want="cannot open nonexist.json: No such file or directory"
for c in "validate nonexist.json" "train nonexist.json" "run nonexist.json" \
         "worker --job nonexist.json --cluster a --insecure" \
         "submit nonexist.json --ca ca.pem --cert u.pem --key u.key"; do
  # shellcheck disable=SC2086
  "$nebula" $c >/dev/null 2>"$tmp/err"
  rc=$?
  cmd=${c%% *}
  [ "$rc" -ne 0 ] || fail "nebula $c should fail"
  [ "$(grep -c . "$tmp/err")" -eq 1 ] || fail "nebula $c: one line expected: $(cat "$tmp/err")"
  grep -qxF "nebula $cmd: $want" "$tmp/err" || fail "nebula $c: $(cat "$tmp/err")"
done
"$nebula" validate --json nonexist.json >"$tmp/out" 2>/dev/null
[ $? -eq 1 ] || fail "validate --json of a missing file should exit 1"
python3 -c 'import json, sys
o = json.load(open(sys.argv[1]))
assert o["valid"] is False and o["errors"][0]["path"] == "", o
assert o["errors"][0]["message"] == sys.argv[2], o' "$tmp/out" "$want" ||
  fail "validate --json of a missing file: $(cat "$tmp/out")"
cd - >/dev/null || fail "cd back"
"$nebula" help | grep -q '^  validate ' || fail "'nebula help' should list validate"
echo "validate CLI: ok"
