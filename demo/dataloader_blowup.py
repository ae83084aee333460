#!/usr/bin/env python3
"""A training job shaped like a PyTorch DataLoader memory blow-up, in the standard library only.

The trainer (this process) forks N workers the way PyTorch's fork start method does, and the
workers name themselves `pt_data_worker` as PyTorch's do. Each worker reads its batch's files,
hands the batch to the trainer through shared memory and keeps a per-worker cache of "decoded
samples" that is never evicted (the bug: an unbounded lru_cache / dict in a Dataset). Under a
memory cgroup limit this walks the whole chain gpustall explains: memcg reclaim, swap-out, a
growing data_time in the training log, and finally an OOM kill of a worker, after which the
trainer fails with PyTorch's own error message.

  python3 demo/dataloader_blowup.py --data-dir DIR --log FILE [--workers 3]
      [--cache-mib-per-batch 6] [--batch-files 8] [--mosaic 3] [--steps 400] [--step-ms 50] [--wait-go]
"""
import argparse
import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from multiprocessing import resource_tracker, shared_memory

PREFETCH_FACTOR = 2  # batches in flight per worker, as DataLoader's default
N_FILES, FILE_BYTES = 64, 1 << 20
TRAINER = os.getpid()  # forked workers inherit it
IN_FLIGHT = set()  # batches requested from workers and not consumed yet
# For the tests: when the trainer's receive began in a step not logged yet, and when its latest
# poll returned (CLOCK_MONOTONIC ns). A step that fails logs nothing: its wait is not in the log.
RECEIVING = {"since": None, "polled": None}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--log", required=True, help="mmengine-style training log, one line per step")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--cache-mib-per-batch", type=float, default=6.0)
    p.add_argument("--batch-files", type=int, default=8)
    p.add_argument("--mosaic", type=int, default=3, help="earlier cached samples each batch reads again")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-ms", type=float, default=50.0, help="stand-in for the GPU's time per step")
    p.add_argument("--wait-go", action="store_true", help="read one line from stdin first (lets a tracer attach)")
    return p.parse_args()


def say(**fields):
    # One write(2) per line: the trainer and its workers share the pipe, lines must not interleave.
    os.write(1, (json.dumps(fields) + "\n").encode())


def dataset_files(data_dir):
    os.makedirs(data_dir, exist_ok=True)
    if not os.listdir(data_dir):
        for i in range(N_FILES):
            with open(os.path.join(data_dir, f"sample_{i:03d}.bin"), "wb") as f:
                f.write(os.urandom(FILE_BYTES))
    return sorted(os.path.join(data_dir, n) for n in os.listdir(data_dir))


def block_name(batch):
    """The shared-memory block of a batch; named by the trainer's pid so it can free any block."""
    return f"demo_{TRAINER}_{batch}"


def worker_main(index, conn, files, args):
    # PyTorch names its workers through prctl(PR_SET_NAME); gpustall recognises them by it.
    ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)
    say(role="worker", index=index, pid=os.getpid())
    decoded = {}  # THE BUG: a per-worker cache of decoded samples that is never evicted
    cache_bytes = int(args.cache_mib_per_batch * (1 << 20))
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            break  # the trainer is gone
        if batch is None:
            break
        names = [files[(batch * args.batch_files + k) % len(files)] for k in range(args.batch_files)]
        data = b"".join(open(n, "rb").read() for n in names)  # real reads through the page cache
        # "Decoding" with random augmentation: every entry is new, so the cache never hits and
        # only grows. os.urandom writes every byte: real anonymous memory, not lazy zero pages.
        decoded[batch] = os.urandom(cache_bytes)
        # Mosaic augmentation (YOLO-style) mixes in random earlier samples from the cache, so old
        # entries are read again: once they are swapped out, every batch waits for swap-in.
        for old in random.sample(list(decoded), min(args.mosaic, len(decoded))):
            bytes(decoded[old][::4096])  # reads one byte per page: faults in every page
        shm = shared_memory.SharedMemory(block_name(batch), create=True, size=len(data))
        shm.buf[: len(data)] = data
        shm.close()  # the trainer unlinks it once it has consumed the batch
        try:
            conn.send((batch, len(data)))
        except OSError:
            break  # the trainer is gone
    os._exit(0)  # like multiprocessing's workers: never run the trainer's atexit handlers


