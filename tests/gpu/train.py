"""A real CUDA training loop for the GPU check (tests/gpu/check.sh), about a minute long.

    train.py starved SECONDS   # workers sleep per sample: the GPU waits for data
    train.py gpu SECONDS       # large matmuls, a fast loader: the trainer waits for the GPU

Each step ends in loss.item(), which waits for the GPU (cuStreamSynchronize or a blocking
copy), as a real training loop does. It times its own waits and prints them as one JSON line:
time in next(it), time in loss.item(), steps, wall time.
"""

import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, sleep_s, dim):
        self.sleep_s, self.dim = sleep_s, dim

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.randn(self.dim)


def main():
    shape, seconds = sys.argv[1], float(sys.argv[2])
    dev = torch.device("cuda")
    # starved: 32 samples of 100 ms each per batch, 2 workers: a batch every 1.6 s, a step of
    # milliseconds. gpu: 256-row batches through 40 matmuls of 8192 x 8192 (about 1.4 TFLOP a
    # step, tens of ms on an H100), a batch the workers make in a millisecond or two.
    if shape == "starved":
        dim, sleep_s, workers, width, batch = 1024, 0.1, 2, 1024, 32
    else:
        dim, sleep_s, workers, width, batch = 1024, 0.0, 2, 8192, 256
    loader = DataLoader(Samples(sleep_s, dim), batch_size=batch, num_workers=workers)
    w_in = torch.randn(dim, width, device=dev)
    w = torch.randn(width, width, device=dev) / width**0.5
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    in_next = in_item = 0.0
    steps = 0
    it = iter(loader)
    while time.perf_counter() - t0 < seconds:
        a0 = time.perf_counter()
        x = next(it).to(dev, non_blocking=True)
        a1 = time.perf_counter()
        h = x @ w_in
        reps = 1 if shape == "starved" else 40
        for _ in range(reps):
            h = torch.tanh(h @ w)
        loss = h.float().pow(2).mean()
        a2 = time.perf_counter()
        loss.item()
        a3 = time.perf_counter()
        in_next += a1 - a0
        in_item += a3 - a2
        steps += 1
    print(json.dumps({"role": "trainer", "shape": shape, "steps": steps, "next_s": in_next,
                      "item_s": in_item, "loop_s": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
