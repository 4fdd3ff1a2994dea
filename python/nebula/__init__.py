"""nebula for Python: a session per cluster leader that syncs the caller's own fp32 tensors with
the other clusters of a job, one blocking outer round (DiLoCo-style) after every H inner steps.

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
    `message` libnebula's one-line message (nb_error_last), `call` the C function."""

    def __init__(self, call: str, code: int):
        self.call = call
        self.code = int(code)
        self.status = _cffi.string(_lib.nb_status_name(code)).decode()
        # thread-local in C and read right after the call on the same thread: it is this call's
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
    wait_s: float  # inside the exchange
    codec_s: float  # encode, decode and the outer step
    global_hash: int  # XXH3-64 of theta_global after the round, equal on every cluster

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
            codec_s=float(r.codec_s),
            global_hash=int(r.global_hash),
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


def _float32_buffer(name: str, array):
    """(memoryview, shape) of a writable C-contiguous native float32 buffer, or a clear error.

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
    if fmt != "f" or mv.itemsize != 4:
        dtype = getattr(array, "dtype", mv.format)
        raise TypeError(
            f"nebula: tensor '{name}' must be float32 (native byte order), not {dtype}"
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
    return mv, tuple(mv.shape)


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
    ):
        self._s = None
        self._tensors = {}  # name -> (the caller's object, its memoryview, the cdata): kept alive
        keep = []
        o = _cffi.new("nb_session_options_t*")
        _lib.nb_session_options_default(o)
        o.job_id = _cstr(keep, "job_id", job_id)
        o.cluster_id = _cstr(keep, "cluster_id", cluster_id)
        o.cluster_index = _uint(cluster_index, "cluster_index", (1 << 32) - 1)
        o.n_clusters = _uint(n_clusters, "n_clusters", (1 << 32) - 1)
        if listen is not None:
            o.listen = _cstr(keep, "listen", listen)
        if isinstance(peers, str):
            raise TypeError("nebula: peers must be a list of 'id=host:port', not one str")
        peers = list(peers)
        if peers:
            arr = _cffi.new("const char*[]", [_cstr(keep, "a peer", p) for p in peers])
            keep.append(arr)
            o.peers = arr
            o.n_peers = len(peers)
        if pki_dir is not None:
            o.pki_dir = _cstr(keep, "pki_dir", str(pki_dir))
        o.insecure = 1 if insecure else 0
        if job_secret is not None:
            try:
                secret = bytes(memoryview(job_secret))
            except TypeError:
                raise TypeError("nebula: job_secret must be 32 bytes (bytes-like)") from None
            if len(secret) != 32:
                raise ValueError(f"nebula: job_secret must be 32 bytes, not {len(secret)}")
            p = _cffi.new("uint8_t[32]", secret)
            keep.append(p)
            o.job_secret = p
        o.unsealed = 1 if unsealed else 0
        if inner_steps is not None:
            o.inner_steps = _int(inner_steps, "inner_steps")
        if outer_lr is not None:
            o.outer_lr = _real(outer_lr, "outer_lr")
        if outer_momentum is not None:
            o.outer_momentum = _real(outer_momentum, "outer_momentum")
        if density is not None:
            o.density = _real(density, "density")
        if values is not None:
            o.values = _cstr(keep, "values", values)
        if error_feedback is not None:
            o.error_feedback = 1 if error_feedback else 0
        if peer_timeout_s is not None:
            o.peer_timeout_s = _real(peer_timeout_s, "peer_timeout_s")
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

    def add_peer(self, peer: str) -> None:
        """Adds a peer cluster "id=host:port", before start."""
        keep = []
        cpeer = _cstr(keep, "peer", peer)
        _check("nb_session_add_peer", _lib.nb_session_add_peer(self._handle(), cpeer))

    def register(self, name: str, array) -> None:
        """Registers a synced tensor before start: a writable C-contiguous float32 buffer (a numpy
        array, or anything with the buffer protocol). The session keeps a reference to it and
        reads and writes it in place at every round, so it must not be replaced: train on this
        very array. Its shape must match the other clusters' tensor at the same position."""
        s = self._handle()
        keep = []
        cname = _cstr(keep, "a tensor name", name)
        mv, shape = _float32_buffer(name, array)
        # from_buffer keeps `array` alive (and a bytearray unresizable) as long as `data` lives
        data = _cffi.from_buffer("float[]", mv, require_writable=True)
        cshape = _cffi.new("int64_t[]", list(shape) or [1])
        _check("nb_session_register", _lib.nb_session_register(s, cname, data, cshape, len(shape)))
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

    def finish(self) -> None:
        """A final hash-only exchange after the last round, so its result is compared too."""
        _check("nb_session_finish", _lib.nb_session_finish(self._handle()))

    def global_hash(self) -> int:
        """XXH3-64 of theta_global now (0 before start)."""
        return int(_lib.nb_session_global_hash(self._handle()))

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
