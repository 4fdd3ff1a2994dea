#!/usr/bin/env bash
# Two datacenters, each with its own gateway, federated: (1) the multilingual pretraining job
# (jobs/examples/pretrain-2dc-small.json) submitted at dc-a runs across dc-a and dc-b and is
# watched live at dc-a; (2) a translation fine-tune submitted at dc-a runs in dc-b from (1)'s
# checkpoint, which dc-b's gateway fetches from dc-a by content hash. As root the gateways run in
# two network namespaces joined by deploy/wan's emulated 100 Mbit/s, 25 ms link; otherwise both
# on loopback with the jobs' link.rateMbit cap. Prints a results table and leaves no process or
# namespace behind (the files stay in the work folder it prints). Not a test: no assertions.
#
#   scripts/demo-gateways.sh [BUILD_DIR]
#   NB_DEMO_STEPS=N     override training.maxSteps of both jobs (a quick look)
#   NB_DEMO_FT_STEPS=N  training.maxSteps of the fine-tune (default 200: a few minutes on 2 cores)
#   NB_DEMO_SENTENCES=N test sentences per pair translated for chrF/BLEU (default 8)
#   NB_DEMO_DATA=DIR    data folder (default data/quick)
#   NB_DEMO_WORK=DIR    work folder (default a fresh one under $TMPDIR)
#   NB_DEMO_LOOPBACK=1  loopback even as root
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$src/build}" && pwd)"
nebula="$build/nebula"
data="$(cd "${NB_DEMO_DATA:-$src/data/quick}" && pwd)"
work="${NB_DEMO_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/nb-demo-gw.XXXXXX")}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
steps="${NB_DEMO_STEPS:-}"
ft_steps="${NB_DEMO_FT_STEPS:-${NB_DEMO_STEPS:-200}}"
sentences="${NB_DEMO_SENTENCES:-8}"
prefix="nbgw-$$"
ns_mode=0
if [ "$(id -u)" = 0 ] && [ -z "${NB_DEMO_LOOPBACK:-}" ]; then ns_mode=1; fi

