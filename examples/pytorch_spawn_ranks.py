#!/usr/bin/env python3
"""torch.multiprocessing.spawn ranks, each with a DataLoader, for gpustall's roles (torch >= 2.0).

The script spawns --ranks ranks (as Lightning's ddp_spawn does); each rank iterates a
DataLoader with --workers workers started by --worker-start (fork, spawn or forkserver: the
DataLoader's multiprocessing_context) and pin_memory=True. gpustall reports the script as the
trainer, the spawned children as ranks (each `rank+pin`: its pin-memory thread), and each
rank's workers as its own DataLoader (`dataloader_of`), whatever the start method.

    sudo gpustall trace -- python3 examples/pytorch_spawn_ranks.py --worker-start spawn
"""
import argparse
import time

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """Samples that take a while to make, so the workers are seen working."""

    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.005)
        return torch.full((3, 64, 64), float(index)), index % 10


def rank_main(rank, args):
    loader = DataLoader(
        Slow(),
        batch_size=32,
        num_workers=args.workers,
        pin_memory=True,  # a pt_data_pin thread in the rank (pinning needs an accelerator)
        multiprocessing_context=args.worker_start,
    )
    model = torch.nn.Linear(3 * 64 * 64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.3f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--worker-start", choices=["fork", "spawn", "forkserver"], default="fork")
    args = p.parse_args()
    mp.spawn(rank_main, args=(args,), nprocs=args.ranks)  # start_method="spawn"


if __name__ == "__main__":
    main()
