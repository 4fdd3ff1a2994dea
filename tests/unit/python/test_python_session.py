"""The Python binding (python/nebula) over libnebula.so, as a user's numpy program sees it: two
clusters in two processes on loopback, each a linear model y = W x + b of its own (W 16x16, b 16)
trained by numpy SGD on its own data, synced by outer rounds; a mismatched tensor table (two
sessions in threads of one process: the C calls release the GIL); bad inputs refused in Python
before C; the header-derived declarations against the library. No mocks: the real library.

Exits 77 (CTest: skipped) when numpy or cffi is missing."""

import gc
import os
import sys
import threading
import time
import unittest

try:
    import numpy as np
    import cffi  # noqa: F401
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

import nebula  # noqa: E402
from nebula import _ffi  # noqa: E402
import two_clusters  # noqa: E402  (beside this file)

DIM, N_DATA, BATCH, H, ROUNDS = 16, 256, 32, 10, 8
TIMEOUT_S = 90  # the processes' own bound; CTest's TIMEOUT is above it
OPTS = dict(job_id="py-train", n_clusters=2, listen="127.0.0.1:0", insecure=True, unsealed=True,
            inner_steps=H, outer_lr=0.8, outer_momentum=0.5, density=0.25, values="int8",
            peer_timeout_s=10)
NAMES = ("east", "west")


def make_side(index):
    """The true map is the same everywhere; each cluster's inputs have their own scale and offset
    and its initial W its own seed (theta then comes from cluster 0)."""
    truth = np.random.default_rng(12345)
    wt = truth.uniform(-0.25, 0.25, (DIM, DIM))
    bt = truth.uniform(-0.5, 0.5, DIM)
    own = np.random.default_rng(1000 + index)
    x = ((1.0 + 0.5 * index) * own.uniform(-1, 1, (N_DATA, DIM)) + 0.2 * index).astype(np.float32)
    y = (x @ wt.T + bt + 0.01 * own.uniform(-1, 1, (N_DATA, DIM))).astype(np.float32)
    w = (0.1 * own.uniform(-1, 1, (DIM, DIM))).astype(np.float32)
    b = np.zeros(DIM, dtype=np.float32)
    return w, b, x, y


def loss(w, b, x, y):
    e = x.astype(np.float64) @ w.T.astype(np.float64) + b - y
    return float(np.mean(e * e))


def sgd_steps(w, b, x, y, at):
    """H steps of minibatch SGD, in place (the session's buffers are these very arrays)."""
    lr = np.float32(0.05)
    for _ in range(H):
        idx = np.arange(at, at + BATCH) % N_DATA
        at += BATCH
        xb, yb = x[idx], y[idx]
        e = (2.0 / (BATCH * DIM)) * (xb @ w.T + b - yb)
        w -= lr * (e.T @ xb).astype(np.float32)
        b -= lr * e.sum(axis=0).astype(np.float32)
    return at


def cluster_main(index, to_parent, from_parent):
    """One cluster's process: open, tell the parent our port, learn the peer's, train."""
    try:
        w, b, x, y = make_side(index)
        with nebula.Session(cluster_id=NAMES[index], cluster_index=index, **OPTS) as s:
            s.register("w", w)
            s.register("b", b)
            to_parent.put(("port", index, s.port))
            s.add_peer(f"{NAMES[1 - index]}=127.0.0.1:{from_parent.get(timeout=TIMEOUT_S)}")
            # a cluster refuses a sender it does not know yet: start once both know each other
            to_parent.put(("ready", index, None))
            from_parent.get(timeout=TIMEOUT_S)
            s.start()
            w_start = w.copy()
            loss0 = loss(w, b, x, y)
            at, infos = 0, []
            for _ in range(ROUNDS):
                at = sgd_steps(w, b, x, y, at)
                infos.append(s.round(H * BATCH))
            s.finish()
            # close only once both finished: a close cuts the acks of our server's last calls,
            # and the slower peer's finish would fail (docs/python.md, "Not there yet")
            to_parent.put(("finished", index, None))
            from_parent.get(timeout=TIMEOUT_S)
            to_parent.put(("done", index, dict(w=w.copy(), b=b.copy(), w_start=w_start,
                                               loss0=loss0, loss1=loss(w, b, x, y),
                                               infos=infos, hash=s.global_hash())))
    except BaseException as e:  # the parent reports it
        to_parent.put(("error", index, f"{type(e).__name__}: {e}"))


