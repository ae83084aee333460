"""A training loop that waits for its GPU: real torch DataLoader workers feed it, and each step
ends in the CUDA driver's cuStreamSynchronize, as `loss.item()` does, called through ctypes on
the project's stand-in libcuda.so.1 (cuda-stub: it spins or sleeps as GPUSTALL_CUDA_STUB says).

    gpu_job.py LIBCUDA gpu   # GPU-bound: fast samples, long synchronisations
    gpu_job.py LIBCUDA data  # data-starved: one worker burning CPU per sample, short syncs

It times its own waits (the ground truth the test compares gpustall with) and prints them as
one JSON line at the end: time in next(it), time in the synchronisations, its wall time.
"""

import argparse
import ctypes
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


def burn(ms):
    """Pure Python CPU work for about `ms` milliseconds."""
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += sum(i * i for i in range(200))
    return x


class Samples(Dataset):
    def __init__(self, n, cpu_ms):
        self.n, self.cpu_ms = n, cpu_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.cpu_ms:
            burn(self.cpu_ms)
        return torch.full((64,), float(i))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libcuda")
    ap.add_argument("shape", choices=["gpu", "data"])
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    cuda = ctypes.CDLL(a.libcuda)
    cuda.cuInit(0)
    # A real cuInit and the first context take seconds; the stand-in's is instant. The pause
    # stands for it: gpustall reads a trainer's maps at most once a second, and probes the
    # driver it finds then.
    time.sleep(2)
    if a.shape == "gpu":
        workers, item_ms, step_ms = 2, 0, 2
    else:
        workers, item_ms, step_ms = 1, 60, 2
    loader = DataLoader(Samples(a.steps, item_ms), batch_size=1, num_workers=workers)
    t0 = time.perf_counter()
    in_next = in_sync = 0.0
    it = iter(loader)
    steps = 0
    while True:
        a0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        a1 = time.perf_counter()
        burn(step_ms)  # the step's own host work
        a2 = time.perf_counter()
        cuda.cuStreamSynchronize(None)
        a3 = time.perf_counter()
        in_next += a1 - a0
        in_sync += a3 - a2
        steps += 1
        del batch
    print(json.dumps({
        "role": "trainer", "steps": steps, "next_s": in_next, "sync_s": in_sync,
        "loop_s": time.perf_counter() - t0,
    }), flush=True)


if __name__ == "__main__":
    main()
