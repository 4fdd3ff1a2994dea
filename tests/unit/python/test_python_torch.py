"""nebula.torch.DiLoCo on a user's own PyTorch model and loop: two clusters in two processes on
loopback, each the same small MLP (its own initial weights) trained by its own Adam on its own
synthetic data (the same true function, different inputs), synced every H = 4 steps. Checked:
the models end bit-identical, with the same global hash, and each cluster's loss went down. Once
with fp32 CPU parameters (the session works on their memory), once with bf16 ones (also in
place, through the session's fp32 master) and once with fp64 ones (host fp32 staging buffers, the
path GPU parameters take), there driven from the optimizer's step hook. And a one-cluster
checkpoint of a bf16 model: save, load into a new model, the same rounds give the same hashes.

Exits 77 (CTest: skipped) when torch, numpy or cffi is missing."""

import sys
import time
import unittest

try:
    import numpy  # noqa: F401
    import cffi  # noqa: F401
    import torch
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

import nebula  # noqa: E402
import nebula.torch  # noqa: E402
import two_clusters  # noqa: E402  (beside this file)

H, ROUNDS, N_DATA, BATCH = 4, 8, 256, 32
TIMEOUT_S = 120
NAMES = ("east", "west")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                        torch.nn.Linear(32, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 1)
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)  # not synced

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def data(index):
    """y = b.x + 0.3 sin(a.x), the same a, b everywhere; each cluster's inputs have their own
    scale and offset."""
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, generator=g), torch.randn(8, generator=g) / 2
    own = torch.Generator().manual_seed(100 + index)
    x = (1.0 + 0.5 * index) * torch.randn(N_DATA, 8, generator=own) + 0.3 * index
    return x, x @ b + 0.3 * torch.sin(x @ a)


def host(model):
    """The parameters as numpy copies (torch tensors through a queue travel as shared-memory
    handles that die with the child process)."""
    def bits(v):  # numpy has no bfloat16: its bits, for bit-exact comparisons
        v = v.detach().cpu()
        return (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).numpy().copy()

    return {k: bits(v) for k, v in model.state_dict().items()}


def cluster_main(index, dtype, hook, overlap, early, device, to_parent, from_parent):
    try:
        torch.set_num_threads(1)
        torch.manual_seed(1000 + index)  # different initial weights: start takes cluster 0's
        model = MLP().to(device=device, dtype=dtype)
        x, y = (t.to(device=device, dtype=dtype) for t in data(index))
        # fp16 Adam needs an eps that fp16 holds (1e-8 is 0 there: a division by zero)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2,
                               eps=1e-4 if dtype == torch.float16 else 1e-8)
        session = nebula.Session(job_id=f"py-torch-{dtype}", cluster_id=NAMES[index],
                                 cluster_index=index, n_clusters=2, listen="127.0.0.1:0",
                                 insecure=True, unsealed=True, inner_steps=H, outer_lr=0.7,
                                 outer_momentum=0.5, density=0.5, values="int8",
                                 peer_timeout_s=10)
        with session:
            to_parent.put(("port", index, session.port))
            session.add_peer(f"{NAMES[1 - index]}=127.0.0.1:{from_parent.get(timeout=TIMEOUT_S)}")
            to_parent.put(("ready", index, None))  # a cluster refuses senders it does not know
            from_parent.get(timeout=TIMEOUT_S)
            kw = dict(optimizer=opt, samples_per_step=BATCH) if hook else {}
            if overlap:
                kw["overlap_steps"] = overlap
            if early:
                kw["land_early"] = True
            landed = []
            with nebula.torch.DiLoCo(session, model, sync_every=H, **kw) as diloco:
                staged = [p.name for p in diloco.params if not p.shared]
                start = host(model)
                with torch.no_grad():
                    loss0 = float(torch.mean((model(x) - y) ** 2))
                infos, at = [], 0
                for _ in range(H * ROUNDS):
                    idx = torch.arange(at, at + BATCH) % N_DATA
                    at += BATCH
                    loss = torch.mean((model(x[idx]) - y[idx]) ** 2)
                    opt.zero_grad()
                    if early:  # the exchange in flight is over before this step ends
                        while not session.round_ready():
                            time.sleep(0.001)
                    loss.backward()
                    opt.step()
                    info = diloco.last_round if hook else diloco.step(samples=BATCH)
                    if info is not None and (not infos or info is not infos[-1]):
                        landed.append(diloco.landed_after)
                        infos.append(info)
                if overlap:  # the last round lands in finish (the with block's end)
                    diloco.finish()
                    infos.append(diloco.last_round)
                with torch.no_grad():
                    loss1 = float(torch.mean((model(x) - y) ** 2))
            final = host(model)
            # close only once both finished: a close cuts the acks of our server's last calls,
            # and the slower peer's finish would fail (docs/python.md, "Not there yet")
            to_parent.put(("finished", index, None))
            from_parent.get(timeout=TIMEOUT_S)
            on_device = all(p.device.type == device for p in model.parameters())
            to_parent.put(("done", index, dict(start=start, final=final, loss0=loss0,
                                               on_device=on_device,
                                               loss1=loss1, infos=infos, staged=staged,
                                               names=[p.name for p in diloco.params],
                                               hash=session.global_hash(),
                                               rounds=diloco.rounds, landed=landed)))
    except BaseException as e:
        to_parent.put(("error", index, f"{type(e).__name__}: {e}"))