class TwoProcesses(unittest.TestCase):
    def test_train_two_clusters(self):
        results = two_clusters.run(self, cluster_main, (), TIMEOUT_S)

        w0_initial = make_side(0)[0]
        for i in range(2):
            r = results[i]
            print(f"cluster {i}: loss {r['loss0']:.5f} -> {r['loss1']:.5f} over {ROUNDS} rounds, "
                  f"{r['infos'][-1].bytes_sent} bytes sent last round")
            # theta_global starts as cluster 0's values
            np.testing.assert_array_equal(r["w_start"], w0_initial)
            self.assertLess(r["loss1"], 0.5 * r["loss0"])
            last = r["infos"][-1]
            self.assertIsInstance(last, nebula.RoundInfo)
            self.assertEqual([inf.round for inf in r["infos"]], list(range(ROUNDS)))
            self.assertTrue(last.applied)
            self.assertEqual(last.samples, H * BATCH)
            self.assertEqual(last.samples_all, 2 * H * BATCH)
            self.assertGreater(last.bytes_sent, 0)
            self.assertLess(last.msg_bytes, (DIM * DIM + DIM) * 4)  # compressed
            self.assertEqual(last.global_hash, r["hash"])
            self.assertEqual((last.sched, last.next_density), ("fixed", 0.25))  # not adaptive
            self.assertIsNone(last.point)  # values "auto" only
        # bit-identical parameters and the same hash on both clusters
        self.assertEqual(results[0]["w"].tobytes(), results[1]["w"].tobytes())
        self.assertEqual(results[0]["b"].tobytes(), results[1]["b"].tobytes())
        self.assertEqual(results[0]["hash"], results[1]["hash"])
        self.assertNotEqual(results[0]["hash"], 0)


class TableMismatch(unittest.TestCase):
    def test_mismatch_names_the_tensor(self):
        """Cluster 1 registers b with another shape: start fails on both, naming 'b'."""
        secret = bytes(range(1, 33))  # sealed this time: the job_secret path
        opts = dict(OPTS, job_id="py-mismatch", unsealed=False, job_secret=secret)
        sessions, arrays = [], []
        try:
            for i in range(2):
                sessions.append(nebula.Session(cluster_id=NAMES[i], cluster_index=i, **opts))
                w, b = np.zeros((DIM, DIM), np.float32), np.zeros(DIM // (1 + i), np.float32)
                arrays.append((w, b))
                sessions[i].register("w", w)
                sessions[i].register("b", b)
            sessions[0].add_peer(f"west=127.0.0.1:{sessions[1].port}")
            sessions[1].add_peer(f"east=127.0.0.1:{sessions[0].port}")
            errors = [None, None]

            def start(i):
                try:
                    sessions[i].start()
                except nebula.NebulaError as e:
                    errors[i] = e

            threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT_S)
                self.assertFalse(t.is_alive(), "start did not return")
            for i in range(2):
                e = errors[i]
                self.assertIsInstance(e, nebula.NebulaError, f"cluster {i} started")
                print(f"cluster {i}: {e}")
                self.assertEqual(e.status, "NB_ERR_CONFIG")
                self.assertEqual(e.call, "nb_session_start")
                self.assertIn("tensor 1 differs: 'b'", e.message)
                self.assertIn("at cluster " + NAMES[1 - i], e.message)
                self.assertIn("'b'", str(e))
                with self.assertRaises(nebula.NebulaError) as cm:
                    sessions[i].round(1)  # after a failed start the session only closes
                self.assertEqual(cm.exception.status, "NB_ERR_INVALID")
        finally:
            for s in sessions:
                s.close()


