"""nebula.torch.DiLoCo inside clusters of several ranks: two clusters of two gloo ranks each on
loopback (four processes, CPU), each cluster a torch.distributed group of its own training the
same small MLP under DistributedDataParallel, its rank 0 alone holding the nebula session.
Checked: after start and after every round every rank of both clusters holds the same parameters
(a hash of their bytes) and the same RoundInfo, the samples are summed over the ranks, the loss
goes down; once with blocking rounds and once with overlap_steps 2 (there the ranks of a cluster
agree each round, all four at the end). An error on the leader is raised on every rank with the
leader's status and text, no hang: another model on one cluster (start refused), a NaN (a round
refused, blocking and overlapped), a missing checkpoint; save and load through the leader. The
ranks' tables compared (another model on rank 1 named); a Session on rank 1, a group without
this rank, FSDP1 refused. The same training with the MLP sharded by fully_shard (FSDP2) instead
of DDP, blocking and overlapped, and FSDP2 in a world of one rank. The broadcast's buckets: a
plan checked alone, and a model with a 1 MiB parameter, two buckets' worth of smaller ones and an
odd-sized bf16 and an fp64 one, whose rank 1 ends with the leader's values.

Exits 77 (CTest: skipped) when torch (with torch.distributed), numpy or cffi is missing."""

import datetime
import hashlib
import sys
import tempfile
import time
import unittest

try:
    import numpy  # noqa: F401
    import cffi  # noqa: F401
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise ImportError(name="torch.distributed")
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

import nebula  # noqa: E402
import nebula.torch  # noqa: E402
import two_clusters  # noqa: E402  (beside this file)

H, ROUNDS, N_DATA, BATCH, RANKS = 4, 8, 256, 32, 2
TIMEOUT_S = 150  # the processes' own bound (the gloo groups' too); CTest's TIMEOUT is above it
NAMES = ("east", "west")


class MLP(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(),
                                        torch.nn.Linear(hidden, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


class Wide(torch.nn.Module):
    """Every path of the broadcast: a 1 MiB parameter (alone, in place), six of 0.8 MB (two
    buckets of bytes), a bf16 and an fp64 one (the last bucket, beside fp32 bytes)."""

    def __init__(self):
        super().__init__()
        self.big = torch.nn.Parameter(torch.randn(512, 512))
        self.small = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(200, 1000)) for _ in range(6)])
        self.bf16 = torch.nn.Parameter(torch.randn(3).to(torch.bfloat16))  # 6 bytes: the fp64
        self.fp64 = torch.nn.Parameter(torch.randn(10, dtype=torch.float64))  # at an odd offset


def data(cluster):
    """y = b.x + 0.3 sin(a.x), the same a, b everywhere; each cluster's inputs its own."""
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, generator=g), torch.randn(8, generator=g) / 2
    own = torch.Generator().manual_seed(100 + cluster)
    x = (1.0 + 0.5 * cluster) * torch.randn(N_DATA, 8, generator=own) + 0.3 * cluster
    return x, x @ b + 0.3 * torch.sin(x @ a)


def params_hash(model):
    """Of the whole parameters: a sharded (DTensor) one gathered first (every rank calls it)."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        v = p.detach()
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        v = v.cpu().contiguous()
        h.update((v.view(torch.int16) if v.dtype == torch.bfloat16 else v).numpy().tobytes())
    return h.hexdigest()


def init_group(cluster, rank, store_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/cluster{cluster}",
                            rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))


def open_session(cluster, n_clusters, to_parent, from_parent, job):
    """The leader's session, after the rendezvous of the leaders (ports, then peers known)."""
    s = nebula.Session(job_id=job, cluster_id=NAMES[cluster], cluster_index=cluster,
                       n_clusters=n_clusters, listen="127.0.0.1:0", insecure=True, unsealed=True,
                       inner_steps=H, outer_lr=0.7, outer_momentum=0.5, density=0.5,
                       values="int8", peer_timeout_s=10)
    to_parent.put(("port", cluster, s.port))
    ports = from_parent.get(timeout=TIMEOUT_S)
    for c, port in ports.items():
        if c != cluster:
            s.add_peer(f"{NAMES[c]}=127.0.0.1:{port}")
    to_parent.put(("ready", cluster, None))
    from_parent.get(timeout=TIMEOUT_S)
    return s


