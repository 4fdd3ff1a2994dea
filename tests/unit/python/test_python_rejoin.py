"""A cluster's Python process killed during training and restarted with rejoin: two clusters in
two processes, each a small PyTorch MLP trained by its own Adam on its own data through
nebula.torch.DiLoCo over fault-tolerant sessions (sealed, loopback). West is killed (SIGKILL)
after 3 applied rounds; east trains on through rounds that are skipped, not errors; a new west
process on the same address opens its session with rejoin=True, pulls the running job's state,
and both train until 10 rounds were applied. Checked: east saw skipped rounds and no error, the
restarted west started from the pulled theta_global (not its own initial weights), and both end
with the same global hash and bit-identical parameters. Again with overlapped rounds
(overlap_steps 2 of 4, the eager start of their sparse frames: a skipped round puts the
parameters back): the same, but for the parameters, which hold each cluster's own 2 steps since
the last landing on top of the one theta_global.

Exits 77 (CTest: skipped) when torch, numpy or cffi is missing."""

import multiprocessing as mp
import os
import queue
import signal
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

H, BATCH, N_DATA = 4, 16, 128
KILL_AT, TARGET = 3, 10  # rounds applied when west is killed, and at which both stop
TIMEOUT_S = 90  # each wait of the parent; CTest's TIMEOUT is above the sum
SECRET = bytes(range(32))
NAMES = ("east", "west")