class FaultTolerant(unittest.TestCase):
    def test_dead_peer_skips_and_rejoin(self):
        """fault_tolerant: west's death costs east rounds (applied False, no exception); a new
        west on the same address rejoins with rejoin=True and both end on one theta_global."""
        opts = dict(OPTS, job_id="py-ft", fault_tolerant=True, update_norm_bound=0,
                    peer_timeout_s=1, round_deadline_s=2, final_wait_s=20)
        arrays = [np.full(DIM, float(i + 1), np.float32) for i in range(3)]
        sessions = []

        def both(fn):
            out, errors = [None, None], [None, None]

            def run(i):
                try:
                    out[i] = fn(i)
                except BaseException as e:  # reported below
                    errors[i] = e

            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT_S)
                self.assertFalse(t.is_alive(), "a session call did not return")
            self.assertEqual(errors, [None, None])
            return out

        def until(s, a, commits):
            """Rounds (one step towards a's own target each) until `commits` were applied."""
            infos = []
            for _ in range(400):
                a -= 0.2 * (a - (3.0 if s is sessions[0] else -3.0))
                time.sleep(0.005)  # a real step takes time: a lone survivor would race
                infos.append(s.round(1))
                if infos[-1].commits >= commits:
                    break
            return infos

        try:
            for i in range(2):
                sessions.append(nebula.Session(cluster_id=NAMES[i], cluster_index=i, **opts))
                sessions[i].register("x", arrays[i])
            west_port = sessions[1].port
            sessions[0].add_peer(f"west=127.0.0.1:{west_port}")
            sessions[1].add_peer(f"east=127.0.0.1:{sessions[0].port}")
            both(lambda i: sessions[i].start())
            first = both(lambda i: until(sessions[i], arrays[i], 2))
            self.assertTrue(all(inf.applied and inf.peers_ok == 1 for inf in first[0] + first[1]))
            def overlapped(i):  # begin, a step while the update and the vote are in flight
                sessions[i].round_begin(1)
                arrays[i] *= 0.5
                return sessions[i].round_end()
            ov = both(overlapped)
            self.assertTrue(all(inf.applied and inf.commits == 3 for inf in ov))
            self.assertEqual(ov[0].global_hash, ov[1].global_hash)
            sessions[1].close()  # west dies
            alone = [sessions[0].round(1) for _ in range(3)]
            print("east alone:", [(inf.round, inf.applied, inf.peers_alive) for inf in alone])
            self.assertFalse(any(inf.applied for inf in alone))
            self.assertEqual(alone[-1].commits, 3)
            again = nebula.Session(cluster_id="west", cluster_index=1, rejoin=True,
                                   rejoin_timeout_s=30,
                                   **dict(opts, listen=f"127.0.0.1:{west_port}"))
            sessions.append(again)
            again.register("x", arrays[2])
            again.add_peer(f"east=127.0.0.1:{sessions[0].port}")
            again.start()
            np.testing.assert_array_equal(arrays[2], again.read_global("x"))
            pair = [sessions[0], again]
            last = both(lambda i: until(pair[i], arrays[2 * i], 5))
            both(lambda i: pair[i].finish())
            self.assertGreaterEqual(last[0][-1].commits, 5)
            self.assertEqual(sessions[0].global_hash(), again.global_hash())
            self.assertEqual(arrays[0].tobytes(), arrays[2].tobytes())
        finally:
            for s in sessions:
                s.close()


def solo(**kw):
    """A one-cluster session: no peers, nothing on the network."""
    return nebula.Session(**dict(dict(job_id="py-solo", cluster_id="solo", insecure=True,
                                      unsealed=True), **kw))


class Metrics(unittest.TestCase):
    """metrics_listen: the session serves the cluster leader's Prometheus metrics."""

    def scrape(self, port):
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            self.assertEqual(r.status, 200)
            return r.read().decode()

    @staticmethod
    def sample(text, series):
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split(" ", 1)[1])
        return None

    def test_solo_serves(self):
        with solo() as s:
            self.assertEqual(s.metrics_port, -1)
        with solo(metrics_listen="127.0.0.1:0", inner_steps=3) as s:
            self.assertGreater(s.metrics_port, 0)
            x = np.arange(4, dtype=np.float32)
            s.register("x", x)
            s.start()
            for r in range(2):
                x += 1
                s.set_loss(1.5)
                s.round(4)
            text = self.scrape(s.metrics_port)
            self.assertEqual(self.sample(text, "nebula_leader_round"), 2)
            self.assertEqual(self.sample(text, "nebula_leader_step"), 6)
            self.assertEqual(self.sample(text, "nebula_leader_loss"), 1.5)
            self.assertIn('nebula_leader_info{job_name="py-solo",cluster="solo"} 1', text)
        with self.assertRaises(nebula.NebulaError) as cm:
            solo(metrics_listen="localhost")
        self.assertIn("metrics_listen", cm.exception.message)

    def test_from_env(self):
        os.environ.update(NEBULA_JOB_ID="py-env", NEBULA_CLUSTER_ID="solo", NEBULA_INSECURE="1",
                          NEBULA_UNSEALED="1", NEBULA_METRICS_LISTEN="127.0.0.1:0")
        try:
            with nebula.Session.from_env() as s:
                self.assertGreater(s.metrics_port, 0)
                self.assertIn('nebula_leader_info{job_name="py-env",cluster="solo"} 1',
                              self.scrape(s.metrics_port))
        finally:
            for k in ("NEBULA_JOB_ID", "NEBULA_CLUSTER_ID", "NEBULA_INSECURE", "NEBULA_UNSEALED",
                      "NEBULA_METRICS_LISTEN"):
                os.environ.pop(k, None)


