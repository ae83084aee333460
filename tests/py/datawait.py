#!/usr/bin/env python3
"""Trainers that measure their own data_time, for gpustall's data-wait tests.

Each trainer times every step's wait for its next batch with time.monotonic_ns() (the
training log's data_time) and prints the sum as data_ns in its JSON line. Workers name
themselves `pt_data_worker` as PyTorch's do.

  datawait.py torch [--workers 2] [--steps 20] [--item-ms 200] [--long-ms 6500]
                    [--long 6,13] [--step-ms 50] [--wait-go]
      A real torch DataLoader (fork workers, persistent_workers=True, batch_size=1) over a
      dataset whose __getitem__ sleeps --item-ms, or --long-ms for the items in --long: the
      main thread's _data_queue.get(timeout=5.0) times out inside those waits, and the other
      worker's batches arrive early and are reordered. Each step computes --step-ms (a tiny
      model's forward, backward and SGD step, repeated). Needs torch: run it with the torch
      venv's python.
  datawait.py torch-cpu [--workers 1] [--seconds 8] [--item-cpu-ms 50] [--fetch-ms 10]
                        [--step-ms 40] [--slow-worker K --slow-cpu-ms M] [--worker-start fork]
                        [--wait-go]
      A real torch DataLoader (workers started by --worker-start: fork, spawn or forkserver;
      persistent_workers=True, batch_size=1; run alone or as a torchrun rank) whose input
      pipeline is CPU-bound with no memory pressure: each __getitem__ fetches its sample (sleeps
      --fetch-ms, a read from storage) and transforms it with torch ops until its worker has
      used --item-cpu-ms of CPU time; each step waits --step-ms for "the GPU" (a sleep: the
      trainer takes little CPU). Steps for --seconds; the trainer's line adds elapsed_ns (the
      loop's wall time) and data_share (data_ns / elapsed_ns). --slow-worker K
      --slow-cpu-ms M: worker K's samples cost M ms instead (batch i is worker i mod N's).
      --epoch-steps S: epochs of S steps, the workers started anew each epoch
      (persistent_workers=False). --grow-mib G: each worker keeps every sample it made, G MiB
      each (real pages), until the memory cgroup OOM-kills one and the DataLoader raises.
      Needs torch.
  datawait.py torch-deadlock [--workers 4] [--slow-worker 2] [--steps 20] [--fetch-ms 10]
                             [--step-ms 40] [--heartbeat-ms 0] [--wait-go]
      A real torch DataLoader forked while another thread of the trainer holds a lock: the
      samples of worker --slow-worker take that lock, and that worker waits in acquire() for
      ever; the trainer waits for its batch for ever. Prints the worker pids first, then one
      line per step. --heartbeat-ms H: every 2 s a signal handler of the main thread (a
      watchdog, a metrics push) interrupts the trainer's wait and runs H ms on CPU before the
      wait goes on. Needs torch.
  datawait.py relay [--workers 2] [--steps 24] [--batch-ms 200] [--step-ms 60]
                    [--relay-timeout 5.0] [--wait-go]
      What DataLoader does with pin_memory=True on a GPU machine (torch/utils/data/_utils/
      pin_memory.py), in the standard library: a thread of the trainer named `pt_data_pin`
      moves batches from the workers' multiprocessing.Queue (get with --relay-timeout) to a
      queue.Queue, which the main thread reads with a 5 s timeout in a loop (_try_get_data).
      Each worker takes --batch-ms per batch (asleep); each step computes --step-ms.
  datawait.py reorder [--workers 3] [--steps 24] [--batch-ms 300,30,30] [--cpu]
                      [--step-ms 20] [--wait-go]
      DataLoader's _next_data without a pin thread: batches requested round robin, two in
      flight per worker, every worker puts into one shared result queue, and the trainer keeps
      a batch that arrives before its turn and waits again for the one it needs. Worker i takes
      the i-th of --batch-ms per batch (the last one for the rest): asleep, or with --cpu
      spinning until its process has used that much CPU time.

The trainer prints {"role": "trainer", "data_ns": .., "steps": .., "worker_pids": [..],
"waits": [per-step ns..]}; each worker {"role": "worker", "index": ..}.
"""
import argparse
import ctypes
import json
import os
import queue
import signal
import sys
import threading
import time