def error_of(e):
    return dict(type=type(e).__name__, text=str(e),
                status=getattr(e, "status", None), call=getattr(e, "call", None))


def sharded(model):
    """FSDP2: every Linear its own unit, then the whole model."""
    from torch.distributed.fsdp import fully_shard

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model


class Unwrapped(torch.nn.Module):
    """A sharded model seen as DDP is: .module is the model (the code below names both so)."""

    def __init__(self, m):
        super().__init__()
        self.module = m

    def forward(self, x):
        return self.module(x)


def train_main(cluster, rank, overlap, wrap, store_dir, to_parent, from_parent):
    """One rank of a cluster: DDP (or FSDP2's fully_shard) over the cluster's group, DiLoCo
    over the clusters. wrap "...+early": land_early, the leader waiting before each step until
    the round in flight's exchange is over (so each lands after the first step of the next)."""
    me = (cluster, rank)
    session = None
    early = wrap.endswith("+early")
    wrap = wrap.split("+")[0]
    try:
        init_group(cluster, rank, store_dir)
        torch.manual_seed(1000 + 10 * cluster + rank)  # DDP takes rank 0's, start cluster 0's
        if wrap == "fsdp2":  # each rank's shard of its own initial values: start overwrites them
            ddp = Unwrapped(sharded(MLP()))
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(MLP())
        x, y = data(cluster)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
        if rank == 0:
            session = open_session(cluster, 2, to_parent, from_parent,
                                   f"py-{wrap}-{overlap}{'-early' if early else ''}")
        model = ddp.module if wrap == "fsdp2" else ddp
        with nebula.torch.DiLoCo(session, model, sync_every=H, overlap_steps=overlap,
                                 land_early=early) as diloco:
            start = params_hash(ddp.module)
            with torch.no_grad():
                loss0 = float(torch.mean((ddp(x) - y) ** 2))
            rounds, steps, landed, at = [], [], [], 0
            for _ in range(H * ROUNDS):
                if early and session is not None:
                    while not session.round_ready():
                        time.sleep(0.001)
                idx = (torch.arange(at, at + BATCH) % N_DATA)[rank::RANKS]  # this rank's half
                at += BATCH
                loss = torch.mean((ddp(x[idx]) - y[idx]) ** 2)
                opt.zero_grad()
                loss.backward()
                opt.step()
                info = diloco.step(samples=len(idx))
                if info is not None:
                    rounds.append((info, params_hash(ddp.module)))
                    landed.append(diloco.landed_after)
                steps.append(params_hash(ddp.module))
            if overlap:  # the last round lands in finish
                diloco.finish()
                rounds.append((diloco.last_round, params_hash(ddp.module)))
            with torch.no_grad():
                loss1 = float(torch.mean((ddp(x) - y) ** 2))
            names = [p.name for p in diloco.params]
            leader = diloco.leader
        final, ghash = params_hash(ddp.module), diloco.global_hash()
        if rank == 0:  # close once both leaders finished (docs/python.md)
            to_parent.put(("finished", cluster, None))
            from_parent.get(timeout=TIMEOUT_S)
            session.close()
        dist.destroy_process_group()
        to_parent.put(("done", me, dict(start=start, final=final, rounds=rounds, loss0=loss0,
                                        loss1=loss1, names=names, leader=leader,
                                        hash=ghash, steps=steps, landed=landed)))
    except BaseException as e:
        to_parent.put(("error", me, f"{type(e).__name__}: {e}"))


