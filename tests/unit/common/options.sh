#!/usr/bin/env bash
# Every command and benchmark takes its options from one parser (common/opts.h): `--opt=value`
# is accepted like `--opt value`, --help exits 0, and an unknown option is refused with exit 2
# and one line on stderr that names it (without its value) and where the help is
# ("see nebula CMD --help"), never the whole help.
set -u
nebula=${1:?usage: options.sh NEBULA}
fail=0
cmds=(train worker run gateway eval report validate certs submit get list watch cancel logs env
      "bench codec" "bench rpc" "bench allreduce" "bench wan" "bench train" "bench decode"
      "bench e2e" "bench pareto" "bench seal")
for c in "${cmds[@]}"; do
  # shellcheck disable=SC2086
  if ! "$nebula" $c --help >/dev/null 2>&1; then
    echo "FAIL: nebula $c --help did not exit 0"
    fail=1
  fi
  # shellcheck disable=SC2086
  err=$("$nebula" $c --no-such-option=1 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -q -- "'--no-such-option'" ||
     ! printf '%s' "$err" | grep -qF -- "see nebula $c --help"; then
    echo "FAIL: nebula $c --no-such-option=1: exit $rc, $lines lines: $err"
    fail=1
  fi
done
# --opt=value is the same as --opt value: a bad value is named either way
for form in "--mib=0" "--mib 0"; do
  # shellcheck disable=SC2086
  err=$("$nebula" bench seal $form 2>&1 >/dev/null)
  if ! printf '%s' "$err" | grep -q -- '--mib needs an integer'; then
    echo "FAIL: nebula bench seal $form: $err"
    fail=1
  fi
done
# `train --steps=5` without a CONFIG: the option is taken, the one error is the missing CONFIG
err=$("$nebula" train --steps=5 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$err" | grep -c .)" -ne 1 ] ||
   ! printf '%s' "$err" | grep -q 'missing CONFIG' ||
   ! printf '%s' "$err" | grep -qF 'see nebula train --help'; then
  echo "FAIL: nebula train --steps=5: exit $rc: $err"
  fail=1
fi
# a bad value in either form, and a near miss of a name, are one line naming the option
for args in "--steps=x" "--steps x" "--json=1"; do
  # shellcheck disable=SC2086
  err=$("$nebula" train $args job.json 2>&1 >/dev/null)
  rc=$?
  opt=${args%%[= ]*}
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$err" | grep -c .)" -ne 1 ] ||
     ! printf '%s' "$err" | grep -q -- "$opt" ||
     ! printf '%s' "$err" | grep -qF 'see nebula train --help'; then
    echo "FAIL: nebula train $args: exit $rc: $err"
    fail=1
  fi
done
err=$("$nebula" train --stesp=5 job.json 2>&1 >/dev/null)
if ! printf '%s' "$err" | grep -qF "unknown option '--stesp'; did you mean '--steps'?"; then
  echo "FAIL: nebula train --stesp=5: $err"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "options: every command parses alike"
exit "$fail"
