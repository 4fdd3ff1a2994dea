#!/usr/bin/env python3
"""deploy/k8s checked offline: every manifest against the Kubernetes 1.37 schema (the PyPI
package kubernetes-validate, strict: unknown fields are errors), a broken copy refused (the check
bites), and what the files must agree on: the ConfigMap's gateway.json passes `nebula gateway
--check-config`, every probe runs `nebula gateway --check` on the mounted config, the volumes
for the job store, config and PKI are there, and the ports of exchange.port_range are each a
container port and a port of the public Service. Exits 77 (skipped) without kubernetes-validate.

usage: test_k8s_manifests.py NEBULA K8S_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import kubernetes_validate  # noqa: F401
    import yaml
except ImportError as e:
    print(f"SKIP: {e.name} not installed (scripts/setup.sh installs kubernetes-validate)")
    sys.exit(77)

NEBULA, K8S = sys.argv[1], sys.argv[2]
VERSION = "1.37.0"


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def validate(path):
    """The kubernetes-validate command's exit status and output for one file."""
    r = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", VERSION, path],
        capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


files = sorted(f for f in os.listdir(K8S) if f.endswith(".yaml"))
for want in ("configmap.yaml", "secret.yaml", "service.yaml", "statefulset.yaml"):
    if want not in files:
        fail(f"deploy/k8s/{want} missing")
docs = {}
for f in files:
    rc, out = validate(os.path.join(K8S, f))
    print(out)
    if rc != 0:
        fail(f"{f} does not validate against Kubernetes {VERSION}")
    with open(os.path.join(K8S, f)) as fh:
        for d in yaml.safe_load_all(fh):
            docs[(d["kind"], d["metadata"]["name"])] = d

# the validator refuses a field the schema does not have
with open(os.path.join(K8S, "statefulset.yaml")) as fh:
    text = fh.read()
with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "bad.yaml")
    with open(bad, "w") as fh:
        fh.write(text.replace("containerPort:", "containerPorts:", 1))
    rc, out = validate(bad)
    if rc == 0:
        fail(f"a StatefulSet with 'containerPorts' passed: {out}")

    cm = docs[("ConfigMap", "nebula-gateway-config")]
    conf_text = cm["data"]["gateway.json"]
    conf = json.loads(conf_text)
    path = os.path.join(tmp, "gateway.json")
    with open(path, "w") as fh:
        fh.write(conf_text)
    r = subprocess.run([NEBULA, "gateway", "--config", path, "--check-config"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"the ConfigMap's gateway.json is refused: {r.stderr.strip()}")

sts = docs[("StatefulSet", "nebula-gateway")]
if sts["spec"]["replicas"] != 1:
    fail("the gateway's StatefulSet must have one replica (one SQLite writer)")
pod = sts["spec"]["template"]["spec"]
c = pod["containers"][0]
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
config_path = mounts["config"] + "/gateway.json"
for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
    cmd = c[probe]["exec"]["command"]
    if cmd[:4] != ["nebula", "gateway", "--config", config_path] or "--check" not in cmd:
        fail(f"{probe} does not run nebula gateway --check on {config_path}: {cmd}")
vols = {v["name"]: v for v in pod["volumes"]}
if vols["config"]["configMap"]["name"] != "nebula-gateway-config":
    fail("the config volume is not the ConfigMap")
if vols["pki"]["secret"]["secretName"] != "nebula-gateway-pki":
    fail("the pki volume is not the Secret")
for k in ("ca", "cert", "key"):
    if not conf["tls"][k].startswith(mounts["pki"] + "/"):
        fail(f"tls.{k} {conf['tls'][k]} is not in the Secret's mount {mounts['pki']}")
claims = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
if "state" not in claims:
    fail("no volume claim for the job store and work folder")
for k in ("work_dir", "store"):
    if not conf[k].startswith(mounts["state"] + "/"):
        fail(f"{k} {conf[k]} is not on the state volume {mounts['state']}")

lo, hi = (int(x) for x in conf["exchange"]["port_range"].split("-"))
cports = {p["containerPort"] for p in c["ports"]}
svc = docs[("Service", "nebula-gateway-public")]
sports = {p["port"] for p in svc["spec"]["ports"]}
gw_port = int(conf["listen"].rsplit(":", 1)[1])
for p in list(range(lo, hi + 1)) + [gw_port]:
    if p not in cports:
        fail(f"port {p} is not a container port")
    if p not in sports:
        fail(f"port {p} is not a port of the public Service")
if int(conf["metrics"]["listen"].rsplit(":", 1)[1]) in sports:
    fail("the metrics port is on the public Service")
print(f"k8s manifests: ok ({len(files)} files, Kubernetes {VERSION}, exchange ports {lo}-{hi})")