def run_pair(test, dtype, hook, overlap=0, early=False, device="cpu"):
    return two_clusters.run(test, cluster_main, (dtype, hook, overlap, early, device), TIMEOUT_S)


class DiLoCoTwoClusters(unittest.TestCase):
    def check(self, dtype, hook, overlap=0, early=False, device="cpu"):
        """Also the body of test_python_torch_gpu's cases (device "cuda": every parameter
        staged through a pinned host buffer, and still on the GPU at the end)."""
        r = run_pair(self, dtype, hook, overlap, early, device)
        synced = ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                  "head.weight", "head.bias"]
        for i in range(2):
            print(f"{dtype} cluster {i}: loss {r[i]['loss0']:.4f} -> {r[i]['loss1']:.4f} over "
                  f"{r[i]['rounds']} rounds, {r[i]['infos'][-1].bytes_sent} bytes sent last round")
            self.assertEqual(r[i]["names"], synced)  # named_parameters(), trainable only
            staged = dtype == torch.float64 or device != "cpu"
            self.assertEqual(r[i]["staged"], synced if staged else [])
            self.assertTrue(r[i]["on_device"], f"a parameter left {device}")
            self.assertEqual(r[i]["rounds"], ROUNDS)
            self.assertEqual([inf.round for inf in r[i]["infos"]], list(range(ROUNDS)))
            last = r[i]["infos"][-1]
            self.assertTrue(last.applied)
            self.assertEqual(last.samples, H * BATCH)
            self.assertEqual(last.samples_all, 2 * H * BATCH)
            self.assertEqual(last.global_hash, r[i]["hash"])
            self.assertLess(r[i]["loss1"], 0.5 * r[i]["loss0"])
        # after start both held cluster 0's parameters; at the end, bit-identical models
        for k in synced:
            self.assertEqual(r[0]["start"][k].tobytes(), r[1]["start"][k].tobytes(), k)
            self.assertEqual(r[0]["final"][k].tobytes(), r[1]["final"][k].tobytes(), k)
            self.assertNotEqual(r[0]["start"][k].tobytes(), r[0]["final"][k].tobytes(), k)
        self.assertEqual(r[0]["hash"], r[1]["hash"])
        return r

    def test_fp32_shared_memory(self):
        self.check(torch.float32, hook=False)

    def test_fp64_staged_optimizer_hook(self):
        self.check(torch.float64, hook=True)

    def test_bf16_shared_memory(self):
        """CPU bf16 parameters are registered in place (no fp32 staging): the session converts."""
        self.check(torch.bfloat16, hook=False)

    def test_fp16_shared_memory(self):
        """CPU fp16 parameters are registered in place too (the session's fp16 tensors)."""
        self.check(torch.float16, hook=False)

    def test_fp32_overlap(self):
        """overlap_steps 2 of H 4: each round lands 2 steps into the next; the last lands in
        finish, so the models still end bit-identical."""
        self.check(torch.float32, hook=False, overlap=2)

    def test_fp64_staged_overlap_hook(self):
        self.check(torch.float64, hook=True, overlap=1)

    def test_fp32_overlap_land_early(self):
        """land_early with overlap_steps 3 of H 4: the loop waits before each step until
        round_ready() says the exchange in flight is over, so every round lands after the first
        step of the next (3 without land_early); the models still end bit-identical."""
        r = self.check(torch.float32, hook=False, overlap=3, early=True)
        for i in range(2):
            self.assertEqual(r[i]["landed"], [1] * (ROUNDS - 1), i)


