"""nebula.torch: DiLoCo across clusters for a user's own PyTorch model and training loop.

    diloco = nebula.torch.DiLoCo(session, model, sync_every=H)   # registers, starts
    for x, y in data:
        loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        info = diloco.step(samples=len(x))   # a RoundInfo every H steps, else None
    diloco.finish()

The inner optimizer stays the user's; nebula's round is the outer step. Inside a cluster trained
with DDP or FSDP2 (torch.distributed initialised: the world group, or process_group=), rank 0 of
the group alone holds the session and the other ranks get each round's outcome and theta_global
(broadcast; a sharded parameter gathered to the leader before each round and scattered back
after it: _Group below). It is not a trainer, a data loader or a launcher.
What crosses: every trainable parameter (requires_grad), named as model.named_parameters()
names it; CPU fp32, bf16 and fp16 parameters in place, others through host staging buffers.
diloco.save(path) / diloco.load(path) (or state_dict() / load_state_dict() for torch.save)
checkpoint the round state (right after a round). Buffers (BatchNorm's running statistics) and frozen parameters are not synced: load
them the same way on every cluster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
import torch

from . import NebulaError, RoundInfo, Session

__all__ = ["DiLoCo"]


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    """The uint16 numpy view of a CPU bfloat16 tensor's memory (numpy has no bfloat16: the bits
    are what libnebula's bf16 tensors take)."""
    return t.view(torch.int16).numpy().view(np.uint16)


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return None
    return DTensor


class _Param:
    """One registered parameter: either its own memory (a CPU contiguous fp32, bf16 or fp16
    tensor: the round reads and writes it in place, a 16-bit one through the session's fp32
    master) or a host staging buffer copied to before each round and from after it (GPU
    parameters, other dtypes, a sharded parameter's whole value): bf16 or fp16 for such a
    parameter (half the copy; the session converts), else fp32. `sharded`: a DTensor (FSDP2's
    fully_shard): every rank holds a shard; the wrapper gathers it whole into the leader's
    staging buffer before a round (DiLoCo._gather) and scatters theta_global back after."""

    def __init__(self, name: str, p: torch.nn.Parameter, leader: bool = True):
        self.name = name
        self.param = p
        t = p.data
        DTensor = _dtensor_type()
        self.sharded = DTensor is not None and isinstance(t, DTensor)
        if not leader:  # a rank other than the leader: receives theta_global in place
            self.shared, self.host_t, self.ptr, self.host = False, None, None, None
            return
        bf16, fp16 = t.dtype == torch.bfloat16, t.dtype == torch.float16
        self.shared = not self.sharded and t.device.type == "cpu" and t.is_contiguous() and (
            t.dtype == torch.float32 or bf16 or fp16)
        if self.shared:
            self.host_t = t  # the same memory as p.data
            self.ptr = t.data_ptr()
        else:
            # a GPU parameter's staging buffer is pinned (page-locked): the copies each way are
            # direct DMA, not through a bounce buffer
            self.host_t = torch.empty(tuple(t.shape), dtype=torch.bfloat16 if bf16 else
                                      torch.float16 if fp16 else torch.float32,
                                      pin_memory=t.device.type == "cuda")
            self.ptr = None
        self.host = _bf16_bits(self.host_t) if bf16 else self.host_t.numpy()

    def to_host(self) -> None:
        t = self.param.data
        if self.sharded:
            return  # gathered by DiLoCo._gather on every rank
        if self.shared:
            # the round works on the memory registered at start: a parameter whose .data was
            # replaced (p.data = ..., a .to() of the model) would silently sync a dead buffer
            if t.data_ptr() != self.ptr:
                raise RuntimeError(
                    f"nebula.torch: parameter '{self.name}' was given new memory after the "
                    "DiLoCo wrapper registered it (p.data = ... or model.to()): keep the "
                    "parameters in place, or build the wrapper after moving the model"
                )
        else:
            self.host_t.copy_(t)  # device -> host and dtype -> fp32; synchronous

    def from_host(self) -> None:
        if not self.shared and not self.sharded:  # sharded: DiLoCo._scatter on every rank
            self.param.data.copy_(self.host_t)  # host -> device, fp32 -> the parameter's dtype