def mismatch_main(cluster, rank, store_dir, to_parent, from_parent):
    """Cluster 1 trains another model (both its ranks): every leader's start fails, and every
    rank raises the error its leader got."""
    me = (cluster, rank)
    session = None
    try:
        init_group(cluster, rank, store_dir)
        ddp = torch.nn.parallel.DistributedDataParallel(MLP(hidden=32 if cluster == 0 else 16))
        if rank == 0:
            session = open_session(cluster, 2, to_parent, from_parent, "py-ddp-mismatch")
        got = None
        try:
            nebula.torch.DiLoCo(session, ddp, sync_every=H)
        except Exception as e:
            got = error_of(e)
        if rank == 0:
            to_parent.put(("finished", cluster, None))
            from_parent.get(timeout=TIMEOUT_S)
            session.close()
        dist.barrier()  # the group still works: nobody is left inside a collective
        dist.destroy_process_group()
        to_parent.put(("done", me, got))
    except BaseException as e:
        to_parent.put(("error", me, f"{type(e).__name__}: {e}"))


def solo_main(cluster, rank, store_dir, to_parent, from_parent):
    """One cluster of two ranks (n_clusters 1): the refusals before any collective or in the
    table check, then two good rounds, then a NaN on every rank refused by the leader's round."""
    me = (cluster, rank)
    out = {}
    try:
        init_group(cluster, rank, store_dir)
        opts = dict(job_id="py-ddp-solo", cluster_id="solo", insecure=True, unsealed=True,
                    density=1.0)
        if rank == 1:  # only the leader holds a session: refused at once, before any collective
            with nebula.Session(**opts) as s:
                try:
                    nebula.torch.DiLoCo(s, MLP(), sync_every=2)
                except ValueError as e:
                    out["session_on_rank1"] = str(e)
        only0 = dist.new_group(ranks=[0])  # every rank creates it; rank 1 is not in it
        if rank == 1:
            try:
                nebula.torch.DiLoCo(None, MLP(), sync_every=2, process_group=only0)
            except ValueError as e:
                out["not_in_group"] = str(e)
        try:  # another model on rank 1: the table check names it on both
            nebula.torch.DiLoCo(dict(opts), MLP(hidden=32 if rank == 0 else 16), sync_every=2)
        except ValueError as e:
            out["ranks_differ"] = str(e)
        try:  # another sync_every on rank 1
            nebula.torch.DiLoCo(dict(opts), MLP(), sync_every=2 + rank)
        except ValueError as e:
            out["settings_differ"] = str(e)
        torch.manual_seed(11 + rank)  # each rank its own values: the leader's must win
        wide = Wide()
        group = dist.new_group(ranks=[0, 1])  # given explicitly (the world's ranks here)
        dl = nebula.torch.DiLoCo(dict(opts), wide, sync_every=1, process_group=group)
        started = params_hash(wide)
        with torch.no_grad():
            for p in wide.parameters():
                p.add_(0.5 * (rank + 1))  # the ranks differ before the round
        info = dl.step(samples=1)
        out["wide"] = (started, params_hash(wide), info.samples, info.global_hash)
        dl.finish()
        dl.close()
        torch.manual_seed(5 + rank)
        ddp = torch.nn.parallel.DistributedDataParallel(MLP())
        diloco = nebula.torch.DiLoCo(dict(opts), ddp, sync_every=2)
        out["leader"] = diloco.leader
        out["session"] = diloco.session is not None
        infos = []
        for _ in range(2):
            with torch.no_grad():
                for p in ddp.parameters():
                    p.add_(0.01)  # the same on both ranks, as DDP's steps would be
            diloco.step(samples=3)
            infos.append((diloco.step(samples=3), params_hash(ddp.module)))
        out["infos"] = infos
        path = f"{store_dir}/solo.state"  # the leader's file; the path matters there only
        diloco.save(path)
        saved = params_hash(ddp.module)
        with torch.no_grad():
            for p in ddp.parameters():
                p.add_(1.0 + rank)
        diloco.load(path)  # theta_global into every rank's parameters
        out["loaded"] = (saved, params_hash(ddp.module))
        try:
            diloco.load(f"{store_dir}/missing.state")
        except nebula.NebulaError as e:
            out["missing"] = error_of(e)
        with torch.no_grad():
            ddp.module.head.bias.fill_(float("nan"))
        diloco.step()
        try:
            diloco.step()
        except nebula.NebulaError as e:
            out["nan"] = error_of(e)
        diloco.close()
        # overlapped: a NaN in the buffers at round_begin is found by the leader's round_end
        over = nebula.torch.DiLoCo(dict(opts), ddp, sync_every=2, overlap_steps=1)
        with torch.no_grad():
            ddp.module.head.bias.fill_(float("nan"))
        over.step()
        over.step()  # begins the round on the leader: every rank told IN_FLIGHT, no tensor
        try:
            over.step()  # lands it: refused
        except nebula.NebulaError as e:
            out["nan_overlap"] = error_of(e)
        over.close()
        dist.barrier()
        dist.destroy_process_group()
        to_parent.put(("done", me, out))
    except BaseException as e:
        to_parent.put(("error", me, f"{type(e).__name__}: {e}"))