def model_and_data(index, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(77 + index)
    x = torch.rand(N_DATA, 4, generator=g) * (1 + index) - 0.5 * index
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return model, x, y


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def cluster_main(index, seed, listen, peer, overlap, to_parent, from_parent):
    """One cluster's process. peer None: the first life (tells the parent its port, learns the
    peer's); else the restarted west, which rejoins the running job at once."""
    try:
        torch.set_num_threads(1)
        model, x, y = model_and_data(index, seed)
        initial = flat(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        rejoin = peer is not None
        session = nebula.Session(
            job_id=f"py-rejoin-{overlap}", cluster_id=NAMES[index], cluster_index=index, n_clusters=2,
            listen=listen, insecure=True, job_secret=SECRET, inner_steps=H, outer_lr=0.7,
            outer_momentum=0.5, density=0.5, values="int8", peer_timeout_s=1,
            fault_tolerant=True, update_norm_bound=0, round_deadline_s=2, final_wait_s=30,
            rejoin=rejoin, rejoin_timeout_s=30)
        with session:
            if peer is None:
                to_parent.put(("port", index, session.port))
                peer = from_parent.get(timeout=TIMEOUT_S)
            session.add_peer(f"{NAMES[1 - index]}={peer}")
            if not rejoin:
                to_parent.put(("ready", index, None))
                from_parent.get(timeout=TIMEOUT_S)
            with nebula.torch.DiLoCo(session, model, sync_every=H,
                                     overlap_steps=overlap) as diloco:
                start = flat(model)
                at, skipped, until = 0, 0, time.monotonic() + TIMEOUT_S
                while time.monotonic() < until:
                    idx = torch.arange(at, at + BATCH) % N_DATA
                    at += BATCH
                    loss = torch.mean((model(x[idx]) - y[idx]) ** 2)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    time.sleep(0.005)  # a real step takes time: a lone survivor would race
                    info = diloco.step(samples=BATCH)
                    if info is None:
                        continue
                    skipped += not info.applied
                    to_parent.put(("round", index, (info.commits, info.applied)))
                    if info.commits >= TARGET:
                        break
                diloco.finish()
                to_parent.put(("finished", index, None))
                from_parent.get(timeout=TIMEOUT_S)
                to_parent.put(("done", index, dict(
                    hash=diloco.global_hash(), final=flat(model), start=start, initial=initial,
                    skipped=skipped, commits=info.commits if info else 0)))
    except BaseException as e:  # the parent reports it
        to_parent.put(("error", index, f"{type(e).__name__}: {e}"))


class KillAndRejoin(unittest.TestCase):
    def test_killed_process_rejoins(self):
        self.check(0)

    def test_killed_process_rejoins_overlapped(self):
        self.check(2)

    def check(self, overlap):
        ctx = mp.get_context("spawn")
        # a queue up per process: a process killed while it writes to a shared queue would
        # keep that queue's lock for ever, and the survivor's messages would never arrive
        ups = {k: ctx.Queue() for k in ("east", "west", "again")}
        downs = {k: ctx.Queue() for k in ("east", "west", "again")}
        procs = {}

        def spawn(key, index, seed, listen, peer):
            procs[key] = ctx.Process(target=cluster_main,
                                     args=(index, seed, listen, peer, overlap, ups[key],
                                           downs[key]))
            procs[key].start()

        def wait(pred, what):
            """Messages until pred(kind, i, val) holds; errors fail the test."""
            until = time.monotonic() + TIMEOUT_S
            while True:
                msg = None
                for k in list(ups):
                    if k in procs and k not in killed:
                        try:
                            msg = ups[k].get(timeout=0.02)
                            break
                        except queue.Empty:
                            pass
                if msg is None:
                    if time.monotonic() > until:
                        self.fail(f"no word from the clusters in {TIMEOUT_S} s while waiting "
                                  f"for {what}")
                    continue
                kind, i, val = msg
                if kind == "error":
                    self.fail(f"cluster {i}: {val}")
                if pred(kind, i, val):
                    return kind, i, val
                seen.append((kind, i, val))

        seen, killed = [], set()
        try:
            spawn("east", 0, 1, "127.0.0.1:0", None)
            spawn("west", 1, 2, "127.0.0.1:0", None)
            ports = {}
            while len(ports) < 2:
                _, i, port = wait(lambda k, i, v: k == "port", "the ports")
                ports[i] = port
            downs["east"].put(f"127.0.0.1:{ports[1]}")  # west's address, also after restart
            downs["west"].put(f"127.0.0.1:{ports[0]}")
            ready = set()
            while len(ready) < 2:
                ready.add(wait(lambda k, i, v: k == "ready", "ready")[1])
            for k in ("east", "west"):
                downs[k].put("go")
            # west dies (SIGKILL: no close, no goodbye) once it applied KILL_AT rounds
            wait(lambda k, i, v: k == "round" and i == 1 and v[0] >= KILL_AT, "west's rounds")
            os.kill(procs["west"].pid, signal.SIGKILL)
            killed.add("west")
            procs["west"].join(TIMEOUT_S)
            # east goes on: its rounds are skipped, not errors
            skipped = 0
            while skipped < 2:
                _, _, (commits, applied) = wait(lambda k, i, v: k == "round" and i == 0,
                                                "east's skipped rounds")
                skipped += not applied
            # a new west process on the same address rejoins
            spawn("again", 1, 3, f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[0]}")
            finished = set()
            while len(finished) < 2:
                finished.add(wait(lambda k, i, v: k == "finished", "finish")[1])
            for k in ("east", "again"):
                downs[k].put("close")
            results = {}
            while len(results) < 2:
                _, i, val = wait(lambda k, i, v: k == "done", "the results")
                results[i] = val
            for k in ("east", "again"):
                procs[k].join(TIMEOUT_S)
                self.assertEqual(procs[k].exitcode, 0, k)
        finally:
            for p in procs.values():
                if p.is_alive():
                    p.kill()
                    p.join()
        east, west = results[0], results[1]
        print(f"east: {east['skipped']} rounds skipped, {east['commits']} applied; restarted "
              f"west: {west['skipped']} skipped, {west['commits']} applied")
        self.assertGreaterEqual(east["skipped"], 2)
        self.assertGreaterEqual(east["commits"], TARGET)
        self.assertGreaterEqual(west["commits"], TARGET)
        # the restarted west began from the job's theta_global, not from its own weights
        self.assertNotEqual(west["start"].tobytes(), west["initial"].tobytes())
        self.assertEqual(east["hash"], west["hash"])
        if not overlap:  # overlapped: each holds its own steps since the last landing on top
            self.assertEqual(east["final"].tobytes(), west["final"].tobytes())


if __name__ == "__main__":
    unittest.main()