# ---- inside a cluster: the leader and the other ranks of a torch.distributed group ------------

# What the leader broadcasts after each call of the session, before any tensor moves, as int64s:
# [magic, call, outcome, error kind (0 none, 1 NebulaError, 2 another), status code, the error
# payload's length, global hash, round (after round_begin: 1 when it moved the parameters, the
# eager start), then every RoundInfo field (floats as their bits)].
_ST_MAGIC = 0x4E42_5354  # "NBST"
_OP_START, _OP_ROUND, _OP_BEGIN, _OP_END, _OP_FINISH, _OP_SAVE, _OP_LOAD = range(1, 8)
_OP_NAMES = {_OP_START: "start", _OP_ROUND: "round", _OP_BEGIN: "round_begin",
             _OP_END: "round_end", _OP_FINISH: "finish", _OP_SAVE: "save", _OP_LOAD: "load"}
# the outcome: a round applied on every cluster, one that returned without applying (the session
# took no outer step), a round begun (in flight, lands later), another call done, or an error
APPLIED, SKIPPED, IN_FLIGHT, DONE, ERROR = range(5)
_ROUND_FIELDS = [f.name for f in dataclasses.fields(RoundInfo) if f.name != "point"]
# RoundInfo.point (None or a codec point's name) travels as UTF-8 in the last slots, 8 bytes each
_POINT_SLOTS = 4
_ST_LEN = 8 + len(_ROUND_FIELDS) + _POINT_SLOTS
_FLOAT_FIELDS = {f.name for f in dataclasses.fields(RoundInfo) if f.type in ("float", float)}
# RoundInfo.sched travels as its index here (the names nb_session_round_t.sched takes)
_SCHED_NAMES = ("fixed", "no_estimate", "fit", "ceiling", "hold", "floor_max_steps",
                "floor_lengthen", "floor_later")
_RELAYED = {"RuntimeError": RuntimeError, "ValueError": ValueError, "TypeError": TypeError,
            "OSError": OSError, "FileNotFoundError": FileNotFoundError}
_BIG_BYTES = 1 << 20  # a parameter this large is broadcast alone, in place
_BUCKET_BYTES = 4 << 20  # smaller ones go flattened (as bytes) into buckets of about this size


def _i64(v: int) -> int:
    """A uint64 (a hash) as the int64 of the same bits."""
    return v - (1 << 64) if v >= (1 << 63) else v


