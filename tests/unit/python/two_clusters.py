"""The rendezvous of the multi-process tests: two clusters in two fresh interpreters ("spawn", as
two programs are), relayed by the parent. A cluster's process reports ("port", i, port) once its
session is open, gets the other's port, reports ("ready", i, None) once it added its peer (peers
must know each other before anyone starts) and gets "go", reports ("finished", i, None) after
finish and gets "close" once both finished (so neither closes while the other's finish waits on
it), then ("done", i, result); ("error", i, text) fails the test. run_ranks: the same for
clusters of several torch.distributed ranks, where only each cluster's leader meets the others."""

import multiprocessing as mp
import queue


def run(test, target, args, timeout_s):
    """Runs target(i, *args, to_parent, from_parent) for i = 0 and 1; returns {i: result}. Every
    process is stopped before it returns, also when the test fails."""
    ctx = mp.get_context("spawn")
    up = ctx.Queue()
    downs = [ctx.Queue() for _ in range(2)]
    procs = [ctx.Process(target=target, args=(i, *args, up, downs[i])) for i in range(2)]
    results, ports, ready, finished = {}, {}, set(), set()
    try:
        for p in procs:
            p.start()
        while len(results) < 2:
            try:
                kind, i, val = up.get(timeout=timeout_s)
            except queue.Empty:
                test.fail(f"no word from the clusters in {timeout_s} s; got {sorted(results)}")
            if kind == "port":
                ports[i] = val
                if len(ports) == 2:
                    for j in range(2):
                        downs[j].put(ports[1 - j])
            elif kind == "ready":
                ready.add(i)
                if len(ready) == 2:
                    for j in range(2):
                        downs[j].put("go")
            elif kind == "finished":
                finished.add(i)
                if len(finished) == 2:
                    for j in range(2):
                        downs[j].put("close")
            elif kind == "error":
                test.fail(f"cluster {i}: {val}")
            else:
                results[i] = val
        for p in procs:
            p.join(timeout_s)
            test.assertEqual(p.exitcode, 0)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return results


def run_ranks(test, target, args, n_clusters, ranks, timeout_s):
    """Runs target(cluster, rank, *args, store_dir, to_parent, from_parent) for every rank of
    every cluster (n_clusters x ranks fresh interpreters): each cluster a torch.distributed group
    of its own whose store is a file in store_dir (a temporary folder, removed at the end).
    Only the leaders (rank 0) take part in the rendezvous above, keyed by cluster: ("port", c,
    port) gets the {cluster: port} of every cluster, then ready/go and finished/close as in run.
    Every rank reports ("done", (c, r), result) or ("error", (c, r), text). Returns
    {(c, r): result}; every process is stopped before it returns, also when the test fails."""
    import tempfile

    ctx = mp.get_context("spawn")
    up = ctx.Queue()
    keys = [(c, r) for c in range(n_clusters) for r in range(ranks)]
    downs = {k: ctx.Queue() for k in keys}
    leaders = [(c, 0) for c in range(n_clusters)]
    results, ports, ready, finished = {}, {}, set(), set()
    with tempfile.TemporaryDirectory() as store_dir:
        procs = [ctx.Process(target=target, args=(*k, *args, store_dir, up, downs[k]))
                 for k in keys]
        try:
            for p in procs:
                p.start()
            while len(results) < len(keys):
                try:
                    kind, i, val = up.get(timeout=timeout_s)
                except queue.Empty:
                    test.fail(f"no word from the ranks in {timeout_s} s; got {sorted(results)}")
                if kind == "port":
                    ports[i] = val
                    if len(ports) == n_clusters:
                        for k in leaders:
                            downs[k].put(dict(ports))
                elif kind == "ready":
                    ready.add(i)
                    if len(ready) == n_clusters:
                        for k in leaders:
                            downs[k].put("go")
                elif kind == "finished":
                    finished.add(i)
                    if len(finished) == n_clusters:
                        for k in leaders:
                            downs[k].put("close")
                elif kind == "error":
                    test.fail(f"cluster {i[0]} rank {i[1]}: {val}")
                else:
                    results[i] = val
            for p in procs:
                p.join(timeout_s)
                test.assertEqual(p.exitcode, 0)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    return results
