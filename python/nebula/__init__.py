"""nebula for Python: a session per cluster leader that syncs the caller's own fp32 or bf16
tensors with the other clusters of a job, one blocking outer round (DiLoCo-style) after every H
inner steps.

A thin layer over libnebula's public C API (include/nebula.h, docs/api.md; the binding is
nebula/_cffi.py): every call is the C call, every C error is a NebulaError with the status name and
libnebula's message. It is not a training loop: nebula.torch wraps a user's own PyTorch model.

    with nebula.Session(job_id="demo", cluster_id="east", cluster_index=0, n_clusters=2,
                        listen="127.0.0.1:7000", peers=["west=127.0.0.1:7001"],
                        insecure=True, job_secret=secret) as s:
        s.register("w", w)          # a C-contiguous float32 numpy array, borrowed
        s.start()                   # w now holds cluster 0's values
        for _ in range(rounds):
            train(w, steps=H)
            info = s.round(samples=H * batch)
        s.finish()

Under a launcher that sets the NEBULA_* variables, nebula.Session.from_env(**overrides) opens
the same session from them. s.save(path) / s.load(path) checkpoint the round state.
"""

from __future__ import annotations

import dataclasses
import operator
import sys

from ._ffi import ffi as _cffi, lib as _lib, lib_path, header_path

__all__ = ["NebulaError", "Session", "RoundInfo", "version", "lib_path", "header_path"]

version = (_lib.NEBULA_VERSION_MAJOR, _lib.NEBULA_VERSION_MINOR, _lib.NEBULA_VERSION_PATCH)
__version__ = "%d.%d.%d" % version

_U64_MAX = (1 << 64) - 1


class NebulaError(Exception):
    """A libnebula call failed. `status` is the status name ("NB_ERR_CONFIG"), `code` its value,
    `message` libnebula's one-line message (nb_error_last), `call` the C function.

    `message` given: an error raised elsewhere and relayed (nebula.torch raises its cluster
    leader's error on the group's other ranks), not read from this thread's nb_error_last."""

    def __init__(self, call: str, code: int, message: str | None = None):
        self.call = call
        self.code = int(code)
        self.status = _cffi.string(_lib.nb_status_name(code)).decode()
        # thread-local in C and read right after the call on the same thread: it is this call's
        if message is not None:
            self.message = message
        else:
            self.message = _cffi.string(_lib.nb_error_last()).decode(errors="replace")
        if not self.message:
            self.message = _cffi.string(_lib.nb_status_str(code)).decode(errors="replace")
        super().__init__(f"{self.status}: {self.message}")


def _check(call: str, st: int) -> None:
    if st != _lib.NB_OK:
        raise NebulaError(call, st)


@dataclasses.dataclass(frozen=True)
class RoundInfo:
    """What one round did: the fields of nb_session_round_t (docs/api.md, "The round")."""

    round: int  # 0-based
    applied: bool  # the outer step was taken on every cluster
    samples: int  # ours, as given to round()
    samples_all: int  # every cluster's together: the weights' denominator
    msg_bytes: int  # our message (header and codec frame)
    bytes_sent: int  # what we put on the WAN this round
    density: float  # of our frame
    wait_s: float  # what the caller waited for the exchange (overlapped: inside round_end)
    exchange_s: float  # the exchange itself
    codec_s: float  # encode, decode and the outer step
    global_hash: int  # XXH3-64 of theta_global after the round, equal on every cluster
    update_norm: float  # L2 norm of the summed update the outer step took
    goodput_Bps: float  # the slowest peer link's measured rate, bytes/s (0: not yet measured)
    rtt_s: float  # the longest round trip to a peer, seconds (0: not yet measured)
    # fault-tolerant rounds (otherwise commits = round + 1 and every peer ok and alive)
    commits: int = 0  # rounds applied so far: theta_global's version
    peers_ok: int = 0  # peers whose update of this round arrived
    peers_alive: int = 0  # peers answering their heartbeat after the round
    late: bool = False  # a round held from before (its vote lost) was applied now
    pulled: bool = False  # we were behind and adopted a peer's global state
    next_round: int = 0  # the round we run next
    # adaptive density (otherwise next_density = density and sched "fixed")
    next_density: float = 0.0  # the density of our next frame, chosen after this round
    sched: str = "fixed"  # why: no_estimate, fit, ceiling, hold, floor_max_steps, or fixed
    point: str | None = None  # values "auto": the codec point of our next frame

    @classmethod
    def _from_c(cls, r) -> "RoundInfo":
        return cls(
            round=int(r.round),
            applied=bool(r.applied),
            samples=int(r.samples),
            samples_all=int(r.samples_all),
            msg_bytes=int(r.msg_bytes),
            bytes_sent=int(r.bytes_sent),
            density=float(r.density),
            wait_s=float(r.wait_s),
            exchange_s=float(r.exchange_s),
            codec_s=float(r.codec_s),
            global_hash=int(r.global_hash),
            update_norm=float(r.update_norm),
            goodput_Bps=float(r.goodput_Bps),
            rtt_s=float(r.rtt_s),
            commits=int(r.commits),
            peers_ok=int(r.peers_ok),
            peers_alive=int(r.peers_alive),
            late=bool(r.late),
            pulled=bool(r.pulled),
            next_round=int(r.next_round),
            next_density=float(r.next_density),
            sched=_cffi.string(r.sched).decode() if r.sched != _cffi.NULL else "fixed",
            point=_cffi.string(r.point).decode() if r.point != _cffi.NULL else None,
        )