def _u64(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


def _check_sharded(model: torch.nn.Module, pg) -> None:
    """FSDP2 (fully_shard) and other DTensor parameters are taken when each is sharded or
    replicated over one mesh dimension that is exactly the cluster's group (the leader, rank 0
    of the group, is then the mesh's rank 0: theta_global is scattered from it). Refused, naming
    the module or parameter: FSDP1 (FullyShardedDataParallel, whose flat parameters hide the
    model's shapes: use fully_shard), a mesh of several dimensions (HSDP, tensor parallel) or of
    other ranks."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # torch without distributed
        return
    DTensor = _dtensor_type()
    for name, m in model.named_modules():
        if isinstance(m, FSDP):
            where = f"module '{name}' is" if name else "the model is"
            raise TypeError(
                f"nebula.torch: {where} wrapped in FullyShardedDataParallel (FSDP1): not "
                "supported; shard it with torch.distributed.fsdp.fully_shard (FSDP2) or wrap it "
                "with DistributedDataParallel instead")
    if DTensor is None:
        return
    import torch.distributed as dist

    group = None
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor) or not p.requires_grad:
            continue
        mesh = p.device_mesh
        if mesh.ndim != 1:
            raise TypeError(
                f"nebula.torch: parameter '{name}' is a DTensor over a {mesh.ndim}-dimensional "
                "mesh (HSDP or tensor parallel): only one dimension, the cluster's group, is "
                "supported")
        if group is None:
            group = dist.get_process_group_ranks(pg) if pg is not None else list(
                range(dist.get_world_size()))
        ranks = dist.get_process_group_ranks(mesh.get_group())
        if ranks != group:
            raise TypeError(
                f"nebula.torch: parameter '{name}' is sharded over ranks {ranks}, the cluster's "
                f"group is {group}: give process_group= the group the model is sharded over")


class _Group:
    """The cluster's ranks (a torch.distributed process group): rank 0 of the group is the
    leader. All collectives run on `device` (CUDA for an NCCL group, else the CPU)."""

    def __init__(self, pg):
        import torch.distributed as dist

        self.dist = dist
        self.pg = pg
        self.rank = dist.get_rank(pg)
        if self.rank < 0:
            raise ValueError(f"nebula.torch: this process (global rank {dist.get_rank()}) is not "
                             "in process_group: give the group of this cluster's ranks")
        self.size = dist.get_world_size(pg)
        self.src = dist.get_global_rank(pg, 0) if pg is not None else 0
        backend = str(dist.get_backend(pg)).lower()
        if "nccl" in backend and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def sum(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM, group=self.pg)
        return int(t.item())

    def check_table(self, table: list, settings: dict) -> None:
        """Every rank must hold the same table (names, shapes, dtypes in order) and settings:
        a hash over the group first, and where one differs the descriptions, to name the first
        difference; the same ValueError on every rank."""
        desc = json.dumps([table, settings])
        h = int.from_bytes(hashlib.sha256(desc.encode()).digest()[:8], "little", signed=True)
        mine = torch.tensor([h], dtype=torch.int64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(every, mine, group=self.pg)
        hashes = [int(t.item()) for t in every]
        if all(x == hashes[0] for x in hashes):
            return
        descs = [None] * self.size
        self.dist.all_gather_object(descs, (table, settings), group=self.pg)
        r = next(i for i, x in enumerate(hashes) if x != hashes[0])
        raise ValueError("nebula.torch: the ranks of the cluster do not agree: "
                         + _table_difference(descs[0], descs[r], r))

    def broadcast_status(self, st: np.ndarray | None, payload: bytes = b"") -> tuple:
        """The leader's status (st, its error payload) to every rank; returns both."""
        t = (torch.from_numpy(st).to(self.device) if self.leader
             else torch.empty(_ST_LEN, dtype=torch.int64, device=self.device))
        self.dist.broadcast(t, self.src, group=self.pg)
        st = t.cpu().numpy()
        n = int(st[5])
        if n:
            b = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
                 if self.leader else torch.empty(n, dtype=torch.uint8, device=self.device))
            self.dist.broadcast(b, self.src, group=self.pg)
            payload = bytes(b.cpu().numpy())
        return st, payload

    def broadcast_flag(self, flag: bool) -> bool:
        """The leader's yes/no to every rank; returns it."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self.device)
        self.dist.broadcast(t, self.src, group=self.pg)
        return bool(t.item())

    def broadcast_params(self, tensors: list) -> None:
        """The leader's tensors into every rank's, in place, as _bucket_plan groups them. The
        order is the table's, the same on every rank (check_table)."""
        for alone, ts in _bucket_plan(tensors):
            if alone:
                self._one(ts[0])
            else:
                self._bucket(ts)

    def _one(self, t: torch.Tensor) -> None:
        if t.device == self.device and t.is_contiguous():
            self.dist.broadcast(t.view(-1).view(torch.uint8), self.src, group=self.pg)
            return
        tmp = t.detach().to(self.device, copy=True).contiguous()  # e.g. CUDA params, gloo group
        self.dist.broadcast(tmp.view(-1).view(torch.uint8), self.src, group=self.pg)
        if not self.leader:
            t.copy_(tmp)

    def _bucket(self, ts: list) -> None:
        sizes = [t.numel() * t.element_size() for t in ts]
        if self.leader:
            flat = torch.cat([t.detach().contiguous().view(-1).view(torch.uint8) for t in ts])
            flat = flat.to(self.device)
        else:
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        self.dist.broadcast(flat, self.src, group=self.pg)
        if self.leader:
            return
        at = 0
        for t, n in zip(ts, sizes):
            part = flat[at:at + n]  # at may not be a multiple of t's element size (bf16 then fp32)
            if t.is_contiguous() and t.device == self.device:
                t.view(-1).view(torch.uint8).copy_(part)
            else:
                t.copy_(part.clone().view(t.dtype).view(t.shape))  # a fresh, aligned copy
            at += n