KEYS = [(c, r) for c in range(2) for r in range(RANKS)]


class TwoClustersOfTwoRanks(unittest.TestCase):
    def check_training(self, overlap, wrap="ddp"):
        res = two_clusters.run_ranks(self, train_main, (overlap, wrap), 2, RANKS, TIMEOUT_S)
        synced = ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                  "head.weight", "head.bias"]
        for k in KEYS:
            r = res[k]
            print(f"{wrap} overlap {overlap} cluster {k[0]} rank {k[1]}: loss {r['loss0']:.4f} -> "
                  f"{r['loss1']:.4f} over {len(r['rounds'])} rounds")
            self.assertEqual(r["names"], synced)  # the module's names, not DDP's "module."
            self.assertEqual(r["leader"], k[1] == 0)
            self.assertEqual([info.round for info, _ in r["rounds"]], list(range(ROUNDS)))
            for info, _ in r["rounds"]:
                self.assertTrue(info.applied)
                self.assertEqual(info.samples, H * BATCH)  # both ranks' halves, summed
                self.assertEqual(info.samples_all, 2 * H * BATCH)
            self.assertEqual(r["hash"], r["rounds"][-1][0].global_hash)
            self.assertLess(r["loss1"], 0.5 * r["loss0"])
        # every rank of both clusters: cluster 0's leader's parameters after start, the same
        # RoundInfo each round (the leader's, relayed), the same parameters at the end
        for k in KEYS:
            self.assertEqual(res[k]["start"], res[(0, 0)]["start"], k)
            self.assertEqual(res[k]["final"], res[(0, 0)]["final"], k)
            self.assertNotEqual(res[k]["final"], res[k]["start"], k)
            # after every step, also while a round is in flight (its begin may have moved the
            # leader's parameters: the eager start), the ranks of a cluster hold the same ones
            self.assertEqual(res[k]["steps"], res[(k[0], 0)]["steps"], k)
            for n in range(ROUNDS):
                info, h = res[k]["rounds"][n]
                info0, h0 = res[(0, 0)]["rounds"][n]
                self.assertEqual(info.global_hash, info0.global_hash, (k, n))
                lead, hl = res[(k[0], 0)]["rounds"][n]
                self.assertEqual(info, lead, (k, n))  # the leader's figures, every field
                self.assertEqual(h, hl, (k, n))  # the ranks of a cluster, each round
                if not overlap:  # blocking: theta_global itself, on all four, each round
                    self.assertEqual(h, h0, (k, n))
            if wrap.endswith("+early"):  # every rank landed where its leader saw the exchange over
                self.assertEqual(res[k]["landed"], [1] * (ROUNDS - 1), k)

    def test_blocking(self):
        self.check_training(0)

    def test_overlap(self):
        """overlap_steps 2 of H 4: a round lands 2 steps into the next (theta_global plus each
        cluster's own 2 steps: the clusters differ there, the ranks of one do not); the last
        lands in finish right after it began, so all four end with one model."""
        self.check_training(2)

    def test_fsdp2(self):
        """The same with the MLP sharded by fully_shard (FSDP2: each rank holds half of every
        parameter) instead of DDP: gathered to the leader for each round, scattered back."""
        self.check_training(0, "fsdp2")

    def test_fsdp2_overlap(self):
        """FSDP2 overlapped, with land_early: each step while a round is in flight, the
        leader's round_ready() goes to the other rank; the leader waits for it before each step,
        so every round lands after 1 step (of 2) on both ranks, which stay equal."""
        self.check_training(2, "fsdp2+early")

    def test_leader_error_on_every_rank(self):
        """Another model on cluster 1: both leaders' start fails (NB_ERR_CONFIG naming the
        tensor); their other rank raises the same error, and the group is still usable."""
        res = two_clusters.run_ranks(self, mismatch_main, (), 2, RANKS, TIMEOUT_S)
        for k in KEYS:
            got, lead = res[k], res[(k[0], 0)]
            self.assertIsNotNone(got, k)
            self.assertEqual(got["type"], "NebulaError", k)
            self.assertEqual(got["status"], "NB_ERR_CONFIG", k)
            self.assertEqual(got["call"], "nb_session_start", k)
            self.assertIn("'body.0.weight'", got["text"], k)
            self.assertEqual(got, lead, k)  # what the leader got, word for word


