#!/usr/bin/env python3
"""`nebula bench torch`: the PyTorch GPT of examples/torch/gpt.py three ways on the same tokens.

  single  one process on both clusters' data (batch of both), all threads of the machine
  ddp     PyTorch DDP with gloo, one rank per cluster, across the emulated link
  nebula  two clusters through the binding (nebula.torch.DiLoCo) across the same link,
          started by `nebula run` as a spec.program job

With --thin F the link's rate is set so that one dense int8 frame of the model takes F times a
round's compute (H steps of single's measured step time), ddp is skipped (hours at such a
rate), and nebula runs with values "auto" (the scheduler's codec points, adaptive) and decaying
error feedback: a user's own model on the thin link of `nebula bench e2e --thin`.

As root the link is deploy/wan's emulated one (two network namespaces, --rate-mbit each way,
--delay-ms one way) and the WAN bytes are what the link device sent; otherwise both run on
loopback without the link's delay (said in the output) and the bytes are counted. Prints one
line per run and the ratios, or one JSON object with --json. Exit 0 when every run succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPT = os.path.join(ROOT, "examples", "torch", "gpt.py")


def log(msg: str) -> None:
    print("bench torch: " + msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def model_args(a, seed: int) -> list[str]:
    return ["--steps", str(a.steps), "--sync-every", str(a.sync_every), "--layers",
            str(a.layers), "--width", str(a.width), "--context", str(a.context), "--batch",
            str(a.batch), "--seed", str(seed), "--data-dir", a.data_dir, "--langs", a.langs]


def run_checked(cmd, log_path, env=None) -> None:
    with open(log_path, "w") as lf:
        p = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    if p.returncode != 0:
        with open(log_path) as lf:
            tail = lf.read()[-2000:]
        raise RuntimeError(f"{cmd[0]} {' '.join(cmd[1:3])}... exited {p.returncode}; "
                           f"{log_path}:\n{tail}")


def run_single(a, seed: int, out: str, env: dict) -> dict:
    os.makedirs(out, exist_ok=True)
    e = dict(env, OMP_NUM_THREADS=str(a.threads))
    run_checked([sys.executable, GPT, "--mode", "single", "--out-dir", out] + model_args(a, seed),
                os.path.join(out, "single.log"), e)
    return read(os.path.join(out, "torch-summary-single.json"))


def thin_rate_mbit(a, single: dict) -> float:
    """The rate at which one dense int8 frame (a byte per parameter and an fp32 scale per 256)
    takes a.thin x one round's compute (H steps at single's mean step time)."""
    frame_bytes = single["params"] * (1 + 4 / 256)
    round_s = single["wall_s"] / single["steps"] * a.sync_every
    return frame_bytes * 8 / (a.thin * round_s) / 1e6


def run_nebula(a, seed: int, out: str, env: dict, netns: bool,
               rate_mbit: float | None = None) -> list[dict]:
    os.makedirs(out, exist_ok=True)
    rate = a.rate_mbit if rate_mbit is None else rate_mbit
    job = {
        "apiVersion": "nebula/v1", "kind": "TrainingJob",
        "metadata": {"name": f"bench-torch-{seed}"},
        "spec": {
            "clusters": [{"id": "dc-a"}, {"id": "dc-b"}],
            "program": {"command": [sys.executable, GPT, "--overlap", str(a.overlap)] +
                        (["--land-early"] if a.land_early else []) + model_args(a, seed)},
            "sync": {"innerSteps": a.sync_every, "eager": not a.no_eager,
                     "outer": {"lr": a.outer_lr, "momentum": a.outer_momentum}},
            # the point given, every round: the descriptor's default adaptive density would
            # let the scheduler move it (with blocking rounds of a fraction of a second, whose
            # budget one round trip fills, to its floor)
            "compression": {"density": {"initial": a.density, "max": a.density},
                            "adaptive": False, "values": a.values,
                            "topkChunk": a.topk_chunk},
            "link": {"rateMbit": rate, "delayMs": a.delay_ms if netns else 0},
        },
    }
    if a.thin:  # the scheduler picks whole codec points for the measured link
        job["spec"]["compression"] = {"values": "auto", "adaptive": True,
                                      "density": {"initial": 0.03, "min": 0.0001, "max": 1}}
    if a.ef_decay is not None:
        job["spec"]["compression"]["errorFeedbackDecay"] = a.ef_decay
    desc = os.path.join(out, "job.json")
    with open(desc, "w") as f:
        json.dump(job, f, indent=1)
    run = os.path.join(out, "run")
    shutil.rmtree(run, ignore_errors=True)
    cmd = [a.nebula, "run", desc, "--out", run] + (["--netns"] if netns else ["--loopback"])
    run_checked(cmd, os.path.join(out, "nebula-run.log"), env)
    return [read(os.path.join(run, c, f"torch-summary-{c}.json")) for c in ("dc-a", "dc-b")]


def wan(script: str, *args) -> str:
    wan_dir = os.environ.get("NB_WAN_DIR") or os.path.join(ROOT, "deploy", "wan")
    p = subprocess.run(["bash", os.path.join(wan_dir, script), *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{script}: {p.stderr.strip()[-1000:]}")
    return p.stdout


def run_ddp(a, seed: int, out: str, env: dict, netns: bool) -> list[dict]:
    os.makedirs(out, exist_ok=True)
    prefix = f"nbt{os.getpid() % 100000}"
    spec = {}
    if netns:
        for line in wan("wan-up.sh", "--prefix", prefix, "--rate-mbit", str(a.rate_mbit),
                        "--delay-ms", str(a.delay_ms)).splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                spec[k.strip()] = v.strip().strip("'\"")
    procs = []
    try:
        addr = spec.get("NB_WAN_ADDR_A", "127.0.0.1")
        port = free_port()
        for rank, ns in enumerate((spec.get("NB_WAN_NS_A"), spec.get("NB_WAN_NS_B"))):
            e = dict(env, OMP_NUM_THREADS=str(max(1, a.threads // 2)), MASTER_ADDR=addr,
                     MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
            if netns:
                e["GLOO_SOCKET_IFNAME"] = "wan0"
            cmd = [sys.executable, GPT, "--mode", "ddp", "--out-dir", out] + model_args(a, seed)
            if netns:
                cmd = ["ip", "netns", "exec", ns] + cmd
            lf = open(os.path.join(out, f"rank{rank}.log"), "w")
            procs.append((subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=e,
                                           start_new_session=True), lf))
        bad = []
        for rank, (p, lf) in enumerate(procs):
            if p.wait() != 0:
                bad.append(rank)
            lf.close()
        if bad:
            raise RuntimeError(f"ddp rank(s) {bad} failed; see {out}/rank*.log")
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if netns:
            wan("wan-down.sh", "--prefix", prefix)
    return [read(os.path.join(out, f"torch-summary-rank{r}.json")) for r in (0, 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="nebula bench torch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=400, help="inner steps per cluster")
    ap.add_argument("--sync-every", type=int, default=8, help="H of the nebula run")
    ap.add_argument("--overlap", type=int, default=0, help="overlap_steps of the nebula run")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="per cluster and step")
    ap.add_argument("--values", default="2bit", help="the nebula run's value codec (dense, with "
                    "error feedback)")
    ap.add_argument("--density", type=float, default=1.0,
                    help="the nebula run's top-k density (default 1: dense frames)")
    ap.add_argument("--topk-chunk", type=int, default=0,
                    help="chunked top-k: 0 (whole vector) or a power of two in [16, 65536]")
    ap.add_argument("--ef-decay", type=float, default=None,
                    help="error-feedback decay beta in (0, 1] (default: the job's, 1)")
    ap.add_argument("--land-early", action="store_true",
                    help="the nebula run lands each overlapped round as soon as its exchange is "
                         "over, --overlap steps at the latest (DiLoCo's land_early; on with "
                         "--thin)")
    ap.add_argument("--no-eager", action="store_true",
                    help="overlapped sparse rounds train on from their own values (sync.eager "
                    "false) instead of the predicted landing")
    ap.add_argument("--outer-lr", type=float, default=0.8)
    ap.add_argument("--outer-momentum", type=float, default=0.5)
    ap.add_argument("--rate-mbit", type=float, default=100)
    ap.add_argument("--delay-ms", type=float, default=25)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="the machine's share: single's threads, half each per cluster")
    ap.add_argument("--skip", default="", help="runs to leave out, e.g. ddp")
    ap.add_argument("--loopback", action="store_true", help="loopback even as root")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "data", "quick"))
    ap.add_argument("--langs", default="en,de,fr,es;en,ru,zh,fa",
                    help="languages of dc-a;dc-b (single trains on both)")
    ap.add_argument("--out", default=os.path.join("runs", "bench-torch"))
    ap.add_argument("--nebula", default=os.environ.get("NEBULA_EXE", "nebula"))
    ap.add_argument("--thin", type=float, default=0,
                    help="F > 0: the link's rate so that a dense int8 frame takes F rounds of "
                    "compute; ddp skipped, nebula with values auto (default 0: --rate-mbit)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for k in ("seeds", "steps", "sync_every", "layers", "width", "context", "batch", "threads"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if not 0 <= a.overlap < a.sync_every:
        ap.error("--overlap must be in [0, --sync-every)")
    if not 0 < a.density <= 1:
        ap.error("--density must be in (0, 1]")
    if a.ef_decay is not None and not 0 < a.ef_decay <= 1:
        ap.error("--ef-decay must be in (0, 1]")
    skip = {s for s in a.skip.split(",") if s}
    if skip - {"ddp", "single"}:
        ap.error(f"--skip: unknown run(s) {sorted(skip - {'ddp', 'single'})}")
    if a.thin < 0 or (a.thin and "single" in skip):
        ap.error("--thin must be > 0 and needs the single run (it measures the step time)")
    if a.thin:
        skip.add("ddp")  # hours at a thin rate
        a.land_early = True  # the scheduler's points assume the landing the link allows
        if a.ef_decay is None:
            a.ef_decay = 0.85  # the thin link's points were measured with decay (docs/hybrid.md)
    try:
        import torch  # noqa: F401
    except ImportError:
        log("PyTorch is not installed (scripts/setup.sh installs it): nothing to measure")
        return 77
    netns = os.geteuid() == 0 and not a.loopback and a.delay_ms > 0
    rate = f"--thin {a.thin:g}'s rate (per seed)" if a.thin else f"{a.rate_mbit:g} Mbit/s"
    link = (f"emulated {rate}, {a.delay_ms:g} ms one way (network namespaces)"
            if netns else f"loopback (no delay; nebula capped at {rate}; ddp uncapped)")
    log("link: " + link)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""), PYTHONDONTWRITEBYTECODE="1")
    results = []
    ok = True
    for seed in range(1, a.seeds + 1):
        r = {"seed": seed}
        base = os.path.join(a.out, f"seed{seed}")
        try:
            rate = None
            if "single" not in skip:
                r["single"] = run_single(a, seed, os.path.join(base, "single"), env)
                if a.thin:
                    rate = r["rate_mbit"] = thin_rate_mbit(a, r["single"])
                    log(f"seed {seed}: --thin {a.thin:g}: {rate:.4f} Mbit/s")
            neb = run_nebula(a, seed, os.path.join(base, "nebula"), env, netns, rate)
            r["nebula"] = {
                "wall_s": max(s["wall_s"] for s in neb),
                "final_eval_loss": neb[0]["final_eval_loss"],
                "wan_bytes": sum(s["wan_bytes"] for s in neb),
                "compute_utilization": min(s["compute_utilization"] for s in neb),
                "binding_overhead": max(s["binding_overhead"] or 0 for s in neb),
                "same_hash": neb[0]["global_xxh3"] == neb[1]["global_xxh3"],
                "rounds": min(s["rounds"] for s in neb),
                # frames' bytes as the clusters counted them, per parameter and round
                "bits_per_param_per_sync": 8 * sum(s["wan_bytes_counted"] for s in neb) / max(
                    1, len(neb) * neb[0]["params"] * max(1, min(s["rounds"] for s in neb))),
            }
            if "ddp" not in skip:
                d = run_ddp(a, seed, os.path.join(base, "ddp"), env, netns)
                r["ddp"] = {"wall_s": max(s["wall_s"] for s in d),
                            "final_eval_loss": d[0]["final_eval_loss"],
                            "wan_bytes": sum(s["wan_bytes"] for s in d),
                            "compute_utilization": min(s["compute_utilization"] for s in d)}
        except (RuntimeError, OSError, KeyError, json.JSONDecodeError) as e:
            log(f"seed {seed}: {e}")
            r["error"] = str(e)
            ok = False
        if "single" in r and "nebula" in r:
            r["nebula_vs_single_loss"] = r["nebula"]["final_eval_loss"] / \
                r["single"]["final_eval_loss"]
            r["nebula_vs_single_time"] = r["nebula"]["wall_s"] / r["single"]["wall_s"]
        if "ddp" in r and "nebula" in r and r["nebula"]["wan_bytes"] > 0:
            r["ddp_over_nebula_bytes"] = r["ddp"]["wan_bytes"] / r["nebula"]["wan_bytes"]
        results.append(r)
        if not a.json:
            for k in ("single", "ddp", "nebula"):
                if k in r:
                    x = r[k]
                    print(f"seed {seed} {k:7s} wall {x['wall_s']:7.1f} s  eval loss "
                          f"{x['final_eval_loss']:.4f}  WAN {x.get('wan_bytes', 0) / 1e6:9.3f} MB"
                          f"  util {x.get('compute_utilization', 1):.3f}")
            for k in ("nebula_vs_single_loss", "nebula_vs_single_time", "ddp_over_nebula_bytes"):
                if k in r:
                    print(f"seed {seed} {k} {r[k]:.4f}")
            if "nebula" in r:
                print(f"seed {seed} binding_overhead {r['nebula']['binding_overhead']:.4f}")
                print(f"seed {seed} bits_per_param_per_sync "
                      f"{r['nebula']['bits_per_param_per_sync']:.4f}")
            if "rate_mbit" in r:
                print(f"seed {seed} rate_mbit {r['rate_mbit']:.4f}")

    def mean(k, sub=None):
        v = [(r[sub][k] if sub else r[k]) for r in results if (sub in r if sub else k in r)]
        return statistics.fmean(v) if v else None

    out = {
        "link": link, "netns": netns, "steps": a.steps, "sync_every": a.sync_every,
        "overlap": a.overlap, "land_early": a.land_early, "values": a.values,
        "density": a.density,
        "topk_chunk": a.topk_chunk, "ef_decay": a.ef_decay, "eager": not a.no_eager,
        "thin": a.thin, "bits_per_param_per_sync": mean("bits_per_param_per_sync", "nebula"),
        "seeds": a.seeds,
        "nebula_vs_single_loss": mean("nebula_vs_single_loss"),
        "nebula_vs_single_time": mean("nebula_vs_single_time"),
        "ddp_over_nebula_bytes": mean("ddp_over_nebula_bytes"),
        "binding_overhead": mean("binding_overhead", "nebula"),
        "runs": results,
    }
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for k in ("nebula_vs_single_loss", "nebula_vs_single_time", "ddp_over_nebula_bytes",
                  "binding_overhead"):
            if out[k] is not None:
                print(f"mean {k} {out[k]:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