def _bucket_plan(tensors: list) -> list:
    """[(alone, [tensors])] in broadcast order: a tensor of >= 1 MiB alone (broadcast in place),
    smaller ones flattened as bytes (any dtype together) into buckets of at most ~4 MiB, one open
    bucket per device, each sent when the next tensor would overflow it, the rest at the end."""
    plan, open_buckets = [], {}  # device -> ([tensors], bytes)
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if nbytes >= _BIG_BYTES:
            plan.append((True, [t]))
            continue
        ts, size = open_buckets.get(t.device, ([], 0))
        if ts and size + nbytes > _BUCKET_BYTES:
            plan.append((False, ts))
            ts, size = [], 0
        ts.append(t)
        open_buckets[t.device] = (ts, size + nbytes)
    plan += [(False, ts) for ts, _ in open_buckets.values() if ts]
    return plan


def _table_difference(a, b, rank: int) -> str:
    """The first difference between rank 0's (table, settings) and `rank`'s."""
    (ta, sa), (tb, sb) = a, b
    for k in sorted(set(sa) | set(sb)):
        if sa.get(k) != sb.get(k):
            return f"{k} {sa.get(k)!r} at rank 0, {sb.get(k)!r} at rank {rank}"
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x != y:
            def show(e):
                return "no tensor" if e is None else f"'{e[0]}' {tuple(e[1])} {e[2]}"
            return (f"tensor {i} differs: {show(x)} at rank 0, {show(y)} at rank {rank} "
                    "(every rank must wrap the same model)")
    return f"the tables differ at rank {rank}"  # the hashes did; not reached for equal JSON


def _status(op: int, outcome: int, session, info: RoundInfo | None = None,
            error: BaseException | None = None) -> tuple:
    """(the int64 status, the error payload) the leader broadcasts after a call."""
    st = np.zeros(_ST_LEN, dtype=np.int64)
    st[0], st[1], st[2] = _ST_MAGIC, op, outcome
    payload = b""
    if error is not None:
        e = {"type": type(error).__name__, "text": str(error)}
        if isinstance(error, NebulaError):
            e.update(call=error.call, code=error.code, message=error.message)
            st[4] = error.code
        payload = json.dumps(e).encode()
        st[3] = 1 if isinstance(error, NebulaError) else 2
        st[5] = len(payload)
    try:
        st[6] = _i64(session.global_hash()) if session is not None and not session.closed else 0
    except Exception:
        st[6] = 0
    if info is not None:
        st[7] = info.round
        for k, name in enumerate(_ROUND_FIELDS):
            v = getattr(info, name)
            if name == "sched":
                v = _SCHED_NAMES.index(v) if v in _SCHED_NAMES else 0
            st[8 + k] = (np.float64(v).view(np.int64) if name in _FLOAT_FIELDS
                         else _i64(int(v)))
        if info.point is not None:
            raw = info.point.encode()[: 8 * _POINT_SLOTS - 1].ljust(8 * _POINT_SLOTS, b"\0")
            st[_ST_LEN - _POINT_SLOTS:] = np.frombuffer(raw, dtype=np.int64)
    return st, payload


def _round_info(st: np.ndarray) -> RoundInfo:
    kw = {}
    for k, name in enumerate(_ROUND_FIELDS):
        v = st[8 + k]
        if name in _FLOAT_FIELDS:
            kw[name] = float(np.int64(v).view(np.float64))
        elif name == "applied":
            kw[name] = bool(v)
        elif name == "global_hash":
            kw[name] = _u64(int(v))
        elif name == "sched":
            kw[name] = _SCHED_NAMES[int(v)] if 0 <= int(v) < len(_SCHED_NAMES) else "fixed"
        else:
            kw[name] = int(v)
    raw = np.asarray(st[_ST_LEN - _POINT_SLOTS:], dtype=np.int64).tobytes().rstrip(b"\0")
    kw["point"] = raw.decode() if raw else None
    return RoundInfo(**kw)


def _relayed_error(payload: bytes) -> BaseException:
    """The leader's error as raised on another rank: the same type and text."""
    e = json.loads(payload.decode())
    if e["type"] == "NebulaError" and "code" in e:
        return NebulaError(e["call"], e["code"], message=e["message"])
    cls = _RELAYED.get(e["type"])
    if cls is not None:
        return cls(e["text"])
    return RuntimeError(f"{e['type']}: {e['text']}")