class EagerStart(unittest.TestCase):
    def test_eager_start(self):
        """round_begin says whether it moved the buffers (the eager start of a sparse frame:
        one cluster predicts its own landing); eager=False or a dense frame leaves them."""
        for eager, density, moves in ((None, 0.5, True), (False, 0.5, False), (True, 1.0, False)):
            with solo(eager=eager, density=density, values="fp32", outer_momentum=0.5) as s:
                x = np.arange(8, dtype=np.float32)
                s.register("x", x)
                s.start()
                x -= 1
                before = x.copy()
                self.assertEqual(s.round_begin(8), moves)
                predicted = x.copy()
                info = s.round_end()
                self.assertTrue(info.applied)
                self.assertEqual(not np.array_equal(predicted, before), moves)
                if moves:
                    np.testing.assert_allclose(predicted, x, atol=1e-5)


class BadInputs(unittest.TestCase):
    def test_options(self):
        with self.assertRaisesRegex(ValueError, "job_secret must be 32 bytes, not 31"):
            solo(unsealed=False, job_secret=b"x" * 31)
        with self.assertRaisesRegex(TypeError, "job_secret must be 32 bytes"):
            solo(job_secret="x" * 32)  # a str is not bytes
        with self.assertRaisesRegex(TypeError, "job_id must be a str"):
            solo(job_id=7)
        with self.assertRaisesRegex(ValueError, "NUL"):
            solo(cluster_id="a\0b")
        with self.assertRaisesRegex(TypeError, "peers must be a list"):
            solo(peers="west=127.0.0.1:1")
        with self.assertRaisesRegex(TypeError, "n_clusters must be an int"):
            solo(n_clusters=2.0)
        with self.assertRaisesRegex(ValueError, r"cluster_index must be in \[0"):
            solo(cluster_index=-1)
        with self.assertRaisesRegex(TypeError, "outer_lr must be a number"):
            solo(outer_lr="0.7")
        with self.assertRaises(TypeError):
            solo(no_such_option=1)
        # what only libnebula checks comes back as NebulaError with its status and message
        cases = [(dict(insecure=False), "NB_ERR_CONFIG", "pki_dir"),
                 (dict(unsealed=False), "NB_ERR_CONFIG", "job_secret"),
                 (dict(values="int7"), "NB_ERR_INVALID", "int7"),
                 (dict(cluster_index=1), "NB_ERR_CONFIG", ""),
                 (dict(outer_lr=0.0), "NB_ERR_CONFIG", "outer_lr"),
                 (dict(adaptive=True, density_min=0.5, density_max=0.1), "NB_ERR_CONFIG",
                  "density_min"),
                 (dict(rate_mbit=-1.0), "NB_ERR_CONFIG", "rate_mbit"),
                 (dict(values="auto"), "NB_ERR_CONFIG", "adaptive"),
                 (dict(error_feedback_decay=0.0), "NB_ERR_CONFIG", "error_feedback_decay")]
        for kw, status, text in cases:
            with self.subTest(**kw):
                with self.assertRaises(nebula.NebulaError) as cm:
                    solo(**kw)
                self.assertEqual(cm.exception.status, status)
                self.assertEqual(cm.exception.call, "nb_session_open")
                self.assertIn(text, cm.exception.message)
                self.assertTrue(str(cm.exception).startswith(status + ": "))

    def test_register(self):
        with solo() as s:
            ro = np.zeros(4, np.float32)
            ro.flags.writeable = False
            cases = [(np.zeros(4), TypeError, "must be float32.*not float64"),
                     (np.zeros(4, np.int16), TypeError, "must be float32, float16"),
                     (np.zeros(4, ">f4"), TypeError, "native byte order"),
                     (np.zeros((4, 4), np.float32)[:, ::2], ValueError, "C-contiguous"),
                     (np.zeros((4, 4), np.float32).T, ValueError, "C-contiguous"),
                     (ro, ValueError, "read-only"),
                     ([1.0, 2.0], TypeError, "has no buffer"),
                     (bytearray(16), TypeError, "must be float32")]
            for arr, exc, text in cases:
                with self.subTest(arr=repr(arr)[:40]):
                    with self.assertRaisesRegex(exc, text):
                        s.register("x", arr)
            with self.assertRaisesRegex(ValueError, "NUL"):
                s.register("x\0y", np.zeros(4, np.float32))
            with self.assertRaises(nebula.NebulaError) as cm:
                s.register("z", np.zeros(0, np.float32))  # C: dimension 0 is 0
            self.assertEqual(cm.exception.status, "NB_ERR_INVALID")
            self.assertIn("'z'", cm.exception.message)
            s.register("v", np.zeros(4, np.float32))
            with self.assertRaises(nebula.NebulaError) as cm:
                s.register("v", np.zeros(4, np.float32))
            self.assertEqual(cm.exception.status, "NB_ERR_EXISTS")
            with self.assertRaisesRegex(ValueError, "samples must be in"):
                s.round(-1)
            with self.assertRaises(nebula.NebulaError) as cm:
                s.round(1)
            self.assertEqual(cm.exception.status, "NB_ERR_INVALID")
            self.assertIn("before start", cm.exception.message)
        with self.assertRaisesRegex(ValueError, "closed"):
            s.start()
        s.close()  # idempotent

    def test_nan_is_refused_by_c(self):
        """No NaN check in Python: libnebula refuses the round and applies nothing."""
        with solo(density=1.0, values="fp32") as s:
            v = np.arange(64, dtype=np.float32)
            s.register("v", v)
            s.start()
            v[3] = np.nan
            before = v.copy()
            h = s.global_hash()
            with self.assertRaises(nebula.NebulaError) as cm:
                s.round(1)
            self.assertEqual(cm.exception.status, "NB_ERR_INVALID")
            self.assertIn("not finite", cm.exception.message)
            self.assertEqual(s.global_hash(), h)
            np.testing.assert_array_equal(v, before)

    def test_buffers_kept_alive(self):
        """The session holds the registered arrays: a temporary one stays valid for the C side."""
        with solo(density=1.0, values="fp32") as s:
            s.register("v", np.arange(64, dtype=np.float32))
            s.register("s", np.zeros((), np.float32))  # a scalar: ndim 0
            gc.collect()
            v = s.tensors["v"]
            self.assertEqual(list(s.tensors), ["v", "s"])
            s.start()
            v[:] = 1.0
            info = s.round(5)
            self.assertTrue(info.applied)
            self.assertEqual((info.round, info.samples, info.samples_all), (0, 5, 5))
            self.assertEqual(s.port, -1)  # one cluster: no server
            # the round wrote theta_global into the very array that was registered
            self.assertFalse(np.array_equal(v, np.ones(64, np.float32)))
            self.assertEqual(info.global_hash, s.global_hash())