class OneClusterOfTwoRanks(unittest.TestCase):
    def test_refusals_and_round_error(self):
        res = two_clusters.run_ranks(self, solo_main, (), 1, RANKS, TIMEOUT_S)
        a, b = res[(0, 0)], res[(0, 1)]
        self.assertIn("only rank 0 (the leader) holds one", b["session_on_rank1"])
        self.assertIn("(global rank 1) is not in process_group", b["not_in_group"])
        for r in (a, b):
            self.assertIn("tensor 0 differs: 'body.0.weight' (32, 8) float32 at rank 0, "
                          "'body.0.weight' (16, 8) float32 at rank 1", r["ranks_differ"])
            self.assertIn("sync_every 2 at rank 0, 3 at rank 1", r["settings_differ"])
            self.assertEqual(r["nan"]["status"], "NB_ERR_INVALID")
            self.assertIn("not finite", r["nan"]["text"])
        self.assertEqual(a["nan"], b["nan"])
        self.assertEqual(a["nan_overlap"], b["nan_overlap"])
        self.assertEqual(a["nan_overlap"]["call"], "nb_session_round_end")
        self.assertIn("not finite", a["nan_overlap"]["text"])
        # save and load through the leader: every rank back at the saved theta_global; a
        # missing file is the leader's NB_ERR_NOT_FOUND on both
        self.assertEqual(a["loaded"], b["loaded"])
        self.assertEqual(a["loaded"][0], a["loaded"][1])
        self.assertEqual(a["loaded"][0], a["infos"][-1][1])
        self.assertEqual(a["missing"], b["missing"])
        self.assertEqual(a["missing"]["status"], "NB_ERR_NOT_FOUND")
        # the wide model: rank 1 holds the leader's values after start and after the round
        self.assertEqual(a["wide"], b["wide"])
        self.assertNotEqual(a["wide"][0], a["wide"][1])
        self.assertEqual(a["wide"][2], 2)  # one sample on each rank
        self.assertEqual((a["leader"], a["session"], b["leader"], b["session"]),
                         (True, True, False, False))
        for (ia, ha), (ib, hb) in zip(a["infos"], b["infos"]):
            self.assertEqual(ia, ib)
            self.assertEqual(ha, hb)
            self.assertEqual(ia.samples, 2 * 2 * 3)  # 2 steps x 3 samples x 2 ranks
            self.assertTrue(ia.applied)