def _cstr(keep: list, what: str, value):
    """A char* for a str option, kept alive in `keep` until nb_session_open returns."""
    if not isinstance(value, str):
        raise TypeError(f"nebula: {what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"nebula: {what} holds a NUL character")
    p = _cffi.new("char[]", value.encode())
    keep.append(p)
    return p


def _tensor_buffer(name: str, array):
    """(memoryview, shape, dtype) of a writable C-contiguous native buffer of float32 (fp32),
    float16 (fp16) or uint16 (bf16 bits), or a clear error.

    libnebula reads and writes the buffer in place at every round, so a copy (what a dtype or
    layout conversion would make) would silently sync nothing: refuse instead."""
    try:
        mv = memoryview(array)
    except TypeError:
        raise TypeError(
            f"nebula: tensor '{name}': {type(array).__name__} has no buffer "
            "(give a numpy array, or use nebula.torch for torch tensors)"
        ) from None
    fmt = mv.format
    if fmt[:1] in ("@", "=") or fmt[:1] == {"little": "<", "big": ">"}[sys.byteorder]:
        fmt = fmt[1:]  # native byte order, spelled out
    if fmt == "f" and mv.itemsize == 4:
        dtype = _lib.NB_DTYPE_FP32
    elif fmt == "H" and mv.itemsize == 2:
        dtype = _lib.NB_DTYPE_BF16  # the upper halves of float32s: bfloat16 bits
    elif fmt == "e" and mv.itemsize == 2:
        dtype = _lib.NB_DTYPE_FP16  # IEEE binary16
    else:
        dtype = getattr(array, "dtype", mv.format)
        raise TypeError(
            f"nebula: tensor '{name}' must be float32, float16, or uint16 holding bfloat16 bits "
            f"(native byte order), not {dtype}"
        )
    if not mv.c_contiguous:
        raise ValueError(
            f"nebula: tensor '{name}' must be C-contiguous (numpy.ascontiguousarray makes a "
            "copy: register the copy and train on it)"
        )
    if mv.readonly:
        raise ValueError(
            f"nebula: tensor '{name}' is read-only: the round writes theta_global into it"
        )
    return mv, tuple(mv.shape), dtype


_OPTION_KINDS = {
    "job_id": "str", "cluster_id": "str", "cluster_index": "u32", "n_clusters": "u32",
    "listen": "str", "peers": "peers", "pki_dir": "path", "insecure": "bool",
    "job_secret": "secret", "unsealed": "bool", "inner_steps": "int", "outer_lr": "real",
    "outer_momentum": "real", "density": "real", "values": "str", "error_feedback": "bool",
    "peer_timeout_s": "real", "update_norm_bound": "real", "fault_tolerant": "bool",
    "round_deadline_s": "real", "final_wait_s": "real", "rejoin": "bool",
    "rejoin_timeout_s": "real", "metrics_listen": "str", "start_timeout_s": "real",
    "adaptive": "bool", "density_min": "real", "density_max": "real", "rate_mbit": "real",
    "error_feedback_decay": "real", "eager": "bool", "topk_chunk": "u32",
}


def _set_options(o, keep: list, opts: dict) -> None:
    """Sets the nb_session_options_t fields named in opts (a value of None keeps what o holds:
    libnebula's default, or the environment's with from_env); every pointer is kept in `keep`
    until nb_session_open returns."""
    for key, v in opts.items():
        kind = _OPTION_KINDS.get(key)
        if kind is None:
            raise TypeError(f"nebula: unknown session option '{key}'")
        if v is None:
            continue
        if kind == "str":
            setattr(o, key, _cstr(keep, key, v))
        elif kind == "path":
            setattr(o, key, _cstr(keep, key, str(v)))
        elif kind == "u32":
            setattr(o, key, _uint(v, key, (1 << 32) - 1))
        elif kind == "int":
            setattr(o, key, _int(v, key))
        elif kind == "real":
            setattr(o, key, _real(v, key))
        elif kind == "bool":
            setattr(o, key, 1 if v else 0)
        elif kind == "peers":
            if isinstance(v, str):
                raise TypeError("nebula: peers must be a list of 'id=host:port', not one str")
            peers = list(v)
            o.peers, o.n_peers = _cffi.NULL, 0
            if peers:
                arr = _cffi.new("const char*[]", [_cstr(keep, "a peer", p) for p in peers])
                keep.append(arr)
                o.peers, o.n_peers = arr, len(peers)
        elif kind == "secret":
            try:
                secret = bytes(memoryview(v))
            except TypeError:
                raise TypeError("nebula: job_secret must be 32 bytes (bytes-like)") from None
            if len(secret) != 32:
                raise ValueError(f"nebula: job_secret must be 32 bytes, not {len(secret)}")
            p = _cffi.new("uint8_t[32]", secret)
            keep.append(p)
            o.job_secret = p


class Session:
    """One cluster's session (nb_session_t): open in the constructor, then add_peer / register,
    start, round after every H inner steps, finish, close. A context manager (close on exit).

    Keyword options are nb_session_options_t's fields (docs/api.md, "Options"); one left at None
    keeps libnebula's default (nb_session_options_default), so the defaults live in one place.
    insecure / unsealed / error_feedback are bools; job_secret is 32 bytes; peers a list of
    "id=host:port". One thread at a time per session; sessions are independent. The C calls
    release the GIL, so sessions in threads of one process run their rounds concurrently.
    """

    def __init__(
        self,
        *,
        job_id: str,
        cluster_id: str,
        cluster_index: int = 0,
        n_clusters: int = 1,
        listen: str | None = None,
        peers=(),
        pki_dir: str | None = None,
        insecure: bool = False,
        job_secret=None,
        unsealed: bool = False,
        inner_steps: int | None = None,
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        density: float | None = None,
        values: str | None = None,
        error_feedback: bool | None = None,
        peer_timeout_s: float | None = None,
        update_norm_bound: float | None = None,
        fault_tolerant: bool | None = None,
        round_deadline_s: float | None = None,
        final_wait_s: float | None = None,
        rejoin: bool | None = None,
        rejoin_timeout_s: float | None = None,
        metrics_listen: str | None = None,
        start_timeout_s: float | None = None,
        adaptive: bool | None = None,
        density_min: float | None = None,
        density_max: float | None = None,
        rate_mbit: float | None = None,
        error_feedback_decay: float | None = None,
        eager: bool | None = None,
        topk_chunk: int | None = None,
    ):
        o = _cffi.new("nb_session_options_t*")
        _lib.nb_session_options_default(o)
        self._open(o, dict(
            job_id=job_id, cluster_id=cluster_id, cluster_index=cluster_index,
            n_clusters=n_clusters, listen=listen, peers=peers, pki_dir=pki_dir,
            insecure=bool(insecure), job_secret=job_secret, unsealed=bool(unsealed),
            inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum,
            density=density, values=values, error_feedback=error_feedback,
            peer_timeout_s=peer_timeout_s, update_norm_bound=update_norm_bound,
            fault_tolerant=fault_tolerant, round_deadline_s=round_deadline_s,
            final_wait_s=final_wait_s, rejoin=rejoin, rejoin_timeout_s=rejoin_timeout_s,
            metrics_listen=metrics_listen, start_timeout_s=start_timeout_s, adaptive=adaptive,
            density_min=density_min, density_max=density_max, rate_mbit=rate_mbit,
            error_feedback_decay=error_feedback_decay, eager=eager,
            topk_chunk=topk_chunk))

    @classmethod
    def from_env(cls, **overrides) -> "Session":
        """A session from the NEBULA_* variables a launcher sets (nb_session_options_from_env:
        docs/api.md, "The environment"), then `overrides` (the constructor's keywords; None keeps
        the environment's value). A malformed variable is NebulaError NB_ERR_CONFIG naming it."""
        o = _cffi.new("nb_session_options_t*")
        _check("nb_session_options_from_env", _lib.nb_session_options_from_env(o))
        self = cls.__new__(cls)
        try:
            self._open(o, overrides)
        finally:
            _lib.nb_session_options_free(o)  # the session copied what it keeps
        return self

    @classmethod
    def from_descriptor(cls, path, cluster_id: str, **overrides) -> "Session":
        """A session for cluster `cluster_id` of a job descriptor (nb_session_options_from_descriptor:
        the job's settings from the file, the same mapping a gateway uses), then `overrides`: the
        deployment's (listen, peers, pki_dir or insecure, job_secret) and any other keyword. A bad
        descriptor or an unknown cluster is NebulaError NB_ERR_CONFIG naming it."""
        o = _cffi.new("nb_session_options_t*")
        keep = []
        _check("nb_session_options_from_descriptor", _lib.nb_session_options_from_descriptor(
            o, _cstr(keep, "path", str(path)), _cstr(keep, "cluster_id", cluster_id)))
        self = cls.__new__(cls)
        try:
            self._open(o, overrides)
        finally:
            _lib.nb_session_options_free(o)
        return self

    def _open(self, o, opts: dict) -> None:
        self._s = None
        self._tensors = {}  # name -> (the caller's object, its memoryview, the cdata): kept alive
        keep = []
        _set_options(o, keep, opts)
        out = _cffi.new("nb_session_t**")
        _check("nb_session_open", _lib.nb_session_open(o, out))
        self._s = out[0]

    # ---- the calls ----------------------------------------------------------------------------

    def _handle(self):
        if self._s is None:
            raise ValueError("nebula: the session is closed")
        return self._s

    @property
    def port(self) -> int:
        """The bound port of our exchange server (listen "host:0" picks one); -1 with one
        cluster."""
        return int(_lib.nb_session_port(self._handle()))

    @property
    def metrics_port(self) -> int:
        """The bound port of the metrics endpoint (metrics_listen "host:0" picks one); -1 without
        one."""
        return int(_lib.nb_session_metrics_port(self._handle()))

    def add_peer(self, peer: str) -> None:
        """Adds a peer cluster "id=host:port", before start."""
        keep = []
        cpeer = _cstr(keep, "peer", peer)
        _check("nb_session_add_peer", _lib.nb_session_add_peer(self._handle(), cpeer))

    def register(self, name: str, array) -> None:
        """Registers a synced tensor before start: a writable C-contiguous buffer (a numpy array,
        or anything with the buffer protocol) of float32, or of uint16 holding bfloat16 bits (a
        bf16 tensor: the session keeps theta_global in fp32 and writes it back rounded to nearest
        even). The session keeps a reference to it and reads and writes it in place at every
        round, so it must not be replaced: train on this very array. Its shape and dtype must
        match the other clusters' tensor at the same position."""
        s = self._handle()
        keep = []
        cname = _cstr(keep, "a tensor name", name)
        mv, shape, dtype = _tensor_buffer(name, array)
        # from_buffer keeps `array` alive (and a bytearray unresizable) as long as `data` lives
        ctype = "float[]" if dtype == _lib.NB_DTYPE_FP32 else "uint16_t[]"
        data = _cffi.from_buffer(ctype, mv, require_writable=True)
        cshape = _cffi.new("int64_t[]", list(shape) or [1])
        _check("nb_session_register_dtype",
               _lib.nb_session_register_dtype(s, cname, data, dtype, cshape, len(shape)))
        self._tensors[name] = (array, mv, data)

    @property
    def tensors(self) -> dict:
        """The registered objects by name, in registration order (the table's order)."""
        return {name: t[0] for name, t in self._tensors.items()}

    def start(self) -> None:
        """Connects to every peer and agrees on the tensor table; then every registered buffer
        holds cluster 0's values. Blocks until every peer answered (or is dead). A table or a
        setting that differs is NebulaError NB_ERR_CONFIG naming it, on every cluster."""
        _check("nb_session_start", _lib.nb_session_start(self._handle()))

    def round(self, samples: int) -> RoundInfo:
        """One blocking outer round after our inner steps; `samples` is what this cluster
        trained on since the previous round (its Delta's weight). Afterwards the buffers hold
        theta_global, bit-identical on every cluster. After a NebulaError the session can only
        be closed (the clusters no longer agree on the round)."""
        s = self._handle()
        n = _uint(samples, "samples", _U64_MAX)
        r = _cffi.new("nb_session_round_t*")
        _check("nb_session_round", _lib.nb_session_round(s, n, r))
        return RoundInfo._from_c(r)

    def round_begin(self, samples: int) -> bool:
        """The first half of an overlapped round: Delta from the buffers now, sent on a
        background thread; returns at once, and the caller keeps training on its buffers.
        round_end() lands it (docs/api.md, "The overlapped round"). True when the eager start
        (the option `eager`, a sparse frame) moved the buffers to the round's predicted landing:
        a caller that trains on a copy of them copies them back."""
        s = self._handle()
        n = _uint(samples, "samples", _U64_MAX)
        _check("nb_session_round_begin", _lib.nb_session_round_begin(s, n))
        return bool(_lib.nb_session_begin_moved(s))

    def round_ready(self) -> bool:
        """True when no overlapped round is in flight or its exchange is over, so that
        round_end() lands it without waiting: polled after each inner step, it lets a loop land
        the update as early as the link allows (the planned step being the latest)."""
        return bool(_lib.nb_session_round_ready(self._handle()))

    def round_end(self) -> RoundInfo:
        """Waits for the peers' updates of the round begun last, takes the outer step, and leaves
        in the buffers theta_global plus what was trained on them since round_begin."""
        r = _cffi.new("nb_session_round_t*")
        _check("nb_session_round_end", _lib.nb_session_round_end(self._handle(), r))
        return RoundInfo._from_c(r)

    def finish(self) -> None:
        """A final hash-only exchange after the last round, so its result is compared too."""
        _check("nb_session_finish", _lib.nb_session_finish(self._handle()))

    def set_loss(self, loss: float) -> None:
        """The training loss of the round about to run: "loss" in that round's progress line
        (nb_session_set_loss), so that a gateway's progress events show it."""
        _check("nb_session_set_loss", _lib.nb_session_set_loss(self._handle(),
                                                               _real(loss, "loss")))

    def global_hash(self) -> int:
        """XXH3-64 of theta_global now (0 before start)."""
        return int(_lib.nb_session_global_hash(self._handle()))

    def read_global(self, name: str):
        """Tensor `name`'s part of theta_global as a new float32 numpy array of its shape (for a
        bf16 tensor, the fp32 master its buffer is rounded from). After start."""
        import numpy as np  # only here: the binding itself does not need numpy

        s = self._handle()
        if name not in self._tensors:
            raise KeyError(f"nebula: no tensor '{name}'")
        shape = tuple(self._tensors[name][1].shape)
        out = np.empty(shape, dtype=np.float32)
        keep = []
        cname = _cstr(keep, "a tensor name", name)
        buf = _cffi.from_buffer("float[]", out, require_writable=True)
        _check("nb_session_read_global", _lib.nb_session_read_global(s, cname, buf, out.size))
        return out

    def save(self, path) -> None:
        """Writes the round state (theta_global, outer momentum, our error-feedback residual, the
        round counter, the tensor table) to `path` atomically: a checkpoint, between rounds.
        Every cluster saves its own file after the same round."""
        keep = []
        _check("nb_session_save", _lib.nb_session_save(self._handle(), _cstr(keep, "path",
                                                                             str(path))))

    def load(self, path) -> None:
        """Restores a state written by save, after start and before the next round; the
        registered buffers then hold the saved theta_global. Every cluster loads its own file of
        the same round. A file of another table, cluster or job setting, truncated or corrupted
        is NebulaError (NB_ERR_CONFIG, NB_ERR_INVALID, NB_ERR_INTEGRITY, NB_ERR_NOT_FOUND) and
        changes nothing."""
        keep = []
        _check("nb_session_load", _lib.nb_session_load(self._handle(), _cstr(keep, "path",
                                                                             str(path))))

    def close(self) -> None:
        """Stops the exchange and frees the session; the buffers stay the caller's. Idempotent."""
        s, self._s = self._s, None
        if s is not None:
            _lib.nb_session_close(s)
        self._tensors = {}

    @property
    def closed(self) -> bool:
        return self._s is None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # a session dropped without close still stops its server threads
        try:
            self.close()
        except Exception:
            pass


def _int(v, what: str) -> int:
    if not isinstance(v, bool):
        try:
            return operator.index(v)  # int, numpy integers; not float
        except TypeError:
            pass
    raise TypeError(f"nebula: {what} must be an int, not {type(v).__name__}")


def _uint(v, what: str, top: int) -> int:
    v = _int(v, what)
    if v < 0 or v > top:
        raise ValueError(f"nebula: {what} must be in [0, {top}], not {v}")
    return v


def _real(v, what: str) -> float:
    """A number for a float option; its range is libnebula's to check (one validator)."""
    if isinstance(v, (bool, str, bytes)):
        raise TypeError(f"nebula: {what} must be a number, not {type(v).__name__}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError(f"nebula: {what} must be a number, not {type(v).__name__}") from None
