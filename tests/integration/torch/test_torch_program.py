"""examples/torch/gpt.py as a nebula job: `nebula run` starts it once per cluster with the
NEBULA_* environment (spec.program), the clusters train through nebula.torch.DiLoCo and end on
one theta_global; the refusals a user meets; `nebula bench torch --json` on a tiny shape. All on
loopback; every process is gone when a case ends (nebula run stops its children)."""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GPT = os.path.join(ROOT, "examples", "torch", "gpt.py")
NEBULA = os.environ.get("NEBULA_EXE", "nebula")
DATA = os.environ.get("NB_TEST_DATA", os.path.join(ROOT, "tests", "unit", "trainer", "data"))
TINY = ["--layers", "1", "--width", "32", "--heads", "2", "--context", "32", "--batch", "2",
        "--langs", "en,de;ru,zh", "--data-dir", DATA, "--eval-windows", "2"]

try:
    import torch  # noqa: F401
except ImportError:
    print("torch is not installed (scripts/setup.sh installs it): skipped")
    sys.exit(77)


def job(command, name="torch-tiny", values="int8", extra=None):
    spec = {
        "clusters": [{"id": "dc-a"}, {"id": "dc-b"}],
        "program": {"command": command},
        "sync": {"innerSteps": 4, "outer": {"lr": 0.7, "momentum": 0.5}},
        "compression": {"density": {"initial": 1, "max": 1}, "values": values},
    }
    spec.update(extra or {})
    return {"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": spec}


class ProgramJob(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="nb-torch-")
        self.tmp = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def run_job(self, desc, *args, timeout=300):
        path = os.path.join(self.tmp, "job.json")
        with open(path, "w") as f:
            json.dump(desc, f)
        return subprocess.run([NEBULA, "run", path, "--out", os.path.join(self.tmp, "run"),
                               "--loopback", *args], capture_output=True, text=True,
                              timeout=timeout)

    def test_two_clusters_one_theta(self):
        p = self.run_job(job([sys.executable, GPT, "--steps", "8"] + TINY))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("theta_global identical on every cluster", p.stdout)
        sums, lines = [], []
        for c in ("dc-a", "dc-b"):
            d = os.path.join(self.tmp, "run", c)
            with open(os.path.join(d, f"torch-summary-{c}.json")) as f:
                sums.append(json.load(f))
            with open(os.path.join(d, "progress.jsonl")) as f:
                lines.append([json.loads(x) for x in f])
        self.assertEqual(sums[0]["global_xxh3"], sums[1]["global_xxh3"])
        self.assertEqual(sums[0]["final_eval_loss"], sums[1]["final_eval_loss"])
        self.assertTrue(math.isfinite(sums[0]["final_eval_loss"]))
        self.assertEqual([s["rounds"] for s in sums], [2, 2])  # 8 steps, H 4
        self.assertEqual([s["langs"] for s in sums], [["en", "de"], ["ru", "zh"]])
        # one progress line per round, the last one's hash the summary's
        self.assertEqual([len(x) for x in lines], [2, 2])
        self.assertEqual(lines[0][-1]["global_xxh3"], sums[0]["global_xxh3"])
        # gpt.py gives DiLoCo.step its loss: each round's mean is in its progress line
        for x in lines:
            for ln in x:
                self.assertTrue(math.isfinite(ln["loss"]) and ln["loss"] > 0, ln)
        self.assertGreater(sums[0]["wan_bytes_counted"], 0)

    def test_relative_out(self):
        """--out relative to where nebula run is started, the descriptor in another folder: the
        program runs in the descriptor's folder, and the PKI, secret and progress paths its
        environment names still lead to the run folder (they were relative to nebula run's)."""
        os.mkdir(os.path.join(self.tmp, "jobs"))
        path = os.path.join(self.tmp, "jobs", "job.json")
        with open(path, "w") as f:
            json.dump(job([sys.executable, GPT, "--steps", "4"] + TINY), f)
        p = subprocess.run([NEBULA, "run", os.path.join("jobs", "job.json"), "--out", "run",
                            "--loopback"], capture_output=True, text=True, timeout=300,
                           cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("theta_global identical on every cluster", p.stdout)
        for c in ("dc-a", "dc-b"):
            self.assertTrue(os.path.exists(os.path.join(self.tmp, "run", c, "progress.jsonl")), c)

    def test_program_failure_stops_the_job(self):
        # the program refuses its arguments (exit 2): the run fails naming the cluster and
        # stops every other
        p = self.run_job(job([sys.executable, GPT, "--steps", "8"] + TINY + ["--width", "0"]))
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"cluster dc-[ab] failed \(exit 2")

    def test_missing_command(self):
        p = self.run_job(job(["nebula-no-such-program"]))
        self.assertNotEqual(p.returncode, 0)
        log = open(os.path.join(self.tmp, "run", "dc-a", "worker.log")).read()
        self.assertIn("cannot run nebula-no-such-program", log)

    def test_worker_options_refused(self):
        p = self.run_job(job([sys.executable, GPT]), "--steps", "5")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("$.spec.program", p.stderr)

    def test_program_outside_nebula(self):
        # the example refuses --mode nebula without the environment, naming what to do
        p = subprocess.run([sys.executable, GPT, "--steps", "1"] + TINY, capture_output=True,
                           text=True, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("NEBULA_CLUSTER")})
        self.assertEqual(p.returncode, 2)
        self.assertIn("NEBULA_* environment", p.stderr)


