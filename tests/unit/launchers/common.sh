# Shared by the launcher tests: a temp folder, a PKI from `nebula certs`, a gateway process on
# port 0 and helpers. Sourced with NB (the nebula binary) set; the test adds its own cleanup to
# launcher_cleanup through EXTRA_CLEANUP.
T=$(mktemp -d "${TMPDIR:-/tmp}/nb_launch.XXXXXX")
GW_PID=
EXTRA_CLEANUP=:
fail() { echo "FAIL: $*" >&2; [ -f "$T/gw.err" ] && tail -20 "$T/gw.err" >&2; exit 1; }
launcher_cleanup() {
  [ -n "$GW_PID" ] && kill -9 "$GW_PID" 2>/dev/null
  for f in "$T"/work/*/pids; do
    [ -f "$f" ] || continue
    for p in $(cat "$f"); do kill -9 "$p" 2>/dev/null; done
  done
  $EXTRA_CLEANUP
  rm -rf "$T"
}
trap launcher_cleanup EXIT INT TERM

make_pki() {
  "$NB" certs init --dir "$T/pki" >/dev/null || fail "certs init"
  "$NB" certs issue --dir "$T/pki" --cluster dc-a --san 127.0.0.1 >/dev/null || fail "certs issue"
  "$NB" certs issue --dir "$T/pki" --user alice >/dev/null || fail "certs issue user"
  export NB_CA="$T/pki/ca.crt" NB_CERT="$T/pki/users/alice.crt" NB_KEY="$T/pki/users/alice.key"
}

start_gw() {
  : > "$T/gw.out"
  "$NB" gateway --config "$T/gw.json" > "$T/gw.out" 2>> "$T/gw.err" &
  GW_PID=$!
  i=0
  while ! grep -q "listening" "$T/gw.out"; do
    i=$((i+1)); [ $i -gt 200 ] && fail "gateway did not start: $(cat "$T/gw.err")"
    sleep 0.05
  done
  PORT=$(sed -n 's/.* port \([0-9]*\)$/\1/p' "$T/gw.out")
  export NB_GATEWAY=127.0.0.1:$PORT
}

stop_gw() {
  kill -TERM "$GW_PID"; wait "$GW_PID"; rc=$?; GW_PID=
  [ $rc -eq 0 ] || fail "gateway exit $rc on SIGTERM"
}

# desc NAME WORKERS: a one-cluster descriptor
desc() {
  printf '{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "%s"},
 "spec": {"clusters": [{"id": "dc-a", "workers": %d, "data": {"languages": ["en"]}}]}}\n' "$1" "$2"
}

# submit NAME WORKERS: prints the job id
submit() {
  desc "$1" "$2" > "$T/$1.json"
  "$NB" submit "$T/$1.json" || fail "submit $1"
}

# wait_lines FILE N: until FILE has N lines (5 s)
wait_lines() {
  i=0
  while [ "$(cat "$1" 2>/dev/null | wc -l)" -lt "$2" ]; do
    i=$((i+1)); [ $i -gt 250 ] && fail "$1 did not reach $2 lines"; sleep 0.02
  done
}

# alive PID: running and not a zombie
alive() { [ -d "/proc/$1" ] && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
