#!/usr/bin/env bash
# nb-delayline refuses bad command lines with exit code 2 and a message naming the problem, and
# fails (exit 1, no crash) when a namespace or device cannot be opened. Needs no root.
set -u
dl=$1
fail=0
expect() { # expect CODE WORD args...
  local code=$1 word=$2
  shift 2
  local out rc
  out=$("$dl" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -q -- "$word" <<<"$out"; then
    echo "FAIL: nb-delayline $* -> rc $rc (want $code), output: $out"
    fail=1
  else
    echo "ok: nb-delayline $* -> rc $rc"
  fi
}
base=(--ns-a nbx-none-a --tap-a t0 --ns-b nbx-none-b --tap-b t0)
expect 0 usage --help
expect 2 required --delay-ms 5
expect 2 "delay-ms" "${base[@]}" --delay-ms abc
expect 2 "delay-ms" "${base[@]}" --delay-ms -1
expect 2 "delay-ms" "${base[@]}" --delay-ms 1e9
expect 2 "delay-ba-ms" "${base[@]}" --delay-ms 1 --delay-ba-ms x
expect 2 "queue-frames" "${base[@]}" --delay-ms 1 --queue-frames 3
expect 2 "mtu" "${base[@]}" --delay-ms 1 --mtu 99999
expect 2 "shorter" --ns-a - --tap-a this-name-is-far-too-long --ns-b - --tap-b t0 --delay-ms 1
expect 2 usage "${base[@]}" --delay-ms 1 --bogus
expect 2 usage "${base[@]}" --delay-ms 1 extra-arg
# A namespace that does not exist: a clear error, exit 1.
expect 1 "nbx-none-a" "${base[@]}" --delay-ms 1
exit $fail