class DiLoCo:
    """The outer loop of DiLoCo over a nebula session, for any nn.Module.

    session_or_options: a nebula.Session that is open and not started (no tensor registered),
    or a dict of Session keyword options (the wrapper then owns the session and closes it;
    inner_steps defaults to sync_every). The constructor registers every trainable parameter in
    named_parameters() order and starts the session: it blocks until every cluster has done the
    same, and then the model holds cluster 0's parameters on every cluster.

    step(samples=None) after every inner optimizer step counts it; every `sync_every` steps it
    runs the blocking round (Delta, codec, exchange, outer Nesterov step) and writes theta_global
    back into the parameters, then returns the round's RoundInfo (else None). `samples` is what
    the step trained on (its batch size); the sum since the last round weights this cluster's
    Delta (default 1 per step: every cluster weighs the same with the same H).
    With optimizer=opt, step() runs from the optimizer's post-step hook instead (one sample per
    step unless samples_per_step says otherwise).

    overlap_steps=tau (1 <= tau < sync_every) overlaps the exchange with the next inner steps
    (Streaming DiLoCo): at the round's step the update goes out in the background and training
    goes on; tau steps later it lands (theta_global plus the steps trained since), and that
    step() returns the round's RoundInfo. finish() lands a round still in flight first.
    0 (default): the blocking round. land_early=True (with overlap): the update lands at the
    first step after its exchange is over (Session.round_ready(); in a group the leader's answer
    is broadcast after each step while a round is in flight), tau steps being the latest: a
    landing later than the link needs costs loss, but which step it lands at then follows the
    link's timing, so a run is not repeatable bit for bit.

    Inside a cluster of several ranks (torch.distributed initialised; process_group=None means
    the world group): every rank of the group builds the wrapper and calls every method, rank 0
    of the group (the leader) alone holds the session: give it the Session (or the dict), and
    None on the other ranks (a dict there is ignored). `samples` is then summed over the group
    before each round; after each call of the session the leader broadcasts its outcome (an error
    is raised on every rank) and then theta_global, so every rank returns the same RoundInfo and
    holds the same parameters. The ranks must train the same parameters (DDP keeps them so): the
    leader's are what crosses. A DistributedDataParallel model is unwrapped (the names are the
    module's). A model sharded with FSDP2 (fully_shard over the cluster's group) is taken too:
    its parameters are gathered whole to the leader before each round and scattered back after
    it (memory: one whole parameter at a time on every rank, the whole model in the leader's
    host staging buffers). FSDP1 (FullyShardedDataParallel) is refused.
    """

    def __init__(
        self,
        session_or_options,
        model: torch.nn.Module,
        sync_every: int,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        samples_per_step: int = 1,
        overlap_steps: int = 0,
        land_early: bool = False,
        process_group=None,
    ):
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"nebula.torch: sync_every must be an int >= 1, not {sync_every!r}")
        if (isinstance(overlap_steps, bool) or not isinstance(overlap_steps, int)
                or not 0 <= overlap_steps < sync_every):
            raise ValueError("nebula.torch: overlap_steps must be an int in [0, sync_every), "
                             f"not {overlap_steps!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"nebula.torch: model must be an nn.Module, not {type(model).__name__}")
        if not isinstance(land_early, bool):
            raise TypeError(f"nebula.torch: land_early must be a bool, not {land_early!r}")
        self.land_early = land_early
        self._group = self._make_group(process_group)
        _check_sharded(model, process_group)
        self.leader = self._group is None or self._group.leader
        if not self.leader:
            if isinstance(session_or_options, Session):
                raise ValueError(
                    f"nebula.torch: rank {self._group.rank} of the cluster's group was given a "
                    "Session: only rank 0 (the leader) holds one; pass None on the other ranks")
            if session_or_options is not None and not isinstance(session_or_options, dict):
                raise TypeError("nebula.torch: give a nebula.Session or a dict of its options "
                                "(or None on a rank other than the leader)")
            self.session = None
            self._owns = False
        elif isinstance(session_or_options, Session):
            self.session = session_or_options
            self._owns = False
        elif isinstance(session_or_options, dict):
            opts = dict(session_or_options)
            opts.setdefault("inner_steps", sync_every)
            self.session = Session(**opts)
            self._owns = True
        else:
            raise TypeError("nebula.torch: give a nebula.Session or a dict of its options")
        try:
            self._setup(model, sync_every, optimizer, samples_per_step, overlap_steps)
        except BaseException:
            if self._owns:
                self.session.close()
            raise

    @staticmethod
    def _make_group(process_group):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            if process_group is not None:
                raise ValueError("nebula.torch: process_group given but torch.distributed is not "
                                 "initialised (init_process_group first)")
            return None
        g = _Group(process_group)
        return g if g.size > 1 else None  # a group of one is the single-process case

    def _setup(self, model, sync_every, optimizer, samples_per_step, overlap_steps) -> None:
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except ImportError:
            DDP = ()
        self.model = model
        named = model.module if DDP and isinstance(model, DDP) else model
        self.sync_every = sync_every
        self.samples_per_step = samples_per_step
        self.overlap_steps = overlap_steps
        self._in_flight = False
        self._since_begin = 0
        self.landed_after = None  # the steps after round_begin the last round landed after
        self._closed = False
        self._hash = 0  # on a non-leader rank: the leader's global hash after its last call
        self.params = [_Param(n, p, self.leader) for n, p in named.named_parameters()
                       if p.requires_grad]
        self._sharded = [prm for prm in self.params if prm.sharded]
        if not self.params:
            raise ValueError("nebula.torch: the model has no trainable parameter to sync")
        self.steps = 0  # inner steps since the last round
        self.samples = 0  # samples since the last round
        self._loss_sum, self._loss_n = 0.0, 0  # step losses given since the last round
        self.rounds = 0
        self.last_round: RoundInfo | None = None
        self._hook = None
        self._finished = False
        if self._group is not None:
            table = [[prm.name, list(prm.param.shape), str(prm.param.dtype).replace("torch.", "")]
                     for prm in self.params]
            self._group.check_table(table, dict(sync_every=sync_every,
                                                overlap_steps=overlap_steps))

        def start():
            for prm in self.params:
                prm.to_host()
                self.session.register(prm.name, prm.host)
            self.session.start()  # theta_global = cluster 0's values, in the host buffers
            for prm in self.params:
                prm.from_host()

        self._call(_OP_START, start)
        if optimizer is not None:
            self._hook = optimizer.register_step_post_hook(
                lambda *_: self.step(self.samples_per_step)
            )

    # ---- one call of the session, and what the other ranks learn of it -----------------------

    @torch.no_grad()
    def _call(self, op: int, fn, *, params: bool = True):
        """fn() on the leader (the session's call with the host copies around it); with a group,
        then its status to every rank (an error raised on every rank before any tensor moves),
        then, when `params`, the leader's parameters to every rank. Returns fn's result on the
        leader, the RoundInfo (a round) or None elsewhere. Sharded parameters are gathered whole
        into the leader's staging buffers before fn (every rank takes part) and scattered back
        with the broadcast."""
        result, error = None, None
        if self._sharded and op in (_OP_START, _OP_ROUND, _OP_BEGIN, _OP_END):
            self._gather()
        if self.leader:
            try:
                result = fn()
            except BaseException as e:  # noqa: B902 (relayed, then raised again)
                if self._group is None:
                    raise
                error = e
        if self._group is None:
            if self._sharded and (params or (op == _OP_BEGIN and result)):
                self._scatter()
            return result
        if self.leader:
            info = result if isinstance(result, RoundInfo) else None
            outcome = (ERROR if error is not None else IN_FLIGHT if op == _OP_BEGIN
                       else DONE if info is None else APPLIED if info.applied else SKIPPED)
            st, payload = _status(op, outcome, self.session, info, error)
            if op == _OP_BEGIN and error is None and result:
                st[7] = 1  # the eager start moved the parameters: they go to every rank
        else:
            st, payload = None, b""
        st, payload = self._group.broadcast_status(st, payload)
        if int(st[0]) != _ST_MAGIC or int(st[1]) != op:
            raise RuntimeError(
                f"nebula.torch: rank {self._group.rank} is at {_OP_NAMES[op]} but the leader "
                f"sent the status of {_OP_NAMES.get(int(st[1]), int(st[1]))}: the ranks "
                "called the wrapper differently (every rank must call every method)")
        self._hash = _u64(int(st[6]))
        if int(st[2]) == ERROR:
            if error is not None:
                raise error
            raise _relayed_error(payload)
        if params or (op == _OP_BEGIN and int(st[7]) == 1):
            self._group.broadcast_params([prm.param.data for prm in self.params
                                          if not prm.sharded])
            if self._sharded:
                self._scatter()
        if self.leader:
            return result
        return _round_info(st) if int(st[2]) in (APPLIED, SKIPPED) else None

    def _gather(self) -> None:
        """Every sharded parameter whole (a collective of its mesh, the cluster's group: every
        rank calls it), into the leader's staging buffer; one parameter at a time."""
        for prm in self._sharded:
            full = prm.param.data.full_tensor()
            if self.leader:
                prm.host_t.copy_(full)
            del full

    def _scatter(self) -> None:
        """The leader's staging buffers (theta_global) into every rank's shards: each is
        distributed from the mesh's rank 0 (the leader; the other ranks' source values are not
        read) with the parameter's own placements, and copied into its local shard in place."""
        from torch.distributed.tensor import distribute_tensor

        for prm in self._sharded:
            d = prm.param.data
            if self.leader:
                src = prm.host_t.to(device=d.device, dtype=d.dtype)
            else:
                src = torch.empty(tuple(d.shape), dtype=d.dtype, device=d.device)
            new = distribute_tensor(src, d.device_mesh, d.placements, src_data_rank=0)
            d.to_local().copy_(new.to_local())

    def _cluster_samples(self) -> int:
        return self.samples if self._group is None else self._group.sum(self.samples)

    # ---- the loop -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, samples: int | None = None, loss: float | None = None) -> RoundInfo | None:
        """Counts one inner step; runs the round after every `sync_every` of them. `loss` (a
        float or a one-element tensor; optional): the step's training loss; the mean of the
        round's goes into its progress line (the leader's, in a group)."""
        self.steps += 1
        self.samples += 1 if samples is None else int(samples)
        if loss is not None:
            self._loss_sum += float(loss)
            self._loss_n += 1
        landed = None
        if self._in_flight:
            self._since_begin += 1
            if self._since_begin >= self.overlap_steps or (self.land_early and self._ready()):
                self.landed_after = self._since_begin
                landed = self._land()
        if self.steps < self.sync_every:
            return landed
        if self.overlap_steps == 0:
            return self.sync()
        self._begin()
        return landed

    def _take_loss(self):
        """The mean step loss given since the last round (None: none given), and a reset."""
        mean = self._loss_sum / self._loss_n if self._loss_n else None
        self._loss_sum, self._loss_n = 0.0, 0
        return mean

    def _begin(self) -> None:
        n = self._cluster_samples()
        loss = self._take_loss()

        def begin():
            for prm in self.params:
                prm.to_host()
            if loss is not None:
                self.session.set_loss(loss)
            moved = self.session.round_begin(n)
            if moved:  # the eager start: the steps until the landing train from its prediction
                for prm in self.params:
                    prm.from_host()
            return moved

        self._call(_OP_BEGIN, begin, params=False)
        self.steps = 0
        self.samples = 0
        self._in_flight = True
        self._since_begin = 0

    def _ready(self) -> bool:
        """Whether the round in flight's exchange is over (the leader's answer, in a group)."""
        ready = self.leader and self.session.round_ready()
        return ready if self._group is None else self._group.broadcast_flag(ready)

    def _land(self) -> RoundInfo:
        def end():
            for prm in self.params:
                prm.to_host()  # what was trained since the round began: the session keeps it
            info = self.session.round_end()
            for prm in self.params:
                prm.from_host()
            return info

        self._in_flight = False
        info = self._call(_OP_END, end)
        self.rounds += 1
        self.last_round = info
        return info

    @torch.no_grad()
    def sync(self) -> RoundInfo:
        """The blocking round now, whatever the step count (every cluster must call it: a round
        is collective, and so is it over the cluster's group); an overlapped round in flight
        lands first."""
        if self._in_flight:
            self._land()
        n = self._cluster_samples()
        loss = self._take_loss()

        def round_():
            for prm in self.params:
                prm.to_host()
            if loss is not None:
                self.session.set_loss(loss)
            info = self.session.round(n)
            for prm in self.params:
                prm.from_host()
            return info

        info = self._call(_OP_ROUND, round_)
        self.steps = 0
        self.samples = 0
        self.rounds += 1
        self.last_round = info
        return info

    def save(self, path) -> None:
        """Writes the session's round state to `path` (Session.save: atomic, every cluster its
        own file; in a group the leader writes it, and its error is raised on every rank). Right
        after a round, when the parameters hold theta_global: save the model's other state
        (buffers, frozen parameters) and the inner optimizer's beside it yourself."""
        if self.steps or self._in_flight:
            raise RuntimeError(
                f"nebula.torch: save right after a round ({self.steps} inner steps since the "
                "last one would not be in the checkpoint)"
            )
        self._call(_OP_SAVE, lambda: self.session.save(path), params=False)

    @torch.no_grad()
    def load(self, path) -> None:
        """Restores a state written by save (every cluster its own, of the same round): the
        parameters then hold its theta_global and the next round continues the saved run.
        NebulaError for a file of another model, cluster or job setting, or a damaged one (the
        parameters are then unchanged). In a group the leader reads the file (the path matters
        there only) and every rank gets theta_global."""

        def load():
            for prm in self.params:
                prm.to_host()  # the memory check of shared parameters
            self.session.load(path)
            for prm in self.params:
                prm.from_host()

        self._call(_OP_LOAD, load)
        self.steps = 0
        self.samples = 0

    _STATE_FORMAT = 1

    def state_dict(self) -> dict:
        """The session's round state as a dict for torch.save beside the model's and optimizer's
        (the bytes Session.save writes: theta_global, momentum, residual, round, the tensor
        table, checksummed). Right after a round, as save. In a group only the leader holds the
        bytes (the other ranks get None there: save the leader's)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="nebula-state-") as d:
            path = os.path.join(d, "state.bin")
            self.save(path)
            data = None
            if self.leader:
                with open(path, "rb") as f:
                    data = f.read()
        return {"format": self._STATE_FORMAT, "sync_every": self.sync_every,
                "nebula_session_state": data}

    def load_state_dict(self, state: dict) -> None:
        """Restores a dict made by state_dict (as load: strict, the parameters then hold its
        theta_global; a damaged or foreign state is NebulaError and nothing changes). In a group
        the leader's dict is the one that counts; every rank must call it."""
        import tempfile

        if not isinstance(state, dict) or state.get("format") != self._STATE_FORMAT:
            raise ValueError("nebula.torch: load_state_dict takes a dict made by "
                             f"DiLoCo.state_dict() (format {self._STATE_FORMAT})")
        if state.get("sync_every") != self.sync_every:
            raise ValueError(f"nebula.torch: the state was saved with sync_every "
                             f"{state.get('sync_every')!r}, this wrapper has {self.sync_every}")
        data = state.get("nebula_session_state")
        if self.leader and not isinstance(data, (bytes, bytearray)):
            raise ValueError("nebula.torch: the state holds no session bytes (a dict saved on a "
                             "rank other than the leader?)")
        with tempfile.TemporaryDirectory(prefix="nebula-state-") as d:
            path = os.path.join(d, "state.bin")
            if self.leader:
                with open(path, "wb") as f:
                    f.write(data)
            self.load(path)

    def finish(self) -> None:
        """The final hash-only exchange (every cluster calls it once, after its last round); an
        overlapped round in flight lands first."""
        if self._in_flight:
            self._land()
        self._call(_OP_FINISH, lambda: self.session.finish(), params=False)
        self._finished = True

    def global_hash(self) -> int:
        """XXH3-64 of theta_global; on a rank other than the leader, the hash the leader sent
        after its last call (start, a round, load)."""
        return self.session.global_hash() if self.leader else self._hash

    def close(self) -> None:
        """Removes the optimizer hook; closes the session when the wrapper opened it."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._owns:
            self.session.close()
        self._closed = True

    def __enter__(self) -> "DiLoCo":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            open_ = not self._closed and (self.session is None or not self.session.closed)
            if exc_type is None and not self._finished and open_:
                self.finish()
        finally:
            self.close()