PR_SET_NAME = 15
MP_STATUS_CHECK_INTERVAL = 5.0  # torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL
PREFETCH_FACTOR = 2  # batches in flight per worker, DataLoader's default
# The tracer raises the trainer to off-CPU accounting at its next beat (once a second).
TRACER_BEAT_S = 1.2


def set_name(name):
    """Names the calling thread (the process, from its main thread), as torch does."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def say(role, **fields):
    fields.update(role=role, pid=os.getpid(), ppid=os.getppid())
    os.write(1, (json.dumps(fields) + "\n").encode())


def spin(ms):
    """Computes until `ms` of wall time has passed."""
    end = time.monotonic() + ms / 1000
    x = 0
    while time.monotonic() < end:
        for _ in range(200):
            x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF
    return x


def spin_cpu(ms):
    """Computes until this process has used `ms` of CPU time (on a shared CPU, longer)."""
    end = time.process_time() + ms / 1000
    x = 0
    while time.process_time() < end:
        for _ in range(200):
            x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF
    return x


def report(data_ns, worker_pids, **extra):
    say("trainer", data_ns=sum(data_ns), steps=len(data_ns), worker_pids=worker_pids,
        waits=data_ns, **extra)


# --- a real torch DataLoader -----------------------------------------------------------------

def torch_job(a):
    import torch  # names the process pt_main_thread
    from torch.utils.data import DataLoader, Dataset

    long_items = {int(i) for i in a.long.split(",") if i}

    class Sleepy(Dataset):
        def __len__(self):
            return a.steps

        def __getitem__(self, i):
            time.sleep((a.long_ms if i in long_items else a.item_ms) / 1000)
            return torch.full((64,), float(i))

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.set_num_threads(1)
    loader = DataLoader(Sleepy(), batch_size=1, num_workers=a.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    if a.wait_go:
        sys.stdin.readline()
    time.sleep(TRACER_BEAT_S)
    it = iter(loader)  # forks the workers
    pids = [w.pid for w in it._workers]
    data_ns = []
    for _ in range(a.steps):
        t = time.monotonic_ns()
        batch = next(it)
        data_ns.append(time.monotonic_ns() - t)
        end = time.monotonic() + a.step_ms / 1000
        while time.monotonic() < end:  # the step: forward, backward, SGD
            loss = model(batch).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    report(data_ns, pids)
    del it  # shuts the persistent workers down
    return 0


class AugmentedSamples:
    """Decode and augment: CPU work in torch, on the worker's one thread. A map-style dataset
    at module level (no torch base class needed), so that spawned workers can unpickle it."""

    def __init__(self, a):
        self.epoch_steps, self.fetch_ms = a.epoch_steps, a.fetch_ms
        self.item_cpu_ms, self.slow_worker, self.slow_cpu_ms = a.item_cpu_ms, a.slow_worker, a.slow_cpu_ms
        self.grow_mib, self.cache = a.grow_mib, []

    def __len__(self):
        return self.epoch_steps or 1 << 20

    def __getitem__(self, i):
        import torch
        time.sleep(self.fetch_ms / 1000)  # the sample's read from storage
        g = torch.Generator().manual_seed(i)
        x = torch.rand((64, 64), generator=g)
        w = torch.rand((64, 64), generator=g) / 64
        cost = self.item_cpu_ms
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == self.slow_worker:
            cost = self.slow_cpu_ms  # a straggler: this worker's samples cost more
        end = time.process_time() + cost / 1000
        while time.process_time() < end:
            x = torch.tanh(x @ w + x)
        if self.grow_mib:
            # Every sample kept in this worker's own cache (real pages): it grows until the
            # memory cgroup OOM-kills a worker.
            kept = torch.empty(int(self.grow_mib * (1 << 20)) // 4, dtype=torch.float32)
            kept.fill_(float(i))
            self.cache.append(kept)
        return x.mean(dim=0)


def torch_cpu_job(a):
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    # --epoch-steps: epochs of that many steps with workers started anew each epoch.
    persistent = not a.epoch_steps
    loader = DataLoader(AugmentedSamples(a), batch_size=1, num_workers=a.workers,
                        persistent_workers=persistent, multiprocessing_context=a.worker_start)
    if a.wait_go:
        sys.stdin.readline()
    time.sleep(TRACER_BEAT_S)
    it = iter(loader)  # forks the workers
    pids = [w.pid for w in it._workers]
    data_ns = []
    start = time.monotonic_ns()
    while time.monotonic_ns() - start < a.seconds * 1e9:
        t = time.monotonic_ns()
        try:
            batch = next(it)
        except StopIteration:  # the epoch's end: its workers exit, the next epoch's start
            it = iter(loader)
            pids += [w.pid for w in it._workers]
            batch = next(it)
        data_ns.append(time.monotonic_ns() - t)
        time.sleep(a.step_ms / 1000)  # the step, on the GPU
        del batch
    elapsed = time.monotonic_ns() - start
    report(data_ns, pids, elapsed_ns=elapsed, data_share=round(sum(data_ns) / elapsed, 4))
    del it  # shuts the persistent workers down
    return 0


def torch_deadlock_job(a):
    """A lock held by another thread of the trainer when the DataLoader forks its workers:
    every worker inherits it locked, and the one whose samples need it waits in acquire()
    for ever (no thread in the worker will release it)."""
    import threading

    import torch
    from torch.utils.data import DataLoader, Dataset

    cache_lock = threading.Lock()  # a cache, a logging handler, a client library's lock

    class Cached(Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            if i % a.workers == a.slow_worker:
                with cache_lock:  # this worker's samples go through the cache
                    pass
            time.sleep(a.fetch_ms / 1000)
            return torch.full((16,), float(i))

    loader = DataLoader(Cached(), batch_size=1, num_workers=a.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    if a.wait_go:
        sys.stdin.readline()
    time.sleep(TRACER_BEAT_S)
    held = threading.Event()

    def holder():
        with cache_lock:
            held.set()
            time.sleep(0.5)  # held across the fork below

    threading.Thread(target=holder, daemon=True).start()
    held.wait()
    it = iter(loader)  # forks the workers while the lock is held
    say("trainer", worker_pids=[w.pid for w in it._workers])
    if a.heartbeat_ms:
        def heartbeat(*_):
            end = time.process_time() + a.heartbeat_ms / 1000
            while time.process_time() < end:
                pass

        signal.signal(signal.SIGALRM, heartbeat)
        signal.setitimer(signal.ITIMER_REAL, 2.0, 2.0)
    for _ in range(a.steps):
        t = time.monotonic_ns()
        next(it)
        say("step", data_ns=time.monotonic_ns() - t)
        time.sleep(a.step_ms / 1000)
    return 0


# --- standard-library DataLoader shapes ------------------------------------------------------

def worker_loop(index, index_queue, result_queue, batch_ms, cpu):
    set_name("pt_data_worker")
    say("worker", index=index)
    while True:
        try:
            idx = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            continue
        if idx is None:
            break
        if cpu:
            spin_cpu(batch_ms)
        else:
            time.sleep(batch_ms / 1000)
        result_queue.put((idx, b"\x07" * 4096))
    result_queue.cancel_join_thread()
    os._exit(0)


class Loader:
    """The workers and the queues between them and the trainer, as _MultiProcessingDataLoaderIter
    sets them up with the fork start method."""

    def __init__(self, n, batch_ms, steps, cpu):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        self.steps = steps
        self.n = n
        self.result_queue = ctx.Queue()
        self.index_queues = []
        self.workers = []
        for i in range(n):
            iq = ctx.Queue()
            iq.cancel_join_thread()
            w = ctx.Process(target=worker_loop,
                            args=(i, iq, self.result_queue, batch_ms[min(i, len(batch_ms) - 1)],
                                  cpu),
                            daemon=True)
            w.start()
            self.index_queues.append(iq)
            self.workers.append(w)
        self.send_idx = 0  # next batch to request
        self.rcvd_idx = 0  # next batch to hand the trainer
        self.reorder = {}  # batches that arrived before their turn
        for _ in range(PREFETCH_FACTOR * n):
            self.try_put_index()

    def try_put_index(self):
        if self.send_idx < self.steps:
            self.index_queues[self.send_idx % self.n].put(self.send_idx)
            self.send_idx += 1

    def next_data(self, get_data):
        """_next_data: the batch rcvd_idx, keeping any other that arrives meanwhile."""
        while True:
            if self.rcvd_idx in self.reorder:
                data = self.reorder.pop(self.rcvd_idx)
                break
            idx, data = get_data()
            if idx != self.rcvd_idx:
                self.reorder[idx] = data
                continue
            break
        self.rcvd_idx += 1
        self.try_put_index()
        return data

    def shutdown(self):
        for iq in self.index_queues:
            iq.put(None)
        for w in self.workers:
            w.join(timeout=10)

    def pids(self):
        return [w.pid for w in self.workers]


def try_get(q, timeout=MP_STATUS_CHECK_INTERVAL):
    """_get_data: _try_get_data in a loop until it succeeds."""
    while True:
        try:
            return q.get(timeout=timeout)
        except queue.Empty:
            continue


def train(loader, get_data, steps, step_ms, gpu_step=False):
    """`gpu_step`: the step waits (a sleep, as a trainer waits for its GPU) instead of computing,
    so that the trainer takes no CPU from the workers."""
    data_ns = []
    for _ in range(steps):
        t = time.monotonic_ns()
        loader.next_data(get_data)
        data_ns.append(time.monotonic_ns() - t)
        if gpu_step:
            time.sleep(step_ms / 1000)
        else:
            spin(step_ms)
    return data_ns


def relay(a):
    if a.wait_go:
        sys.stdin.readline()
    time.sleep(TRACER_BEAT_S)
    loader = Loader(a.workers, [a.batch_ms], a.steps, cpu=False)
    out = queue.Queue()
    done = threading.Event()

    def pin_memory_loop():
        set_name("pt_data_pin")
        while not done.is_set():
            try:
                r = loader.result_queue.get(timeout=a.relay_timeout)
            except queue.Empty:
                continue
            while not done.is_set():
                try:
                    out.put(r, timeout=MP_STATUS_CHECK_INTERVAL)
                    break
                except queue.Full:
                    continue

    pin = threading.Thread(target=pin_memory_loop, daemon=True)
    pin.start()
    data_ns = train(loader, lambda: try_get(out), a.steps, a.step_ms)
    report(data_ns, loader.pids())
    done.set()
    loader.shutdown()
    return 0


def reorder(a):
    if a.wait_go:
        sys.stdin.readline()
    time.sleep(TRACER_BEAT_S)
    batch_ms = [float(x) for x in a.batch_ms.split(",")]
    loader = Loader(a.workers, batch_ms, a.steps, cpu=a.cpu)
    data_ns = train(loader, lambda: try_get(loader.result_queue), a.steps, a.step_ms,
                    gpu_step=a.gpu_step)
    report(data_ns, loader.pids())
    loader.shutdown()
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=["torch", "torch-cpu", "torch-deadlock", "relay", "reorder"])
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--item-ms", type=float, default=200)
    p.add_argument("--long-ms", type=float, default=6500)
    p.add_argument("--long", default="6,13")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--item-cpu-ms", type=float, default=50)
    p.add_argument("--fetch-ms", type=float, default=10)
    p.add_argument("--slow-worker", type=int, default=-1)
    p.add_argument("--worker-start", choices=["fork", "spawn", "forkserver"], default="fork",
                   help="torch-cpu: the workers' start method (multiprocessing_context)")
    p.add_argument("--epoch-steps", type=int, default=0)
    p.add_argument("--slow-cpu-ms", type=float, default=0)
    p.add_argument("--grow-mib", type=float, default=0,
                   help="torch-cpu: each worker keeps every sample, this many MiB each")
    p.add_argument("--batch-ms", default=None)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--gpu-step", action="store_true",
                   help="the trainer's step sleeps (waits for a GPU) instead of computing")
    p.add_argument("--step-ms", type=float, default=None)
    p.add_argument("--heartbeat-ms", type=float, default=0,
                   help="torch-deadlock: a 2 s heartbeat in the main thread, this long on CPU")
    p.add_argument("--relay-timeout", type=float, default=MP_STATUS_CHECK_INTERVAL)
    p.add_argument("--wait-go", action="store_true", help="read a line from stdin first")
    a = p.parse_args()
    defaults = {"torch": (2, 20, None, 50), "torch-cpu": (1, None, None, 40),
                "torch-deadlock": (4, 20, None, 40), "relay": (2, 24, "200", 60),
                "reorder": (3, 24, "300,30,30", 20)}[a.shape]
    for name, value in zip(["workers", "steps", "batch_ms", "step_ms"], defaults):
        if getattr(a, name) is None:
            setattr(a, name, value)
    if a.shape == "relay":
        a.batch_ms = float(a.batch_ms)
    return {"torch": torch_job, "torch-cpu": torch_cpu_job, "torch-deadlock": torch_deadlock_job,
            "relay": relay, "reorder": reorder}[a.shape](a)


if __name__ == "__main__":
    sys.exit(main())
