"""nebula.torch: DiLoCo across clusters for a user's own PyTorch model and training loop.

    diloco = nebula.torch.DiLoCo(session, model, sync_every=H)   # registers, starts
    for x, y in data:
        loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        info = diloco.step(samples=len(x))   # a RoundInfo every H steps, else None
    diloco.finish()

The inner optimizer stays the user's (and torch.distributed inside the cluster, on the leader's
copy); nebula's round is the outer step. It is not a trainer, a data loader or a launcher.
What crosses: every trainable parameter (requires_grad), named as model.named_parameters()
names it; CPU fp32 and bf16 parameters in place, others through host staging buffers.
diloco.save(path) / diloco.load(path) checkpoint the round state (right after a round). Buffers (BatchNorm's running statistics) and frozen parameters are not synced: load
them the same way on every cluster.
"""

from __future__ import annotations

import numpy as np
import torch

from . import RoundInfo, Session

__all__ = ["DiLoCo"]


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    """The uint16 numpy view of a CPU bfloat16 tensor's memory (numpy has no bfloat16: the bits
    are what libnebula's bf16 tensors take)."""
    return t.view(torch.int16).numpy().view(np.uint16)


class _Param:
    """One registered parameter: either its own memory (a CPU contiguous fp32 or bf16 tensor: the
    round reads and writes it in place, a bf16 one through the session's fp32 master) or a host
    staging buffer copied to before each round and from after it (GPU parameters, other dtypes):
    bf16 for a bf16 parameter (half the copy; the session converts), else fp32."""

    def __init__(self, name: str, p: torch.nn.Parameter):
        self.name = name
        self.param = p
        t = p.data
        bf16 = t.dtype == torch.bfloat16
        self.shared = t.device.type == "cpu" and t.is_contiguous() and (
            t.dtype == torch.float32 or bf16)
        if self.shared:
            self.host_t = t  # the same memory as p.data
            self.ptr = t.data_ptr()
        else:
            self.host_t = torch.empty(tuple(t.shape), dtype=torch.bfloat16 if bf16 else
                                      torch.float32)
            self.ptr = None
        self.host = _bf16_bits(self.host_t) if bf16 else self.host_t.numpy()

    def to_host(self) -> None:
        t = self.param.data
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
        if not self.shared:
            self.param.data.copy_(self.host_t)  # host -> device, fp32 -> the parameter's dtype


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
    0 (default): the blocking round.
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
    ):
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"nebula.torch: sync_every must be an int >= 1, not {sync_every!r}")
        if (isinstance(overlap_steps, bool) or not isinstance(overlap_steps, int)
                or not 0 <= overlap_steps < sync_every):
            raise ValueError("nebula.torch: overlap_steps must be an int in [0, sync_every), "
                             f"not {overlap_steps!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"nebula.torch: model must be an nn.Module, not {type(model).__name__}")
        if isinstance(session_or_options, Session):
            self.session = session_or_options
            self._owns = False
        elif isinstance(session_or_options, dict):
            opts = dict(session_or_options)
            opts.setdefault("inner_steps", sync_every)
            self.session = Session(**opts)
            self._owns = True
        else:
            raise TypeError("nebula.torch: give a nebula.Session or a dict of its options")
        self.model = model
        self.sync_every = sync_every
        self.samples_per_step = samples_per_step
        self.overlap_steps = overlap_steps
        self._in_flight = False
        self._since_begin = 0
        self.params = [_Param(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("nebula.torch: the model has no trainable parameter to sync")
        self.steps = 0  # inner steps since the last round
        self.samples = 0  # samples since the last round
        self.rounds = 0
        self.last_round: RoundInfo | None = None
        self._hook = None
        self._finished = False
        try:
            for prm in self.params:
                prm.to_host()
                self.session.register(prm.name, prm.host)
            self.session.start()  # theta_global = cluster 0's values, in the host buffers
            with torch.no_grad():
                for prm in self.params:
                    prm.from_host()
        except BaseException:
            if self._owns:
                self.session.close()
            raise
        if optimizer is not None:
            self._hook = optimizer.register_step_post_hook(
                lambda *_: self.step(self.samples_per_step)
            )

    @torch.no_grad()
    def step(self, samples: int | None = None) -> RoundInfo | None:
        """Counts one inner step; runs the round after every `sync_every` of them."""
        self.steps += 1
        self.samples += 1 if samples is None else int(samples)
        landed = None
        if self._in_flight:
            self._since_begin += 1
            if self._since_begin >= self.overlap_steps:
                landed = self._land()
        if self.steps < self.sync_every:
            return landed
        if self.overlap_steps == 0:
            return self.sync()
        self._begin()
        return landed

    def _begin(self) -> None:
        for prm in self.params:
            prm.to_host()
        self.session.round_begin(self.samples)
        self.steps = 0
        self.samples = 0
        self._in_flight = True
        self._since_begin = 0

    def _land(self) -> RoundInfo:
        for prm in self.params:
            prm.to_host()  # what was trained since the round began: the session keeps it
        self._in_flight = False
        info = self.session.round_end()
        for prm in self.params:
            prm.from_host()
        self.rounds += 1
        self.last_round = info
        return info

    @torch.no_grad()
    def sync(self) -> RoundInfo:
        """The blocking round now, whatever the step count (every cluster must call it: a round
        is collective); an overlapped round in flight lands first."""
        if self._in_flight:
            self._land()
        for prm in self.params:
            prm.to_host()
        info = self.session.round(self.samples)
        for prm in self.params:
            prm.from_host()
        self.steps = 0
        self.samples = 0
        self.rounds += 1
        self.last_round = info
        return info

    def save(self, path) -> None:
        """Writes the session's round state to `path` (Session.save: atomic, every cluster its
        own file). Right after a round, when the parameters hold theta_global: save the model's
        other state (buffers, frozen parameters) and the inner optimizer's beside it yourself."""
        if self.steps or self._in_flight:
            raise RuntimeError(
                f"nebula.torch: save right after a round ({self.steps} inner steps since the "
                "last one would not be in the checkpoint)"
            )
        self.session.save(path)

    @torch.no_grad()
    def load(self, path) -> None:
        """Restores a state written by save (every cluster its own, of the same round): the
        parameters then hold its theta_global and the next round continues the saved run.
        NebulaError for a file of another model, cluster or job setting, or a damaged one (the
        parameters are then unchanged)."""
        for prm in self.params:
            prm.to_host()  # the memory check of shared parameters
        self.session.load(path)
        for prm in self.params:
            prm.from_host()
        self.steps = 0
        self.samples = 0

    def finish(self) -> None:
        """The final hash-only exchange (every cluster calls it once, after its last round); an
        overlapped round in flight lands first."""
        if self._in_flight:
            self._land()
        self.session.finish()
        self._finished = True

    def global_hash(self) -> int:
        return self.session.global_hash()

    def close(self) -> None:
        """Removes the optimizer hook; closes the session when the wrapper opened it."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._owns:
            self.session.close()

    def __enter__(self) -> "DiLoCo":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None and not self._finished and not self.session.closed:
                self.finish()
        finally:
            self.close()
