"""DiLoCo across clusters, DDP (or FSDP2 with --fsdp2) inside each: one torchrun per cluster,
every rank this program. Rank 0 of each cluster opens the nebula session; nebula.torch.DiLoCo
broadcasts each round's theta_global to the other ranks (with FSDP2: gathers the shards to rank 0
before the round and scatters theta_global back into them after it). A tiny regression model on synthetic data, CPU (gloo) or GPU
(NCCL), so that it runs anywhere; not a benchmark. Two clusters on one machine:

    PYTHONPATH=python torchrun --nproc-per-node 2 --master-port 29500 \
        examples/torch/ddp_diloco.py --cluster 0 &
    PYTHONPATH=python torchrun --nproc-per-node 2 --master-port 29501 \
        examples/torch/ddp_diloco.py --cluster 1

Loopback, insecure and unsealed for the demo only: across datacenters give pki_dir and a
job_secret (docs/python.md), or run under a launcher that sets NEBULA_* (--from-env).
"""

import argparse

import torch
import torch.distributed as dist

import nebula
import nebula.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", type=int, default=0, help="this cluster's index")
    ap.add_argument("--clusters", default="east=127.0.0.1:7000,west=127.0.0.1:7001",
                    help="every cluster's id=host:port, in index order")
    ap.add_argument("--from-env", action="store_true",
                    help="open the session from the NEBULA_* variables instead")
    ap.add_argument("--sync-every", type=int, default=8, help="H: inner steps per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--fsdp2", action="store_true",
                    help="shard the model with fully_shard (FSDP2) instead of DDP")
    a = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's env: this cluster's ranks
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(rank)  # DDP takes rank 0's weights, the session cluster 0's
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1)).to(device)
    if a.fsdp2:  # every rank holds half of each parameter; the session starts them all the same
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)

    session = None
    if rank == 0:  # the leader alone holds the session; the other ranks give None
        if a.from_env:
            session = nebula.Session.from_env(inner_steps=a.sync_every)
        else:
            clusters = a.clusters.split(",")
            ids = [c.split("=", 1)[0] for c in clusters]
            session = nebula.Session(
                job_id="ddp-demo", cluster_id=ids[a.cluster], cluster_index=a.cluster,
                n_clusters=len(clusters), listen=clusters[a.cluster].split("=", 1)[1],
                peers=[c for i, c in enumerate(clusters) if i != a.cluster],
                insecure=True, unsealed=True, inner_steps=a.sync_every, density=0.25,
                outer_lr=0.7, outer_momentum=0.5,
                values="int8")

    g = torch.Generator().manual_seed(7)
    w_true = torch.randn(16, generator=g)  # the same function everywhere; each rank's data its own
    own = torch.Generator().manual_seed(1000 * a.cluster + rank)
    with nebula.torch.DiLoCo(session, ddp, sync_every=a.sync_every) as diloco:
        seen = 0.0  # this rank's loss summed over the round's steps
        for _ in range(a.sync_every * a.rounds):
            x = (1 + 0.5 * a.cluster) * torch.randn(a.batch, 16, generator=own)
            y = torch.tanh(x @ w_true / 4)
            x, y = x.to(device), y.to(device)
            loss = torch.mean((ddp(x).squeeze(-1) - y) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += loss.item()
            info = diloco.step(samples=len(x))  # every rank; summed over the cluster
            if info is not None:
                if rank == 0:
                    print(f"cluster {a.cluster} round {info.round}: mean loss "
                          f"{seen / a.sync_every:.4f}, "
                          f"{info.samples} of {info.samples_all} samples, {info.bytes_sent} "
                          f"bytes sent, hash {info.global_hash:016x}", flush=True)
                seen = 0.0
    if session is not None:
        print(f"cluster {a.cluster}: {world} ranks, final hash {diloco.global_hash():016x}")
        session.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
