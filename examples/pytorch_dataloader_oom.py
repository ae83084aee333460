#!/usr/bin/env python3
"""A real PyTorch job with the DataLoader memory bug gpustall explains (torch >= 2.0).

The Dataset caches every decoded image in a plain dict "to make epoch 2 faster". Each of the
4 persistent workers holds its own copy of that dict (they are separate processes), so host
memory grows by batch_size x 3 x H x W x 4 bytes per batch, until the memory limit forces
reclaim and swap (data_time climbs, the GPU idles) and the OOM killer SIGKILLs a worker:
"RuntimeError: DataLoader worker (pid N) is killed by signal: Killed."

    python3 examples/pytorch_dataloader_oom.py --log train.log
See examples/README.md for running it in a memory-limited cgroup under gpustall.
"""
import argparse
import datetime
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Images "stored compressed" (a seed per sample) and decoded on access."""

    def __init__(self, n, size, classes=10):
        self.n, self.size, self.classes = n, size, classes
        self.cache = {}  # THE BUG: unbounded, per worker, never evicted

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if index not in self.cache:  # never true in epoch 1: every sample is new
            g = torch.Generator().manual_seed(index)
            raw = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
            mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
            std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
            self.cache[index] = (raw.float() / 255 - mean) / std  # "decoded": float32, 4x the bytes
        return self.cache[index], index % self.classes


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", default="train.log", help="mmengine-style log, one line per step")
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--image-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(
        SyntheticImages(args.samples, args.image_size),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=4,
        prefetch_factor=2,
        persistent_workers=True,  # workers (and their caches) live across epochs
        pin_memory=True,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    total = len(loader)
    with open(args.log, "a", buffering=1) as log:
        for epoch in range(1, args.epochs + 1):
            t_start = t_end = time.monotonic()
            for step, (x, y) in enumerate(loader, 1):
                data_time = time.monotonic() - t_end  # waiting for the DataLoader
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()  # so that `time` includes the GPU's work
                now = time.monotonic()
                step_time, t_end = now - t_end, now
                eta = datetime.timedelta(seconds=int((now - t_start) / step * (total - step)))
                mem = torch.cuda.max_memory_allocated() >> 20 if device.type == "cuda" else 0
                log.write(
                    f"Epoch(train) [{epoch}][{step:5d}/{total}]  lr: 1.0000e-04  eta: {eta}  "
                    f"time: {step_time:.4f}  data_time: {data_time:.4f}  memory: {mem}  "
                    f"loss: {loss.item():.4f}\n"
                )


if __name__ == "__main__":  # needed by the spawn/forkserver start methods
    main()