def bf16_round(f):
    """float32 -> bfloat16 bits, round to nearest even (the reference: numpy, not libnebula)."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def run_threads(fns):
    """Runs each fn in a thread of its own (the C calls release the GIL); their results, or the
    exception one raised."""
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: B902 - the test reports it
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT_S)
        assert not th.is_alive(), "a cluster's thread did not return"
    return out


def pair(job, registers, **kw):
    """Two connected sessions in this process; registers(i, session) registers cluster i's."""
    opts = dict(OPTS, job_id=job, **kw)
    sessions = [nebula.Session(cluster_id=NAMES[i], cluster_index=i, **opts) for i in range(2)]
    for i in range(2):
        registers(i, sessions[i])
    sessions[0].add_peer(f"west=127.0.0.1:{sessions[1].port}")
    sessions[1].add_peer(f"east=127.0.0.1:{sessions[0].port}")
    return sessions


class FromEnv(unittest.TestCase):
    VARS = ("NEBULA_JOB_ID", "NEBULA_CLUSTER_ID", "NEBULA_INSECURE", "NEBULA_UNSEALED",
            "NEBULA_VALUES", "NEBULA_DENSITY", "NEBULA_N_CLUSTERS", "NEBULA_JOB_SECRET_FILE")

    def setUp(self):
        self.saved = {k: os.environ.pop(k, None) for k in self.VARS}

    def tearDown(self):
        for k, v in self.saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v

    def test_from_env_and_overrides(self):
        os.environ.update(NEBULA_JOB_ID="py-env", NEBULA_CLUSTER_ID="solo", NEBULA_INSECURE="1",
                          NEBULA_UNSEALED="1", NEBULA_VALUES="fp32", NEBULA_DENSITY="1")
        with nebula.Session.from_env(inner_steps=4) as s:
            v = np.arange(8, dtype=np.float32)
            s.register("v", v)
            s.start()
            v += 1
            self.assertEqual(s.round(3).samples_all, 3)
        with self.assertRaises(TypeError):
            nebula.Session.from_env(no_such_option=1)

    def test_from_descriptor(self):
        import tempfile
        doc = ('{"apiVersion": "nebula/v1", "kind": "TrainingJob", "metadata": {"name": "py-d"},'
               ' "spec": {"clusters": [{"id": "solo"}], "program": {"command": ["/bin/true"]},'
               ' "sync": {"innerSteps": 6}}}')
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.json")
            with open(path, "w") as f:
                f.write(doc)
            with nebula.Session.from_descriptor(path, "solo", insecure=True, unsealed=True) as s:
                x = np.zeros(4, np.float32)
                s.register("x", x)
                s.start()
                self.assertTrue(s.round(1).applied)
            with self.assertRaises(nebula.NebulaError) as cm:
                nebula.Session.from_descriptor(path, "elsewhere", insecure=True, unsealed=True)
            self.assertEqual(cm.exception.status, "NB_ERR_CONFIG")
            self.assertIn("'elsewhere' is not in $.spec.clusters (solo)", cm.exception.message)

    def test_bad_variable_names_it(self):
        for var, value in (("NEBULA_DENSITY", "1.5"), ("NEBULA_N_CLUSTERS", "0"),
                           ("NEBULA_INSECURE", "yes"), ("NEBULA_JOB_SECRET_FILE", "/nonexistent")):
            with self.subTest(var=var):
                os.environ[var] = value
                with self.assertRaises(nebula.NebulaError) as cm:
                    nebula.Session.from_env(job_id="x", cluster_id="y")
                del os.environ[var]
                self.assertEqual(cm.exception.status, "NB_ERR_CONFIG")
                self.assertEqual(cm.exception.call, "nb_session_options_from_env")
                self.assertIn(var, cm.exception.message)


