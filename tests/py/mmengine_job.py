#!/usr/bin/env python3
"""A real mmengine Runner job on the CPU, for gpustall's real-framework tests.

  mmengine_job.py cpu --work-dir DIR [--workers 1] [--item-cpu-ms 60] [--step-ms 40]
                      [--iters 150] [--interval 10]
      mmengine 0.10's Runner (IterBasedTrainLoop, its LoggerHook every --interval iterations,
      its default LogProcessor: data_time as the mean of the last 10 iterations) trains a tiny
      model over a Dataset whose __getitem__ spends --item-cpu-ms of CPU (a decode and an
      augmentation), with --workers DataLoader workers (persistent, fork). Each step waits
      --step-ms for "the GPU" (a sleep). mmengine's own log goes to stdout as it does on a
      console. Needs torch and mmengine: run it with the test venv's python.

  mmengine_job.py oom --work-dir DIR [--workers 8] [--item-cpu-ms 150] [--grow-mib 2]
                      [--batch 2] [--iters 100000] [--interval 2]
      The same Runner, each worker keeping every sample it made in a cache of its own
      (--grow-mib MiB each, written so the pages are real): the workers' memory grows with
      every batch until the memory cgroup it runs in OOM-kills one, and the DataLoader raises
      "DataLoader worker (pid N) is killed by signal: Killed". The incident that started
      gpustall, on mmengine's own Runner.
"""
import argparse
import ctypes
import os
import time

PR_SET_NAME = 15


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=["cpu", "oom"])
    p.add_argument("--work-dir", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--item-cpu-ms", type=float, default=60)
    p.add_argument("--step-ms", type=float, default=40)
    p.add_argument("--iters", type=int, default=150)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--grow-mib", type=float, default=2)
    p.add_argument("--fetch-times", help="write the time spent in the DataLoader's next() here")
    p.add_argument("--batch", type=int, default=None)
    a = p.parse_args()
    if a.shape == "oom":
        a.batch = a.batch or 2

    import torch
    import torch.nn as nn
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import Dataset

    torch.set_num_threads(1)
    if a.fetch_times:
        time_fetches(a.fetch_times)

    class Net(BaseModel):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x, y, mode="loss"):
            time.sleep(a.step_ms / 1000)  # the step, on the GPU
            out = self.fc(x)
            if mode == "loss":
                return {"loss": nn.functional.cross_entropy(out, y)}
            return out

    class Augmented(Dataset):
        """Decode and augment: CPU work in torch, on the worker's one thread."""

        def __init__(self):
            self.cache = []

        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            x = torch.rand((64, 64), generator=g)
            w = torch.rand((64, 64), generator=g) / 64
            end = time.process_time() + a.item_cpu_ms / 1000
            while time.process_time() < end:
                x = torch.tanh(x @ w + x)
            if a.shape == "oom":
                # The cache that grows: real pages, this worker's own.
                kept = torch.empty(int(a.grow_mib * (1 << 20)) // 4, dtype=torch.float32)
                kept.fill_(float(i))
                self.cache.append(kept)
            return {"x": x.mean(dim=0), "y": torch.tensor(i % 10)}

    runner = Runner(
        model=Net(),
        work_dir=a.work_dir,
        train_dataloader=dict(
            dataset=Augmented(),
            batch_size=a.batch or 1,
            num_workers=a.workers,
            persistent_workers=True,
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
        ),
        train_cfg=dict(by_epoch=False, max_iters=a.iters),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        default_hooks=dict(
            logger=dict(type="LoggerHook", interval=a.interval),
            checkpoint=dict(type="CheckpointHook", interval=a.iters * 10),
        ),
        log_processor=dict(by_epoch=False),
        default_scope="mmengine",
    )
    runner.train()
    return 0


def time_fetches(path):
    """The trainer's time inside the DataLoader's next(), batch by batch, written to `path`
    as it goes (the job may be killed): what mmengine's data_time means to measure, without
    the hooks that run between its clock's two reads. Written as "seconds calls" for all the
    calls, then for those that returned a batch (the last one may raise instead, after
    waiting for a worker that was killed: no iteration of the log holds that wait)."""
    import torch.utils.data.dataloader as dl

    total = {"s": 0.0, "n": 0, "done_s": 0.0, "done_n": 0}
    inner = dl._BaseDataLoaderIter.__next__
    # Opened once and overwritten in place: the write lands inside mmengine's data_time (after
    # next() returns, before its clock's next read), and opening and truncating the file at
    # every batch took 3.8 ms a batch under the cgroup's memory pressure (0.52 s of a 6.6 s
    # log), time the log counted and next() did not.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def timed(self):
        t = time.perf_counter()
        done = False
        try:
            batch = inner(self)
            done = True
            return batch
        finally:
            took = time.perf_counter() - t
            total["s"] += took
            total["n"] += 1
            if done:
                total["done_s"] += took
                total["done_n"] += 1
            line = f'{total["s"]:14.4f} {total["n"]:10d} {total["done_s"]:14.4f} {total["done_n"]:10d}\n'
            os.pwrite(fd, line.encode(), 0)

    dl._BaseDataLoaderIter.__next__ = timed


if __name__ == "__main__":
    raise SystemExit(main())