class Checkpoint(unittest.TestCase):
    def test_save_load_bf16(self):
        """One cluster, a bf16 model: 2 rounds, save, 2 more; a new model and wrapper load the
        file and the same 2 rounds give the same hashes and parameters."""
        import tempfile

        opts = dict(job_id="py-torch-ckpt", cluster_id="solo", insecure=True, unsealed=True,
                    density=0.5, outer_momentum=0.5)

        def steps(model, r):
            with torch.no_grad():
                for k, p in enumerate(model.parameters()):
                    p.add_(torch.full_like(p, 0.01 * (r + 1) * (k + 1)))

        with tempfile.TemporaryDirectory() as d:
            path = f"{d}/diloco.bin"
            torch.manual_seed(1)
            model = torch.nn.Linear(6, 3).to(torch.bfloat16)
            hashes = []
            with nebula.torch.DiLoCo(dict(opts), model, sync_every=1) as dl:
                self.assertTrue(all(p.shared for p in dl.params))
                ptr = model.weight.data_ptr()
                for r in range(4):
                    if r == 2:
                        dl.save(path)
                    steps(model, r)
                    hashes.append(dl.step().global_hash)
                self.assertEqual(model.weight.data_ptr(), ptr)  # written in place
                final = host(model)
            torch.manual_seed(2)
            other = torch.nn.Linear(6, 3).to(torch.bfloat16)
            with nebula.torch.DiLoCo(dict(opts), other, sync_every=1) as dl:
                dl.load(path)
                for r in range(2, 4):
                    steps(other, r)
                    self.assertEqual(dl.step().global_hash, hashes[r])
                for k, v in host(other).items():
                    self.assertEqual(v.tobytes(), final[k].tobytes(), k)
            # the same through state_dict / load_state_dict and torch.save / torch.load
            torch.manual_seed(1)
            model = torch.nn.Linear(6, 3).to(torch.bfloat16)
            with nebula.torch.DiLoCo(dict(opts), model, sync_every=1) as dl:
                for r in range(2):
                    steps(model, r)
                    dl.step()
                torch.save({"diloco": dl.state_dict(), "model": model.state_dict()},
                           f"{d}/ckpt.pt")
            torch.manual_seed(3)
            other = torch.nn.Linear(6, 3).to(torch.bfloat16)
            with nebula.torch.DiLoCo(dict(opts), other, sync_every=1) as dl:
                ck = torch.load(f"{d}/ckpt.pt")
                dl.load_state_dict(ck["diloco"])
                for r in range(2, 4):
                    steps(other, r)
                    self.assertEqual(dl.step().global_hash, hashes[r])
                for k, v in host(other).items():
                    self.assertEqual(v.tobytes(), final[k].tobytes(), k)
                bad = dict(ck["diloco"])
                bad["nebula_session_state"] = bad["nebula_session_state"][:-9] + b"x" * 9
                with self.assertRaises(nebula.NebulaError) as cm:
                    dl.load_state_dict(bad)  # a damaged state: refused, nothing changed
                self.assertIn(cm.exception.status, ("NB_ERR_INTEGRITY", "NB_ERR_INVALID"))
                with self.assertRaisesRegex(ValueError, "made by DiLoCo.state_dict"):
                    dl.load_state_dict({"weights": 1})
                with self.assertRaisesRegex(ValueError, "sync_every 1, this wrapper has"):
                    with nebula.torch.DiLoCo(dict(opts, job_id="py-torch-ckpt2"),
                                             torch.nn.Linear(6, 3).to(torch.bfloat16),
                                             sync_every=2) as dl2:
                        dl2.load_state_dict(ck["diloco"])
            with nebula.torch.DiLoCo(dict(opts), torch.nn.Linear(6, 3), sync_every=2) as dl:
                dl.step()  # one inner step of two: not a round's end
                with self.assertRaisesRegex(RuntimeError, "right after a round"):
                    dl.save(path)
                dl.step()
            with nebula.torch.DiLoCo(dict(opts), torch.nn.Linear(6, 4), sync_every=1) as dl:
                with self.assertRaises(nebula.NebulaError) as cm:
                    dl.load(path)  # another model: refused naming the tensor
                self.assertIn("'weight'", cm.exception.message)


class Refusals(unittest.TestCase):
    def test_bad_arguments(self):
        opts = dict(job_id="py-torch-bad", cluster_id="solo", insecure=True, unsealed=True)
        with self.assertRaisesRegex(ValueError, "sync_every"):
            nebula.torch.DiLoCo(opts, MLP(), sync_every=0)
        with self.assertRaises(ValueError):
            nebula.torch.DiLoCo(opts, MLP(), sync_every=2, overlap_steps=2)
        with self.assertRaisesRegex(TypeError, "nn.Module"):
            nebula.torch.DiLoCo(opts, object(), sync_every=2)
        with self.assertRaisesRegex(TypeError, "Session or a dict"):
            nebula.torch.DiLoCo("east", MLP(), sync_every=2)
        frozen = torch.nn.Linear(2, 2).requires_grad_(False)
        with self.assertRaisesRegex(ValueError, "no trainable parameter"):
            nebula.torch.DiLoCo(opts, frozen, sync_every=2)

    def test_replaced_memory_is_refused(self):
        """One cluster (a dict of options: the wrapper owns the session): a parameter given new
        memory after registration would sync a dead buffer: the next round refuses it."""
        model = torch.nn.Linear(4, 4)
        opts = dict(job_id="py-torch-solo", cluster_id="solo", insecure=True, unsealed=True,
                    density=1.0)
        with nebula.torch.DiLoCo(opts, model, sync_every=1) as d:
            self.assertTrue(all(p.shared for p in d.params))
            self.assertIsNotNone(d.step())
            model.weight.data = model.weight.data.clone()
            with self.assertRaisesRegex(RuntimeError, "'weight' was given new memory"):
                d.step()
        self.assertTrue(d.session.closed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