class Relay(unittest.TestCase):
    def test_round_info_round_trip(self):
        """The leader's RoundInfo as the other ranks rebuild it from the broadcast status: every
        field, the adaptive scheduler's reason and the codec point of values "auto" too."""
        base = dict(round=3, applied=True, samples=64, samples_all=128, msg_bytes=1500,
                    bytes_sent=1500, density=0.03, wait_s=0.25, exchange_s=0.5, codec_s=0.01,
                    global_hash=(1 << 64) - 5, update_norm=1.5, goodput_Bps=3e5, rtt_s=0.05,
                    commits=4, peers_ok=1, peers_alive=1, next_round=4, next_density=0.03,
                    sched="fit")
        for point in (None, "top3-2bit", "top1.5-2bit", "dense-int8"):
            info = nebula.RoundInfo(**base, point=point)
            st, _ = nebula.torch._status(1, nebula.torch.APPLIED, None, info)
            self.assertEqual(nebula.torch._round_info(st), info)


class Buckets(unittest.TestCase):
    def test_plan(self):
        """>= 1 MiB alone; smaller ones as bytes into buckets of at most 4 MiB, dtypes mixed."""
        from nebula.torch import _bucket_plan

        m = Wide()
        big, small, half, double = m.big, list(m.small), m.bf16, m.fp64
        edge = [torch.zeros((1 << 18) - 1) for _ in range(4)]  # 4 bytes under 1 MiB: bucketed
        plan = _bucket_plan([small[0], big, *small[1:], half, double, *edge])
        got = [(alone, [id(t) for t in ts]) for alone, ts in plan]
        want = [(True, [id(big)]), (False, [id(t) for t in small[:5]]),  # 4.0 MB, a 6th: 4.8
                (False, [id(t) for t in (small[5], half, double, *edge[:3])]),  # 3.95 MB
                (False, [id(edge[3])])]
        self.assertEqual(got, want)
        for alone, ts in plan:
            if not alone:
                self.assertLessEqual(sum(t.numel() * t.element_size() for t in ts), 4 << 20)


class Sharded(unittest.TestCase):
    def test_fsdp1_refused_fsdp2_solo(self):
        """FullyShardedDataParallel (FSDP1): a TypeError naming it before any session is touched;
        fully_shard (FSDP2) in a group of one rank: taken, its parameters gathered and scattered
        around each round (one cluster: a blocking and an overlapped round move them to
        theta_global)."""
        from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

        opts = dict(job_id="py-ddp-fsdp", cluster_id="solo", insecure=True, unsealed=True)
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0,
                                    world_size=1)
            try:
                fsdp = FullyShardedDataParallel(MLP(), device_id=torch.device("cpu"))
                with self.assertRaisesRegex(TypeError, "FullyShardedDataParallel.*fully_shard"):
                    nebula.torch.DiLoCo(opts, fsdp, sync_every=2)
                m = MLP()
                fully_shard(m)
                opt = torch.optim.SGD(m.parameters(), lr=0.1)
                x, y = data(0)
                with nebula.torch.DiLoCo(dict(opts, density=0.5, values="fp32"), m, sync_every=2,
                                         overlap_steps=1) as diloco:
                    for _ in range(6):
                        loss = torch.mean((m(x) - y) ** 2)
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                        diloco.step()
                    diloco.finish()
                    for name, p in m.named_parameters():  # the landing wrote theta_global
                        self.assertTrue(numpy.array_equal(p.full_tensor().detach().numpy(),
                                                          diloco.session.read_global(name)), name)
                    self.assertEqual(diloco.rounds, 3)
            finally:
                dist.destroy_process_group()
        with self.assertRaisesRegex(ValueError, "process_group given but torch.distributed"):
            nebula.torch.DiLoCo(opts, MLP(), sync_every=2, process_group=object())


if __name__ == "__main__":
    unittest.main(verbosity=2)