class Bf16(unittest.TestCase):
    def test_bf16_and_fp32_tensors(self):
        """Cluster-local updates of a bf16 'w' and an fp32 'b', three rounds: both clusters hold
        the same buffers, and w is the fp32 master rounded to nearest even."""
        arrays = []

        def registers(i, s):
            w = bf16_round(np.linspace(-2, 2, 48, dtype=np.float32).reshape(6, 8) * (1 + i))
            b = np.full(5, 0.5 * i, np.float32)
            arrays.append((w, b))
            s.register("w", w)
            s.register("b", b)

        sessions = pair("py-bf16", registers, values="fp32", density=1.0)
        try:
            def cluster(i):
                s, (w, b) = sessions[i], arrays[i]
                s.start()
                out = []
                for r in range(3):
                    w[:] = bf16_round(bf16_float(w) + np.float32(0.01 * (i + 1) * (r + 1)))
                    b -= np.float32(0.1 * (i + 1))
                    info = s.round(8)
                    out.append((w.copy(), b.copy(), s.read_global("w"), info.global_hash))
                return out

            res = run_threads([lambda: cluster(0), lambda: cluster(1)])
            for r in res:
                if isinstance(r, BaseException):
                    raise r
            for k in range(3):
                (w0, b0, m0, h0), (w1, b1, m1, h1) = res[0][k], res[1][k]
                self.assertEqual(h0, h1)
                np.testing.assert_array_equal(w0, w1)
                np.testing.assert_array_equal(b0, b1)
                np.testing.assert_array_equal(m0, m1)
                self.assertEqual(m0.shape, (6, 8))
                np.testing.assert_array_equal(w0, bf16_round(m0))
            self.assertFalse(np.array_equal(bf16_float(bf16_round(m0)), m0))  # rounding worked
            np.testing.assert_array_equal(sessions[0].read_global("b"), arrays[0][1])
        finally:
            for s in sessions:
                s.close()

    def test_dtype_mismatch_names_the_tensor(self):
        def registers(i, s):
            s.register("w", np.zeros(4, np.uint16 if i == 0 else np.float32))

        sessions = pair("py-bf16-mismatch", registers)
        try:
            res = run_threads([sessions[0].start, sessions[1].start])
            for i, e in enumerate(res):
                self.assertIsInstance(e, nebula.NebulaError)
                self.assertEqual(e.status, "NB_ERR_CONFIG")
                self.assertIn("tensor 0 'w' is " + ("bf16" if i == 0 else "fp32"), e.message)
        finally:
            for s in sessions:
                s.close()