gw_pids=()
jobs_submitted=()
pre_a=()
on_a() { "${pre_a[@]}" "$@"; } # runs a command on dc-a's side
cleanup() {
  set +e
  # jobs keep running when a gateway stops: cancel what is still running first
  for j in "${jobs_submitted[@]}"; do
    on_a "$nebula" cancel "$j" --reason "demo cleanup" > /dev/null 2>&1
  done
  for p in "${gw_pids[@]}"; do kill -TERM "$p" 2> /dev/null; done
  for p in "${gw_pids[@]}"; do wait "$p" 2> /dev/null; done
  if [ "$ns_mode" = 1 ]; then "$src/deploy/wan/wan-down.sh" --prefix "$prefix" > /dev/null 2>&1; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$ns_mode" = 1 ]; then
  echo "== the WAN: namespaces $prefix-a / $prefix-b, 100 Mbit/s each way, 25 ms one way =="
  eval "$("$src/deploy/wan/wan-up.sh" --prefix "$prefix" --rate-mbit 100 --delay-ms 25)"
  host_a="$NB_WAN_ADDR_A" host_b="$NB_WAN_ADDR_B"
  pre_a=(ip netns exec "$NB_WAN_NS_A")
  pre_b=(ip netns exec "$NB_WAN_NS_B")
  port_a=7070 port_b=7070
else
  echo "== loopback (not root, or NB_DEMO_LOOPBACK): the jobs' link.rateMbit caps each link =="
  host_a=127.0.0.1 host_b=127.0.0.1
  pre_a=()
  pre_b=()
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  port_a=$(free_port) port_b=$(free_port)
fi

echo "== PKI: a federation CA, a certificate per gateway, one for the researcher =="
pki="$work/pki"
"$nebula" certs init --dir "$pki" --force > /dev/null
"$nebula" certs issue --dir "$pki" --cluster dc-a --san "$host_a" --force > /dev/null
"$nebula" certs issue --dir "$pki" --cluster dc-b --san "$host_b" --force > /dev/null
"$nebula" certs issue --dir "$pki" --user alice --force > /dev/null

gw_config() { # id host port peer peer_addr slots
  cat > "$work/gw-$1.json" << EOF
{"cluster_id": "$1", "listen": "$2:$3",
 "tls": {"ca": "$pki/ca.crt", "cert": "$pki/clusters/$1.crt", "key": "$pki/clusters/$1.key"},
 "peers": {"$4": "$5"},
 "command": ["nebula", "train", "{descriptor}", "--out", "{jobdir}/out", "--data-dir", "$data"],
 "worker_command": ["nebula", "worker", "--job", "{descriptor}", "--cluster", "{cluster}",
   "--out", "{jobdir}/out", "--listen", "{listen}", "{peers}", "--pki", "{pki}",
   "--secret-file", "{secret_file}", "--data-dir", "$data"],
 "exchange_host": "$2", "resources": {"slots": $6}, "work_dir": "$work/gw-$1",
 "acl": [{"user": "alice"}], "federation_timeout_ms": 30000, "poll_ms": 100}
EOF
}
gw_config dc-a "$host_a" "$port_a" dc-b "$host_b:$port_b" 2
gw_config dc-b "$host_b" "$port_b" dc-a "$host_a:$port_a" 2

echo "== two gateways: dc-a on $host_a:$port_a, dc-b on $host_b:$port_b =="
"${pre_a[@]}" "$nebula" gateway --config "$work/gw-dc-a.json" > "$work/gw-dc-a.log" 2>&1 &
gw_pids+=($!)
"${pre_b[@]}" "$nebula" gateway --config "$work/gw-dc-b.json" > "$work/gw-dc-b.log" 2>&1 &
gw_pids+=($!)
for f in "$work/gw-dc-a.log" "$work/gw-dc-b.log"; do
  for _ in $(seq 100); do grep -q "^listening on" "$f" && break; sleep 0.1; done
  grep -q "^listening on" "$f" || { cat "$f"; echo "a gateway did not start" >&2; exit 1; }
done

export NB_GATEWAY="$host_a:$port_a" NB_CA="$pki/ca.crt" NB_CERT="$pki/users/alice.crt" \
  NB_KEY="$pki/users/alice.key"

# (1) the pretraining job, as in the examples (maxSteps overridden with NB_DEMO_STEPS)
python3 - "$src/jobs/examples/pretrain-2dc-small.json" "$work/pretrain.json" "$steps" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
if sys.argv[3]:
    d["spec"]["training"]["maxSteps"] = int(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"), indent=2)
EOF
echo
echo "== 1/2  pretraining across dc-a and dc-b, submitted at dc-a =="
t0=$(date +%s.%N)
job1=$(on_a "$nebula" submit "$work/pretrain.json")
jobs_submitted+=("$job1")
echo "job $job1"
rc=0
on_a "$nebula" watch "$job1" || rc=$?
t1=$(date +%s.%N)
[ "$rc" = 0 ] || { echo "job $job1 did not succeed (watch exit $rc)" >&2; exit 1; }
on_a "$nebula" watch "$job1" --json > "$work/job1-events.jsonl"

# the pretrained checkpoint as dc-a keeps it: its content hash pins the fine-tune's base
hash=""
for _ in $(seq 100); do
  on_a "$nebula" watch "$job1" --json > "$work/job1-events.jsonl"
  hash=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    p = e.get("payload") or {}
    n, want = p.get("name", ""), "pretrain-2dc-small/final.safetensors"
    # artifacts live in their owner'"'"'s namespace: "alice/pretrain-2dc-small/..."
    if e["kind"] == "artifact" and (n == want or n.endswith("/" + want)):
        print(p["sha256"])' "$work/job1-events.jsonl" | tail -1)
  [ -n "$hash" ] && break
  sleep 0.2
done
[ -n "$hash" ] || { echo "dc-a kept no final checkpoint of $job1" >&2; exit 1; }

# (2) the translation fine-tune of the examples, on (1)'s model, run in dc-b
python3 - "$src/jobs/examples/finetune-translation-remote.json" "$work/pretrain.json" \
  "$work/finetune.json" "$hash" "$ft_steps" "$sentences" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
pre = json.load(open(sys.argv[2]))
m = pre["spec"]["model"]
d["metadata"]["name"] = "finetune-translation-demo"
d["spec"]["model"] = dict(m, base={"checkpoint": "pretrain-2dc-small/final.safetensors",
                                   "cluster": "dc-a", "sha256": sys.argv[4]})
t = d["spec"]["training"]
t["maxSteps"] = int(sys.argv[5])
t["eval"]["sentences"] = int(sys.argv[6])
t["eval"]["everyRounds"] = max(t["eval"].get("everyRounds", 1), 2)
t["optimizer"]["warmupSteps"] = min(t["optimizer"].get("warmupSteps", 0), int(sys.argv[5]) // 4)
t["optimizer"]["lr"] = 0.003  # a short fine-tune of the small demo model needs a larger step
d["spec"]["sync"]["innerSteps"] = max(1, min(d["spec"]["sync"]["innerSteps"], int(sys.argv[5])))
d["spec"]["checkpoint"] = {"everyRounds": 0}
json.dump(d, open(sys.argv[3], "w"), indent=2)
EOF
echo
echo "== 2/2  translation fine-tune in dc-b from (1)'s checkpoint, submitted at dc-a =="
t2=$(date +%s.%N)
job2=$(on_a "$nebula" submit "$work/finetune.json")
jobs_submitted+=("$job2")
echo "job $job2"
rc=0
on_a "$nebula" watch "$job2" || rc=$?
t3=$(date +%s.%N)
[ "$rc" = 0 ] || { echo "job $job2 did not succeed (watch exit $rc)" >&2; exit 1; }
# dc-b reports the outputs it kept right after its final state: wait for the final model
for _ in $(seq 100); do
  on_a "$nebula" watch "$job2" --json > "$work/job2-events.jsonl"
  grep -q '"cluster_artifact".*final.safetensors' "$work/job2-events.jsonl" && break
  sleep 0.2
done

echo
echo "== results =="
python3 - "$work" "$job1" "$job2" "$t0" "$t1" "$t2" "$t3" "$ns_mode" << 'EOF'
import json, os, sys
work, job1, job2 = sys.argv[1:4]
t0, t1, t2, t3 = map(float, sys.argv[4:8])
ns = sys.argv[8] == "1"
def summary(cluster, job):
    for sub in ("out/summary.json", "summary.json"):
        p = os.path.join(work, "gw-" + cluster, job, sub)
        if os.path.exists(p):
            return json.load(open(p))
    return {}
def events(n):
    return [json.loads(l) for l in open(os.path.join(work, "job%d-events.jsonl" % n))]
print("link: %s" % ("namespaces, emulated 100 Mbit/s / 25 ms" if ns else "loopback, rate cap"))
print("%-38s %-6s %-10s %8s %10s %12s %18s" % ("job", "where", "state", "wall s", "eval bpb",
                                               "WAN MB sent", "theta xxh3"))
for c in ("dc-a", "dc-b"):
    s = summary(c, job1)
    print("%-38s %-6s %-10s %8.1f %10.4f %12.2f %18s" % (
        job1, c, "succeeded", t1 - t0, s.get("final_eval_mean_bpb", float("nan")),
        s.get("wan_bytes_sent", 0) / 1e6, s.get("global_xxh3", "-")))
s = summary("dc-b", job2)
bpb = s.get("final_eval_mean_bpb", s.get("final_mean_bpb", float("nan")))
print("%-38s %-6s %-10s %8.1f %10.4f %12s %18s" % (job2, "dc-b", "succeeded", t3 - t2,
                                                  bpb if isinstance(bpb, float) else float("nan"),
                                                  "-", "-"))
for e in events(2):
    p = e.get("payload") or {}
    if e["kind"] == "cluster_fetch":
        print("base checkpoint fetched by dc-b from %s: sha256 %s..., %.2f MB in %.2f s" % (
            p.get("from"), p.get("sha256", "")[:16], p.get("size", 0) / 1e6, p.get("seconds", 0)))
    if e["kind"] == "cluster_artifact":
        print("kept at dc-b: %s (%d bytes)" % (p.get("name"), p.get("size", 0)))
tr = s.get("translation") or {}
if tr:
    print()
    print("translation quality of the fine-tune in dc-b (greedy decoding of test sentences):")
    print("%-8s %9s %10s %11s %10s %11s" % ("pair", "sentences", "chrF base", "chrF final",
                                           "BLEU base", "BLEU final"))
    for pair in sorted(tr):
        v = tr[pair]
        b, f = v.get("base") or {}, v.get("final") or {}
        print("%-8s %9d %10.2f %11.2f %10.2f %11.2f" % (pair, v.get("sentences", 0),
              b.get("chrf", float("nan")), f.get("chrf", float("nan")),
              b.get("bleu", float("nan")), f.get("bleu", float("nan"))))
print()
for job in (job1, job2):
    r = os.path.join(work, "gw-dc-a", job, "report", "report.html")
    print("report of %s at dc-a (where it was submitted): %s" % (job, r if os.path.exists(r)
                                                                 else "(not written)"))
print("work folder: %s (gateway logs gw-*.log, job folders gw-*/<job>/)" % work)
EOF