def have_hf():
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(have_hf(), "transformers or peft not installed (scripts/setup.sh pins them)")
class LoraJob(ProgramJob):
    """examples/torch/t5_lora.py: only the LoRA adapters are registered and cross the WAN."""

    test_two_clusters_one_theta = test_program_failure_stops_the_job = None
    test_missing_command = test_worker_options_refused = test_program_outside_nebula = None

    def test_only_adapters_cross(self):
        t5 = os.path.join(ROOT, "examples", "torch", "t5_lora.py")
        p = self.run_job(job([sys.executable, t5, "--steps", "4", "--sync-every", "2",
                              "--d-model", "32", "--layers", "1", "--lora-rank", "2",
                              "--batch", "2", "--max-bytes", "24", "--eval-sentences", "2",
                              "--data-dir", DATA], name="t5-lora-tiny"))
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        self.assertIn("theta_global identical on every cluster", p.stdout)
        sums = []
        for c in ("dc-a", "dc-b"):
            with open(os.path.join(self.tmp, "run", c, f"t5-summary-{c}.json")) as f:
                sums.append(json.load(f))
        s0 = sums[0]
        self.assertEqual(s0["global_xxh3"], sums[1]["global_xxh3"])
        self.assertEqual(s0["rounds"], 2)
        self.assertTrue(s0["synced"])
        self.assertTrue(all("lora_" in nm for nm in s0["synced"]), s0["synced"])
        self.assertLess(s0["adapter_params"], s0["model_params"] / 10)
        # int8 frames of the adapters: about a byte per adapter parameter per round, never the
        # base model's (a byte each of its parameters would be ten times more)
        per_round = s0["wan_bytes_counted"] / s0["rounds"]
        self.assertGreater(per_round, s0["adapter_params"] / 2)
        self.assertLess(per_round, 2 * s0["adapter_params"] + 8192)
        self.assertTrue(math.isfinite(s0["chrf"]))


class BenchTorch(unittest.TestCase):
    def test_json(self):
        with tempfile.TemporaryDirectory(prefix="nb-bt-") as out:
            p = subprocess.run(
                [NEBULA, "bench", "torch", "--json", "--loopback", "--steps", "8",
                 "--sync-every", "4", "--layers", "1", "--width", "32", "--context", "32",
                 "--batch", "2", "--threads", "1", "--data-dir", DATA, "--langs", "en,de;ru,zh",
                 "--out", out], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            r = json.loads(p.stdout)
            for k in ("nebula_vs_single_loss", "nebula_vs_single_time", "ddp_over_nebula_bytes",
                      "binding_overhead"):
                self.assertIsInstance(r[k], float, k)
                self.assertTrue(math.isfinite(r[k]), k)
            run = r["runs"][0]
            for k in ("single", "ddp", "nebula"):
                for f in ("wall_s", "final_eval_loss", "wan_bytes"):
                    self.assertIn(f, run[k])
            self.assertTrue(run["nebula"]["same_hash"])
            # a step's fp32 gradients against one int8 frame every 4 steps
            self.assertGreater(run["ddp"]["wan_bytes"], run["nebula"]["wan_bytes"])
            self.assertFalse(r["netns"])

    def test_thin(self):
        """--thin 10: the rate from single's step time (a finite, positive Mbit/s), no ddp run,
        nebula with values auto under that cap: one theta_global, sparse frames (far below a
        byte per parameter per round), every ratio a finite number."""
        with tempfile.TemporaryDirectory(prefix="nb-bt-") as out:
            p = subprocess.run(
                [NEBULA, "bench", "torch", "--json", "--loopback", "--thin", "10", "--steps", "16",
                 "--sync-every", "4", "--overlap", "2", "--layers", "1", "--width", "32",
                 "--context", "32", "--batch", "2", "--threads", "1", "--data-dir", DATA,
                 "--langs", "en,de;ru,zh", "--out", out], capture_output=True, text=True,
                timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            r = json.loads(p.stdout)
            run = r["runs"][0]
            self.assertNotIn("ddp", run)
            self.assertTrue(math.isfinite(run["rate_mbit"]) and run["rate_mbit"] > 0)
            self.assertTrue(run["nebula"]["same_hash"])
            self.assertEqual(r["thin"], 10)
            for k in ("nebula_vs_single_loss", "nebula_vs_single_time", "binding_overhead"):
                self.assertTrue(math.isfinite(r[k]), k)
            self.assertGreater(r["bits_per_param_per_sync"], 0)
            self.assertLess(r["bits_per_param_per_sync"], 8)
            with open(os.path.join(out, "seed1", "nebula", "job.json")) as f:
                comp = json.load(f)["spec"]["compression"]
            self.assertEqual(comp["values"], "auto")
            self.assertTrue(comp["adaptive"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
