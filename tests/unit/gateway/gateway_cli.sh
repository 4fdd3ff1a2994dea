#!/bin/sh
# The real `nebula gateway` process and the client commands: certificates from `nebula certs`,
# submit → watch → get → logs → list, exit codes, a gateway killed with SIGKILL mid-job and
# restarted (state kept, a job whose process died marked failed, a live one re-attached and
# cancelled with all its processes). Usage: gateway_cli.sh NEBULA_BINARY
set -u
NB=$1
T=$(mktemp -d "${TMPDIR:-/tmp}/nb_gwcli.XXXXXX")
GW_PID=
fail() { echo "FAIL: $*" >&2; exit 1; }
cleanup() {
  [ -n "$GW_PID" ] && kill -9 "$GW_PID" 2>/dev/null
  for f in "$T"/work/*/pids; do
    [ -f "$f" ] || continue
    for p in $(cat "$f"); do kill -9 "$p" 2>/dev/null; done
  done
  for g in $PGS; do kill -9 -"$g" 2>/dev/null; done
  rm -rf "$T"
}
PGS=
trap cleanup EXIT INT TERM

"$NB" certs init --dir "$T/pki" >/dev/null || fail "certs init"
"$NB" certs issue --dir "$T/pki" --cluster dc-a --san 127.0.0.1 >/dev/null || fail "certs issue"
"$NB" certs issue --dir "$T/pki" --user alice >/dev/null || fail "certs issue user"
cat > "$T/job.sh" <<'SCRIPT'
case "$1" in
quick-*) echo "hello from $1"; for i in 1 2 3; do
  echo "{\"round\":$i,\"step\":$((i*10)),\"max_steps\":30,\"loss\":$i.5,\"wan_mbps\":80,\"density\":0.01,\"eta_s\":$((3-i))}" >> "$NB_JOB_PROGRESS"
  sleep 0.1; done;;
slow-*) for i in 1 2 3; do echo "line $i"; sleep 0.1; done;;
report-*) printf 'round\tloss\tbytes_sent\tdensity\tcompute_s\texchange_s\tglobal_xxh3\n0\t2.5\t0\t0\t0.1\t0\t-\n' > rounds.tsv
  echo '{"job": "report", "cluster": "dc-a", "global_xxh3": "00ff"}' > summary.json;;
sleepy-*) sleep 300 & echo $! > pids; sleep 300 & echo $! >> pids; echo $$ >> pids; wait;;
single-*) for i in 5 10; do
  echo "{\"step\": $i, \"max_steps\": 10, \"loss\": 3.25, \"eta_s\": $((10-i)), \"source\": \"dc-a\"}" >> "$NB_JOB_PROGRESS"; done
  echo '{"step": 10, "max_steps": 10, "eval_bpb": 5.125, "source": "dc-a"}' >> "$NB_JOB_PROGRESS";;
evil-*) printf '%s\n' '{"step":1,"max_steps":2,"source":"\u001b]0;pwned\u0007\u001b[2J\ninjected"}' >> "$NB_JOB_PROGRESS";;
esac
SCRIPT
cat > "$T/gw.json" <<CFG
{"cluster_id": "dc-a", "listen": "127.0.0.1:0",
 "tls": {"ca": "pki/ca.crt", "cert": "pki/clusters/dc-a.crt", "key": "pki/clusters/dc-a.key"},
 "command": ["/bin/sh", "$T/job.sh", "{job}"],
 "acl": [{"user": "alice", "clusters": ["dc-a"], "max_workers": 2}],
 "cancel_grace_ms": 500, "poll_ms": 20}
CFG
"$NB" gateway --help | grep -q "cancel_grace_ms" || fail "gateway --help lacks the option table"
"$NB" gateway --config "$T/gw.json" --check-config >/dev/null || fail "config check"

start_gw() {
  : > "$T/gw.out"
  "$NB" gateway --config "$T/gw.json" > "$T/gw.out" 2> "$T/gw.err" &
  GW_PID=$!
  i=0
  while ! grep -q "listening" "$T/gw.out"; do
    i=$((i+1)); [ $i -gt 200 ] && fail "gateway did not start: $(cat "$T/gw.err")"
    sleep 0.05
  done
  PORT=$(sed -n 's/.* port \([0-9]*\)$/\1/p' "$T/gw.out")
  export NB_GATEWAY=127.0.0.1:$PORT
}
export NB_CA="$T/pki/ca.crt" NB_CERT="$T/pki/users/alice.crt" NB_KEY="$T/pki/users/alice.key"
start_gw

desc() {
  printf '{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "%s"},
 "spec": {"clusters": [{"id": "dc-a", "workers": 1, "data": {"languages": ["en"]}}]}}\n' "$1"
}
desc quick > "$T/quick.json"
ID=$("$NB" submit "$T/quick.json") || fail "submit"
case "$ID" in quick-*) ;; *) fail "submit printed '$ID'";; esac
"$NB" watch "$ID" > "$T/watch.out"; rc=$?
[ $rc -eq 0 ] || fail "watch exit $rc"
grep -q "step 30/30" "$T/watch.out" || fail "watch lacks the last step: $(cat "$T/watch.out")"
grep -q "WAN 10.00 MB/s" "$T/watch.out" || fail "watch lacks WAN MB/s"
grep -q "state succeeded" "$T/watch.out" || fail "watch lacks the final state"
# on a terminal: one progress line redrawn in place (carriage return + erase line)
if command -v script >/dev/null 2>&1; then
  script -qec "'$NB' watch '$ID'" /dev/null > "$T/tty.out" 2>&1 < /dev/null
  ESC=$(printf '\033')
  grep -q "${ESC}\[K" "$T/tty.out" || fail "watch on a terminal does not redraw its line"
  [ "$(grep -c 'step 10/30' "$T/tty.out")" -eq 1 ] || fail "watch on a terminal: lines"
  tr '\r' '\n' < "$T/tty.out" | grep -q "step 30/30" || fail "watch on a terminal: last step"
fi
"$NB" get "$ID" --json | grep -q '"state": "succeeded"' || fail "get --json"
[ "$("$NB" logs "$ID")" = "hello from $ID" ] || fail "logs"
"$NB" logs "$ID" --json | grep -q "\"data\":\"hello from $ID\\\\n\"" || fail "logs --json: $("$NB" logs "$ID" --json)"
"$NB" list | grep -q "$ID" || fail "list"
"$NB" list --json --state succeeded | grep -q "\"id\": \"$ID\"" || fail "list --json"
# list and get say the same exit code of an ended job (list used to say -1 where get said 0)
"$NB" get "$ID" --json > "$T/get.json" && "$NB" list --json > "$T/list.json" || fail "get/list --json"
python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))
l = [j for j in json.load(open(sys.argv[2])) if j["id"] == sys.argv[3]]
assert g["exit_code"] == 0 and len(l) == 1 and l[0]["exit_code"] == g["exit_code"], (g, l)
' "$T/get.json" "$T/list.json" "$ID" || fail "list --json and get --json disagree on exit_code: $(cat "$T/list.json")"
"$NB" watch "$ID" --json > "$T/watch.jsonl" || fail "watch --json: exit status"
grep -q '"to":"succeeded"' "$T/watch.jsonl" || fail "watch --json"
# this job leaves no rounds.tsv: its run report fails, an event after the final state
sed -n '/"to":"succeeded"/,$p' "$T/watch.jsonl" | grep -q '"kind":"report_failed"' || fail "watch --json: report_failed"
"$NB" get "$ID" | grep -q "^report:" && fail "get: a report that was not written"

# a job that leaves rounds.tsv and summary.json: its run report, named by watch and get
desc report > "$T/report.json"
RID=$("$NB" submit "$T/report.json") || fail "submit report"
"$NB" watch "$RID" --json > "$T/rwatch.jsonl" || fail "watch report job"
# (the report event is sent before watch ends; the artifact events may come before or after it)
grep -q '"kind":"report"' "$T/rwatch.jsonl" || fail "watch --json: no report event: $(cat "$T/rwatch.jsonl")"
RP=$("$NB" get "$RID" | sed -n 's/^report: *//p')
[ "$RP" = "$T/work/$RID/report/report.html" ] || fail "get: report '$RP'"
grep -q "<svg" "$RP" || fail "report.html without charts"
"$NB" get "$RID" --json | grep -q "\"report\": \"$RP\"" || fail "get --json: no report"

# logs -f follows the output until the job ends
desc slow > "$T/slow.json"
SID=$("$NB" submit "$T/slow.json") || fail "submit slow"
"$NB" logs -f "$SID" > "$T/slow.out" || fail "logs -f"
[ "$(cat "$T/slow.out")" = "$(printf 'line 1\nline 2\nline 3')" ] || fail "logs -f: $(cat "$T/slow.out")"
"$NB" get "$SID" | grep -q "state: *succeeded" || fail "logs -f returned before the job ended"

# terminal escapes: a cancel reason with ESC, BEL or a newline is refused (exit 6, nothing
# stored); strings a job wrote (a progress "source") are shown with their control characters
# escaped by watch, get and list
ESC=$(printf '\033'); BEL=$(printf '\007')
"$NB" cancel "$SID" --reason "$(printf 'x\033]0;pwned\007\ny')" 2> "$T/esc.err"; rc=$?
[ $rc -eq 6 ] || fail "cancel with an escape in the reason: exit $rc"
grep -q "control character (0x1b) at byte 1" "$T/esc.err" || fail "cancel reason: $(cat "$T/esc.err")"
# a one-cluster `nebula train` job's progress: steps and evaluations, no sync rounds; watch
# prints what each line has, not "round 0 ... loss 0.0000 ... density 0" rows
desc single > "$T/single.json"
SID=$("$NB" submit "$T/single.json") || fail "submit single"
"$NB" watch "$SID" > "$T/single.out" 2>&1 || fail "watch single: $(cat "$T/single.out")"
grep -q "step 5/10 ( 50%)  loss 3.2500  ETA 0m05s  dc-a" "$T/single.out" || fail "watch single: step row: $(cat "$T/single.out")"
grep -q "step 10/10 (100%)  held-out 5.1250 bits/byte  dc-a" "$T/single.out" || fail "watch single: eval row: $(cat "$T/single.out")"
grep -Eq "round |density|WAN|loss 0\.0000" "$T/single.out" && fail "watch single: empty sync fields: $(cat "$T/single.out")"
desc evil > "$T/evil.json"
EID=$("$NB" submit "$T/evil.json") || fail "submit evil"
"$NB" watch "$EID" > "$T/evil.out" 2>&1
grep -q "$ESC" "$T/evil.out" && fail "watch printed a raw ESC"
grep -q "$BEL" "$T/evil.out" && fail "watch printed a raw BEL"
grep -q 'x1b\]0;pwned\\x07\\x1b\[2J\\x0ainjected' "$T/evil.out" || fail "watch: escaped source: $(cat "$T/evil.out")"
"$NB" list > "$T/list.out"; "$NB" get "$EID" >> "$T/list.out"
grep -q "$ESC" "$T/list.out" && fail "list/get printed a raw ESC"

# exit codes
"$NB" get >/dev/null 2>&1; [ $? -eq 2 ] || fail "get without id: not a usage error"
"$NB" get nope-1 >/dev/null 2>&1; [ $? -eq 4 ] || fail "get of an unknown job: not 4"
"$NB" submit --help | grep -q "exit status" || fail "submit --help"
NB_CERT="$T/pki/clusters/dc-a.crt" NB_KEY="$T/pki/clusters/dc-a.key" "$NB" submit "$T/quick.json" \
  >/dev/null 2>&1; [ $? -eq 3 ] || fail "a cluster certificate may submit"
NB_GATEWAY=127.0.0.1:1 "$NB" list --timeout 2 >/dev/null 2>&1; [ $? -eq 5 ] || fail "unreachable: not 5"

# nebula artifact put: into alice's namespace, name and sha256 printed; a cluster certificate
# may not put
printf 'echo shipped\n' > "$T/train.sh"
SUM=$(sha256sum "$T/train.sh" | cut -d' ' -f1)
"$NB" artifact put "$T/train.sh" --timeout 10 > "$T/put.out" || fail "artifact put"
[ "$(cat "$T/put.out")" = "alice/train.sh sha256:$SUM 13 bytes" ] || fail "artifact put printed $(cat "$T/put.out")"
"$NB" artifact put "$T/train.sh" code/run.sh --json | grep -q '"name": "alice/code/run.sh"' \
  || fail "artifact put NAME --json"
"$NB" artifact put --help | grep -q "artifacts.max_put_bytes" || fail "artifact put --help"
"$NB" artifact ls > "$T/ls.out" || fail "artifact ls"
grep -q "^alice/train.sh  *13  *$SUM$" "$T/ls.out" && grep -q "^alice/code/run.sh " "$T/ls.out" \
  || fail "artifact ls printed $(cat "$T/ls.out")"
"$NB" artifact ls code/ --json | grep -c '"name"' | grep -qx 1 || fail "artifact ls PREFIX --json"
NB_CERT="$T/pki/clusters/dc-a.crt" NB_KEY="$T/pki/clusters/dc-a.key" "$NB" artifact put \
  "$T/train.sh" >/dev/null 2>&1; [ $? -eq 3 ] || fail "a cluster certificate may put"
"$NB" artifact put "$T/nope.sh" >/dev/null 2>&1; [ $? -eq 1 ] || fail "put of a missing file: not 1"

# misleading output: each says what is wrong with what it was given
mkdir "$T/folder"; : > "$T/empty.json"; truncate -s 100M "$T/big.json"
"$NB" submit "$T/folder" 2> "$T/e"; rc=$?
[ $rc -eq 6 ] && grep -q "folder is a folder, not a descriptor file" "$T/e" || fail "submit of a folder: $rc $(cat "$T/e")"
"$NB" submit "$T/empty.json" 2> "$T/e"; rc=$?
[ $rc -eq 6 ] && grep -q "empty.json is empty" "$T/e" || fail "submit of an empty file: $rc $(cat "$T/e")"
grep -q "signature" "$T/e" && fail "submit of an empty file blames the signature"
"$NB" submit "$T/big.json" 2> "$T/e"; rc=$?
[ $rc -eq 6 ] && grep -q "is 104857600 bytes, larger than the descriptor limit of 1048576 bytes" "$T/e" || fail "submit of 100 MB: $rc $(cat "$T/e")"
"$NB" validate "$T/big.json" 2> "$T/e"; rc=$?
[ $rc -eq 1 ] && grep -q "is 104857600 bytes" "$T/e" || fail "validate of 100 MB: $rc $(cat "$T/e")"
grep -q 1048577 "$T/e" && fail "validate reports the read size: $(cat "$T/e")"
for c in train run; do
  "$NB" $c "$T/big.json" 2> "$T/e"
  grep -q "is 104857600 bytes, larger than the descriptor limit" "$T/e" || fail "$c of 100 MB: $(cat "$T/e")"
  grep -q 1048577 "$T/e" && fail "$c reports the read size: $(cat "$T/e")"
done
head -c 1048600 /dev/zero | "$NB" validate - 2> "$T/e"; rc=$?
[ $rc -eq 1 ] && grep -q "standard input is larger than the descriptor limit" "$T/e" || fail "validate - of 1 MiB+: $rc $(cat "$T/e")"
"$NB" validate "$T/folder" 2> "$T/e"; grep -q "is a folder" "$T/e" || fail "validate of a folder: $(cat "$T/e")"
NB_GATEWAY=127.0.0.1:99999 "$NB" list 2> "$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "port '99999' of '127.0.0.1:99999' is not a port number in 1..65535" "$T/e" || fail "--gateway port 99999: $rc $(cat "$T/e")"
"$NB" list --gateway 127.0.0.1:0 2> "$T/e"; [ $? -eq 2 ] || fail "--gateway port 0"
"$NB" cancel "$SID" --reason --json 2> "$T/e"; rc=$?
[ $rc -eq 2 ] && grep -q "needs a text, not the option '--json'" "$T/e" || fail "cancel --reason --json: $rc $(cat "$T/e")"
"$NB" get "$SID" | grep -q "reason:.*--json" && fail "--json was stored as a reason"
# the gateway's certificate does not match the name the client checks: the gateway never
# answered, so exit 5 (unreachable), not 3 (refused)
"$NB" list --server-name not-the-gateway.example 2> "$T/e"; rc=$?
[ $rc -eq 5 ] && grep -q "TLS handshake with" "$T/e" || fail "server certificate refused: $rc $(cat "$T/e")"
for bad in '"listen": "127.0.0.1:99999"' '"listen": "127.0.0.1:70000"' '"peers": {"dc-b": "127.0.0.1:99999"}' '"peers": {"dc-b": "127.0.0.1"}'; do
  sed "s|\"listen\": \"127.0.0.1:0\"|$bad|" "$T/gw.json" > "$T/badport.json"
  "$NB" gateway --config "$T/badport.json" --check-config > /dev/null 2> "$T/e" && fail "config with $bad accepted"
  grep -Eq "not a port number in|has no port" "$T/e" || fail "config with $bad: $(cat "$T/e")"
done

# restart: two long jobs; the gateway is killed; one job dies meanwhile
desc sleepy > "$T/sleepy.json"
J1=$("$NB" submit "$T/sleepy.json") || fail "submit sleepy 1"
J2=$("$NB" submit "$T/sleepy.json") || fail "submit sleepy 2"
P1=$("$NB" get "$J1" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')
P2=$("$NB" get "$J2" --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')
PGS="$P1 $P2"
for j in "$J1" "$J2"; do
  i=0; while [ "$(wc -l < "$T/work/$j/pids" 2>/dev/null || echo 0)" -lt 3 ]; do
    i=$((i+1)); [ $i -gt 200 ] && fail "job $j did not start"; sleep 0.05; done
done
kill -9 "$GW_PID"; wait "$GW_PID" 2>/dev/null; GW_PID=
kill -9 -"$P1"
sleep 0.2
start_gw
"$NB" get "$J1" --json > "$T/j1.json"
grep -q '"state": "failed"' "$T/j1.json" || fail "dead job not failed: $(cat "$T/j1.json")"
grep -q 'left no exit status' "$T/j1.json" || fail "dead job lacks its reason"
"$NB" get "$J2" | grep -q "state: *running" || fail "live job not running after restart"
"$NB" list --state running | grep -q "$J2" || fail "list --state running"
"$NB" cancel "$J2" --reason "test over" | grep -q "cancelled by alice: test over" || fail "cancel"
for p in $(cat "$T/work/$J2/pids"); do
  if [ -d /proc/$p ] && ! grep -q '^[^)]*) Z' /proc/$p/stat 2>/dev/null; then fail "pid $p survived cancel"; fi
done
"$NB" watch "$J2" >/dev/null; [ $? -eq 11 ] || fail "watch of a cancelled job: not 11"
# the health probe (grpc.health.v1 Check over mTLS with the config's own PKI)
"$NB" gateway --config "$T/gw.json" --check --address "127.0.0.1:$PORT" > "$T/h" 2>&1 ||
  fail "--check of a running gateway: $(cat "$T/h")"
grep -q "^dc-a at 127.0.0.1:$PORT: SERVING$" "$T/h" || fail "--check printed $(cat "$T/h")"
"$NB" gateway --config "$T/gw.json" --check --address "127.0.0.1:$PORT" --service nebula.v1.Gateway \
  > /dev/null 2>&1 || fail "--check --service nebula.v1.Gateway"
"$NB" gateway --config "$T/gw.json" --check --address "127.0.0.1:$PORT" --service no.such.Service \
  > /dev/null 2> "$T/h"; rc=$?
[ $rc -eq 1 ] && grep -q "unknown service 'no.such.Service'" "$T/h" || fail "--check of an unknown service: $rc $(cat "$T/h")"
"$NB" gateway --config "$T/gw.json" --check 2> "$T/h"; rc=$?
[ $rc -eq 1 ] && grep -q "port 0.*--address" "$T/h" || fail "--check of listen port 0: $rc $(cat "$T/h")"
"$NB" gateway --config "$T/gw.json" --check-config --address 127.0.0.1:1 2>/dev/null; [ $? -eq 2 ] ||
  fail "--address without --check"
# the store backed up while the gateway runs (docs/operations.md: sqlite3's .backup, the online
# backup API): a consistent copy with every job
if command -v sqlite3 >/dev/null 2>&1; then
  sqlite3 "$T/work/jobs.db" ".backup '$T/backup.db'" || fail "sqlite3 .backup of the live store"
  [ "$(sqlite3 "$T/backup.db" 'PRAGMA integrity_check')" = ok ] || fail "the backup is not intact"
  [ "$(sqlite3 "$T/backup.db" 'SELECT COUNT(*) FROM jobs')" = "$(sqlite3 "$T/work/jobs.db" 'SELECT COUNT(*) FROM jobs')" ] ||
    fail "the backup lacks jobs"
fi
kill -TERM "$GW_PID"; wait "$GW_PID"; rc=$?; GW_PID=
[ $rc -eq 0 ] || fail "gateway exit $rc on SIGTERM"
# nothing listening: a clear message and a non-zero exit
"$NB" gateway --config "$T/gw.json" --check --address "127.0.0.1:$PORT" --timeout 2 > /dev/null 2> "$T/h"; rc=$?
[ $rc -eq 1 ] && grep -q "^nebula gateway --check: dc-a at 127.0.0.1:$PORT: " "$T/h" ||
  fail "--check with nothing listening: $rc $(cat "$T/h")"
echo "gateway CLI: ok"