def reap_dead(workers):
    """PyTorch's check: a worker that is gone fails the whole DataLoader."""
    for pid, _ in workers:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done and os.WIFSIGNALED(status):
            return f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(os.WTERMSIG(status))}."
        if done:
            return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {os.WEXITSTATUS(status)}."
    return None


def shutdown(workers):
    """Stops the workers as DataLoader's _shutdown_workers does, and frees the batches in flight."""
    for _, conn in workers:
        try:
            conn.send(None)
        except OSError:
            pass  # already dead
    for pid, _ in workers:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped by reap_dead
    for batch in IN_FLIGHT:
        try:
            shared_memory.SharedMemory(block_name(batch)).unlink()
        except (FileNotFoundError, ValueError):
            pass  # never made, or the worker died while making it


def fail(workers, message):
    since, polled = RECEIVING["since"], RECEIVING["polled"]
    if since is not None and polled is not None:
        say(failed_receive_waited_ns=max(0, polled - since))
    for pid, _ in workers:  # the DataLoader terminates the other workers, not waiting for them
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    shutdown(workers)
    print(f"RuntimeError: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def receive(workers, w):
    """Waits for worker w's next batch; notices a dead worker as the DataLoader's watchdog does."""
    conn = workers[w][1]
    while True:
        try:
            ready = conn.poll(0.1)
            RECEIVING["polled"] = time.monotonic_ns()
            if ready:
                return conn.recv()
        except (EOFError, OSError):
            RECEIVING["polled"] = time.monotonic_ns()
            time.sleep(0.05)  # the worker's end closed: find out how it died below
        dead = reap_dead(workers)
        if dead:
            fail(workers, dead)


def request(workers, w, batch):
    IN_FLIGHT.add(batch)
    try:
        workers[w][1].send(batch)
    except OSError:  # broken pipe: the worker is gone
        while not (dead := reap_dead(workers)):
            time.sleep(0.05)
        fail(workers, dead)


def main():
    args = parse_args()
    if args.wait_go:
        sys.stdin.readline()
    say(role="trainer", pid=os.getpid())
    files = dataset_files(args.data_dir)
    # One resource tracker for everybody, started before fork (workers inherit it), so blocks
    # created by workers and unlinked by the trainer are accounted in one place.
    resource_tracker.ensure_running()
    workers = []  # (pid, trainer's end of the pipe)
    for i in range(args.workers):
        ours, theirs = mp.Pipe()
        pid = os.fork()
        if pid == 0:
            ours.close()
            for _, other in workers:
                other.close()
            try:
                worker_main(i, theirs, files, args)
            finally:
                os._exit(1)
        theirs.close()
        workers.append((pid, ours))

    # Round-robin with prefetch, as the DataLoader's _MultiProcessingDataLoaderIter does.
    for b in range(min(args.steps, args.workers * PREFETCH_FACTOR)):
        request(workers, b % args.workers, b)
    log = open(args.log, "a", buffering=1)
    t_start = time.monotonic()
    for step in range(args.steps):
        t0 = time.monotonic()
        RECEIVING.update(since=time.monotonic_ns(), polled=None)
        batch, size = receive(workers, step % args.workers)
        data_time = time.monotonic() - t0
        shm = shared_memory.SharedMemory(block_name(batch))
        digest = hashlib.sha1(shm.buf[:size]).digest()  # "forward/backward" touches the batch
        shm.close()
        shm.unlink()
        IN_FLIGHT.discard(batch)
        nxt = step + args.workers * PREFETCH_FACTOR
        if nxt < args.steps:
            request(workers, nxt % args.workers, nxt)
        time.sleep(args.step_ms / 1000)  # the GPU's share of the step
        step_time = time.monotonic() - t0
        eta = int((time.monotonic() - t_start) / (step + 1) * (args.steps - step - 1))
        loss = 0.6931 / (1 + step / 100) + digest[0] / 25600
        log.write(
            f"Epoch(train) [1][{step + 1:4d}/{args.steps}]  lr: 1.0000e-04  "
            f"eta: {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}  time: {step_time:.4f}  "
            f"data_time: {data_time:.4f}  memory: 512  loss: {loss:.4f}\n"
        )
        RECEIVING["since"] = None

    shutdown(workers)
    log.close()


if __name__ == "__main__":
    main()
