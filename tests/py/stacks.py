"""Jobs whose Python lines gpustall must name (tests/tests/py_stacks.rs).

  stacks.py cpu [--workers 1] [--seconds 8] [--wait-go]
      A real torch DataLoader whose __getitem__ calls decode_tile_expensive, pure Python on
      the worker's CPU (about 60 ms a sample); the trainer asks for a batch every 20 ms, so
      it waits for its worker most of the time, at the `next(it)` line.
  stacks.py big [--workers 8] [--batch 40] [--steps 60] [--wait-go]
      Batches of 80 MiB of float32 (40 samples of 8x256x256) from 8 workers: the trainer
      spends part of each `next(it)` on its own CPU receiving the batch, besides waiting for
      it. Prints each step's time in next() ({"role": "step", "data_ns": ...}).
  stacks.py plain [--seconds 6]
      No torch: the process itself spins in spin_hot (a job whose interpreter is only visible
      in its own mount namespace, started by the test).

Each prints first a JSON line {"role": "lines", ...} with the lines the test expects to see
named (read with inspect, so an edit of this file does not break the test), and at the end
{"role": "trainer", ...}.
"""

import argparse
import inspect
import json
import sys
import time


def say(role, **fields):
    print(json.dumps({"role": role, **fields}), flush=True)


def decode_tile_expensive(i, ms):
    """The sample's decode: pure Python, on the CPU."""
    end = time.process_time() + ms / 1000
    s = i
    while time.process_time() < end:
        s = (s * 1103515245 + 12345) % 2147483648
    return s


def span(fn):
    lines, first = inspect.getsourcelines(fn)
    return [first, first + len(lines) - 1]


def line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, l in enumerate(lines) if l.strip().startswith(text))


def cpu_job(a):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Tiles(Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            decode_tile_expensive(i, a.item_cpu_ms)
            return torch.zeros(8)

    torch.set_num_threads(1)
    loader = DataLoader(Tiles(), batch_size=1, num_workers=a.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    say("lines", hot=span(decode_tile_expensive), next=line_of(cpu_job, "batch = next(it)"),
        file=__file__)
    if a.wait_go:
        sys.stdin.readline()
    it = iter(loader)
    steps = 0
    start = time.monotonic()
    while time.monotonic() - start < a.seconds:
        batch = next(it)
        time.sleep(a.step_ms / 1000)  # the step, on the GPU
        steps += 1
        del batch
    say("trainer", steps=steps, worker_pids=[w.pid for w in it._workers])
    del it
    return 0


def big_job(a):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Tensors(Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            return torch.full((8, 256, 256), float(i % 7))

    torch.set_num_threads(1)
    loader = DataLoader(Tensors(), batch_size=a.batch, num_workers=a.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    say("lines", next=line_of(big_job, "batch = next(it)"), file=__file__)
    if a.wait_go:
        sys.stdin.readline()
    it = iter(loader)
    total = 0
    for _ in range(a.steps):
        t = time.monotonic_ns()
        batch = next(it)
        data_ns = time.monotonic_ns() - t
        total += data_ns
        say("step", data_ns=data_ns)
        time.sleep(a.step_ms / 1000)  # the step, on the GPU
        del batch
    say("trainer", data_ns=total, worker_pids=[w.pid for w in it._workers])
    del it
    return 0


def spin_hot(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def plain_job(a):
    say("lines", hot=span(spin_hot), file=__file__)
    if a.wait_go:
        sys.stdin.readline()
    say("trainer", spins=spin_hot(a.seconds))
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=["cpu", "big", "plain"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--item-cpu-ms", type=float, default=60)
    p.add_argument("--step-ms", type=float, default=20)
    p.add_argument("--batch", type=int, default=40)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--wait-go", action="store_true")
    a = p.parse_args()
    return {"cpu": cpu_job, "big": big_job, "plain": plain_job}[a.shape](a)


if __name__ == "__main__":
    sys.exit(main())
