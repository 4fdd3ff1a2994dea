#!/usr/bin/env bash
# `nebula env`: the table lists every parameter, the logger's NB_DEBUG* among them; NAME prints
# that one (an unknown NAME is an error naming it, with the closest name); --json is JSON that
# parses, typed, with the value from the environment; --help is the usage, not the table.
set -u
nebula=${1:?usage: env_cli.sh NEBULA}
fail=0
bad() { echo "FAIL: $*"; fail=1; }

table=$("$nebula" env) || bad "nebula env failed"
for v in NB_DEBUG NB_DEBUG_SUBSYS NB_DEBUG_FILE NB_ZSTD_LEVEL; do
  printf '%s\n' "$table" | grep -q "^$v " || bad "nebula env does not list $v"
done
rows=$(($(printf '%s\n' "$table" | grep -c .) - 1))

help=$("$nebula" env --help) || bad "nebula env --help failed"
printf '%s\n' "$help" | grep -q '^usage: nebula env' || bad "env --help: $help"
printf '%s\n' "$help" | grep -q 'NB_ZSTD_LEVEL ' && bad "env --help printed the table"

one=$(NB_ZSTD_LEVEL=7 "$nebula" env NB_ZSTD_LEVEL) || bad "nebula env NB_ZSTD_LEVEL failed"
[ "$(printf '%s\n' "$one" | grep -c .)" -eq 1 ] || bad "env NAME printed more than one row: $one"
printf '%s\n' "$one" | grep -Eq '^NB_ZSTD_LEVEL +7 +environment ' || bad "env NAME: $one"

err=$("$nebula" env NB_ZSTD_LEVL 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] || bad "env of an unknown NAME: exit $rc"
printf '%s\n' "$err" | grep -qF "no parameter 'NB_ZSTD_LEVL'; did you mean 'NB_ZSTD_LEVEL'?" ||
  bad "env of an unknown NAME: $err"

NB_DEBUG=INFO NB_ZSTD_LEVEL=7 "$nebula" env --json 2>/dev/null | python3 -c '
import json, sys
a = json.load(sys.stdin)
n = int(sys.argv[1])
assert isinstance(a, list) and len(a) == n, (len(a), n)
by = {p["name"]: p for p in a}
assert by["NB_ZSTD_LEVEL"]["value"] == 7 and by["NB_ZSTD_LEVEL"]["source"] == "environment", by["NB_ZSTD_LEVEL"]
assert by["NB_DEBUG"]["value"] == "INFO", by["NB_DEBUG"]
for p in a:
    assert set(p) >= {"name", "type", "value", "source", "default", "description"}, p
' "$rows" || bad "env --json"
"$nebula" env NB_DEBUG_SUBSYS --json | python3 -c '
import json, sys
o = json.load(sys.stdin)
assert o["name"] == "NB_DEBUG_SUBSYS" and o["default"] == "ALL", o' || bad "env NAME --json"
[ "$fail" -eq 0 ] && echo "env: table, NAME, --json and --help"
exit "$fail"