class Checkpoint(unittest.TestCase):
    def test_save_load_same_rounds(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "state.bin")
            v = np.linspace(0, 1, 32, dtype=np.float32)
            hashes = []
            with solo(density=0.25, outer_momentum=0.5) as s:
                s.register("v", v)
                s.start()
                for r in range(4):
                    if r == 2:
                        s.save(path)
                        saved = v.copy()
                    v += np.float32(0.01) * np.arange(32, dtype=np.float32) * (r + 1)
                    hashes.append(s.round(1).global_hash)
            u = np.zeros(32, np.float32)
            with solo(density=0.25, outer_momentum=0.5) as s:
                s.register("v", u)
                s.start()
                s.load(path)
                np.testing.assert_array_equal(u, saved)
                for r in range(2, 4):
                    u += np.float32(0.01) * np.arange(32, dtype=np.float32) * (r + 1)
                    self.assertEqual(s.round(1).global_hash, hashes[r])
                # a corrupted and a truncated file are refused, nothing changes
                data = open(path, "rb").read()
                bad = os.path.join(d, "bad.bin")
                for content, status in ((data[:100] + bytes([data[100] ^ 1]) + data[101:],
                                         "NB_ERR_INTEGRITY"), (data[:-9], "NB_ERR_INVALID")):
                    with open(bad, "wb") as f:
                        f.write(content)
                    h = s.global_hash()
                    with self.assertRaises(nebula.NebulaError) as cm:
                        s.load(bad)
                    self.assertEqual(cm.exception.status, status)
                    self.assertEqual(s.global_hash(), h)
            with solo(outer_momentum=0.5) as s:  # another table
                s.register("x", np.zeros(32, np.float32))
                s.start()
                with self.assertRaises(nebula.NebulaError) as cm:
                    s.load(path)
                self.assertEqual(cm.exception.status, "NB_ERR_CONFIG")
                self.assertIn("'x'", cm.exception.message)


class Header(unittest.TestCase):
    def test_cdef_from_header(self):
        text = ('/* c */\n#ifndef G\n#define G\n#include <x.h>\n#ifdef __cplusplus\nextern "C" {\n'
                '#endif\n#define K 3 /* k */\n#define S "s"\nint f(int a); // f\n'
                '#ifdef __cplusplus\n}\n#endif\n#endif\n')
        self.assertEqual(_ffi.cdef_from_header(text).split(), "#define K 3 int f(int a);".split())

    def test_every_declared_function_is_exported(self):
        names = [n for n in dir(_ffi.lib) if n.startswith("nb_")]
        for n in ("nb_session_open", "nb_session_round", "nb_session_global_hash",
                  "nb_session_options_from_env", "nb_session_register_dtype", "nb_session_save",
                  "nb_session_load", "nb_status_name", "nb_error_last"):
            self.assertIn(n, names)
        for n in names:
            getattr(_ffi.lib, n)  # raises when libnebula does not export a declared name
        self.assertEqual(nebula.__version__, "%d.%d.%d" % nebula.version)
        self.assertTrue(os.path.exists(nebula.header_path))


if __name__ == "__main__":
    unittest.main(verbosity=2)
