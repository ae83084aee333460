#!/usr/bin/env python3
"""Job shapes for gpustall's verdict tests, in the standard library only.

  jobs.py epochs [--workers 3] [--epochs 3] [--mib 40] [--wait-go]
      A trainer with non-persistent DataLoader workers (persistent_workers=False): every
      epoch it forks --workers new workers; in epoch e each grows to (e + 1) x --mib MiB,
      holds it a moment and exits.
  torchrun ranks [--ranks 2] [--workers 3] [--mib 60] [--wait-go]
      Run through a file named `torchrun` (as torch.distributed.run is), a launcher that forks
      --ranks ranks; each forks --workers workers that grow to --mib MiB and hold it.

  jobs.py spawn-ranks [--ranks 2] [--workers 3] [--mib 60] [--worker-start fork|spawn]
                      [--hold 1] [--wait-go]
      torch.multiprocessing.spawn / Lightning ddp_spawn: the script starts --ranks ranks with
      multiprocessing's spawn start method (an exec of `python -c 'from multiprocessing.spawn
      import spawn_main; ...'`); each rank has a pin-memory thread and starts --workers
      DataLoader workers that grow to --mib MiB: forked (DataLoader's default on Linux) or
      spawned (multiprocessing_context="spawn"), and hold it --hold s (spawned interpreters start
      slowly under emulation: a longer hold keeps them alive together).
  jobs.py forkserver [--workers 3] [--mib 120] [--unnamed] [--hold 1] [--wait-go]
      A trainer whose DataLoader workers are started by multiprocessing's forkserver (Python
      3.14's default start method): forks of the forkserver, with its command line. --unnamed:
      workers that never rename (PyTorch releases before the rename, plain multiprocessing).

  jobs.py reader --device DEV [--workers 2] [--sample-mib 4] [--seconds 8] [--wait-go]
      A trainer whose --workers workers each read --sample-mib MiB per sample from block
      device DEV with O_DIRECT, each from its own region, for --seconds; the trainer takes
      their samples in turn. Each worker ends with {"role": "worker_done", "read_bytes": N}.
  jobs.py thrash [--mib 100] [--idle 4] [--touch 4] [--wait-go]
      Fills --mib MiB, idles --idle s (a neighbour may push it out to swap meanwhile), then
      reads through it again and again for --touch s.
  jobs.py shm [--workers 2] [--mib 6] [--hold 1] [--wait-go]
      A trainer whose workers each put a --mib MiB batch in shared memory (/dev/shm, as
      DataLoader workers do) and hold it --hold s; on a small /dev/shm one dies of SIGBUS.
  jobs.py sleeper [--workers 2] [--idle 3] [--in-kernel] [--wait-go]
      A trainer that only sleeps, 10 ms at a time, for --idle s while its workers spin on the
      CPUs: nothing keeps it waiting but its own timer. --in-kernel: the workers spin in a
      syscall (4 MiB reads of /dev/zero), so the timer interrupts kernel code, not user code.
  jobs.py futex [--epochs 10] [--idle 0.15] [--wait-go]
      A trainer that waits --epochs times on a multiprocessing semaphore its one worker
      releases every --idle s: each wait is a futex (sem_wait) a worker ends. It reports the
      time it spent inside the acquires.
  jobs.py hog [--mib 120] [--wait-go]
      Fills --mib MiB, holds it 1 s and exits (the neighbour).

Workers name themselves `pt_data_worker`, as PyTorch's do; a process that would import torch
names itself `pt_main_thread` (torch does on import), and a pin-memory thread `pt_data_pin`. A
worker killed by a signal makes its trainer or rank fail the way a DataLoader does. Every
process prints one JSON line {"role": ..., "pid": ..., "ppid": ...}.
"""
import argparse
import ctypes
import json
import os
import signal
import sys
import time


PR_SET_NAME = 15


def set_name(name):
    """Names the calling thread (the process, from its main thread), as torch does."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def import_torch():
    """What importing torch does to the process's name."""
    set_name("pt_main_thread")


def pin_memory_thread():
    """A DataLoader's pin-memory thread (pin_memory=True): a thread, not a process."""
    import threading

    def run():
        set_name("pt_data_pin")
        threading.Event().wait()

    threading.Thread(target=run, daemon=True).start()


def say(role, **fields):
    fields.update(role=role, pid=os.getpid(), ppid=os.getppid())
    os.write(1, (json.dumps(fields) + "\n").encode())


def worker(mib, hold_s, index, rename=True):
    if rename:
        set_name("pt_data_worker")
    say("worker", index=index)
    chunks = []
    for _ in range(mib // 4):
        chunks.append(b"\x01" * (4 << 20))  # resident at once: growth the kernel sees
        time.sleep(0.02)
    time.sleep(hold_s)
    os._exit(0)


def fork_workers(n, mib, hold_s):
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            worker(mib, hold_s, i)
        pids.append(pid)
    return pids


def reap(pids):
    """Waits for the workers; True when one was killed by a signal."""
    killed = False
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            killed = True
            sys.stderr.write(f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: "
                             f"{signal.Signals(os.WTERMSIG(status)).name}\n")
    return killed


def epochs(a):
    say("trainer")
    for e in range(a.epochs):
        if reap(fork_workers(a.workers, (e + 1) * a.mib, 0.5)):
            return 1
    return 0


def rank(a, index):
    say("rank", index=index)
    return 1 if reap(fork_workers(a.workers, a.mib, 1.0)) else 0


def ranks(a):
    say("launcher")
    pids = []
    for r in range(a.ranks):
        pid = os.fork()
        if pid == 0:
            os._exit(rank(a, r))
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed |= status != 0
    return 1 if failed else 0


def worker_main(mib, hold_s, index, rename=True):
    """A worker started by multiprocessing (spawn or forkserver): exits like a forked one."""
    if rename:
        import_torch()
        time.sleep(0.2)  # importing torch takes a while before the worker loop names itself
    worker(mib, hold_s, index, rename)


def join(procs, what):
    """Waits for multiprocessing children; True when one was killed by a signal."""
    killed = False
    for p in procs:
        p.join()
        if p.exitcode is not None and p.exitcode < 0:
            killed = True
            sys.stderr.write(f"RuntimeError: {what} (pid {p.pid}) is killed by signal: "
                             f"{signal.Signals(-p.exitcode).name}\n")
        elif p.exitcode:
            killed = True
    return killed


def spawned_rank(a, index):
    import multiprocessing as mp
    import_torch()
    pin_memory_thread()
    say("rank", index=index)
    if a.worker_start == "fork":
        return 1 if reap(fork_workers(a.workers, a.mib, a.hold)) else 0
    ctx = mp.get_context("spawn")  # DataLoader(multiprocessing_context="spawn")
    procs = [ctx.Process(target=worker_main, args=(a.mib, a.hold, i)) for i in range(a.workers)]
    for p in procs:
        p.start()
    return 1 if join(procs, "DataLoader worker") else 0


def spawned_rank_main(a, index):
    sys.exit(spawned_rank(a, index))


def spawn_ranks(a):
    import multiprocessing as mp
    import_torch()
    say("launcher")
    ctx = mp.get_context("spawn")  # torch.multiprocessing.spawn's
    procs = [ctx.Process(target=spawned_rank_main, args=(a, r)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    return 1 if join(procs, "process") else 0


def forkserver(a):
    import multiprocessing as mp
    import_torch()
    say("trainer")
    ctx = mp.get_context("forkserver")
    procs = [ctx.Process(target=worker_main, args=(a.mib, a.hold, i, not a.unnamed))
             for i in range(a.workers)]
    for p in procs:
        p.start()
    return 1 if join(procs, "DataLoader worker") else 0


def fill(mib):
    return [bytearray(b"\x01" * (4 << 20)) for _ in range(mib // 4)]


def thrash(a):
    say("trainer")
    chunks = fill(a.mib)
    say("filled")
    time.sleep(a.idle)
    end = time.monotonic() + a.touch
    total = 0
    while time.monotonic() < end:
        for c in chunks:
            total += sum(c[i] for i in range(0, len(c), 4096))
    say("touched", total=total)
    return 0


def shm_worker(mib, index, hold):
    from multiprocessing import resource_tracker, shared_memory
    ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)
    say("worker", index=index)
    batch = shared_memory.SharedMemory(create=True, size=mib << 20)
    resource_tracker.unregister(batch._name, "shared_memory")  # the trainer owns it, as in PyTorch
    batch.buf[:] = b"\x01" * (mib << 20)  # SIGBUS here when /dev/shm cannot back it
    time.sleep(hold)
    batch.close()
    batch.unlink()
    os._exit(0)


def shm(a):
    say("trainer")
    pids = []
    for i in range(a.workers):
        pid = os.fork()
        if pid == 0:
            shm_worker(a.mib, i, a.hold)
        pids.append(pid)
    return 1 if reap(pids) else 0


def sleeper(a):
    say("trainer")
    pids = []
    for i in range(a.workers):
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)
            say("worker", index=i)
            end = time.monotonic() + a.idle + 1
            if a.in_kernel:
                buf = bytearray(4 << 20)
                with open("/dev/zero", "rb", buffering=0) as zero:
                    while time.monotonic() < end:
                        zero.readinto(buf)
            while time.monotonic() < end:
                pass
            os._exit(0)
        pids.append(pid)
    slept = 0.0
    end = time.monotonic() + a.idle
    while time.monotonic() < end:
        t = time.monotonic()
        time.sleep(0.01)
        slept += time.monotonic() - t
    say("slept", ns=int(slept * 1e9))
    reap(pids)
    return 0


def futex(a):
    import multiprocessing
    ready = multiprocessing.get_context("fork").Semaphore(0)
    time.sleep(1.2)  # the tracer accounts the trainer at its next beat
    pid = os.fork()
    if pid == 0:
        set_name("pt_data_worker")
        say("worker", index=0)
        for _ in range(a.epochs):
            time.sleep(a.idle)
            ready.release()
        os._exit(0)
    blocked = 0
    for _ in range(a.epochs):
        t = time.monotonic_ns()
        ready.acquire()
        blocked += time.monotonic_ns() - t
    say("trainer", worker_pid=pid, blocked_ns=blocked)
    reap([pid])
    return 0


def hog(a):
    say("neighbour")
    chunks = fill(a.mib)
    time.sleep(1)
    del chunks
    return 0


def reader_worker(a, index, out):
    """Reads --sample-mib MiB per sample from --device with O_DIRECT (no page cache: every
    byte from the device), from its own region, and sends one byte per sample."""
    import mmap
    set_name("pt_data_worker")
    say("worker", index=index)
    fd = os.open(a.device, os.O_RDONLY | os.O_DIRECT)
    size = os.lseek(fd, 0, os.SEEK_END)
    chunk = a.sample_mib << 20
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    offset, done = index * (size // max(a.workers, 1)), 0
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        if offset + chunk > size:
            offset = 0
        done += os.preadv(fd, [buf], offset)
        offset += chunk
        os.write(out, b"x")
    say("worker_done", index=index, read_bytes=done)
    os._exit(0)


def reader(a):
    """A trainer whose workers read their samples from a block device (see reader_worker)."""
    say("trainer")
    pipes, pids = [], []
    for i in range(a.workers):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            reader_worker(a, i, w)
        os.close(w)
        pipes.append(r)
        pids.append(pid)
    open_pipes = list(pipes)
    while open_pipes:
        for r in list(open_pipes):
            if not os.read(r, 1):  # the worker finished
                open_pipes.remove(r)
            time.sleep(0.01)  # the step
    return 1 if reap(pids) else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes = {"reader": reader, "epochs": epochs, "ranks": ranks, "spawn-ranks": spawn_ranks,
              "forkserver": forkserver, "thrash": thrash, "hog": hog, "shm": shm,
              "sleeper": sleeper, "futex": futex}
    p.add_argument("shape", choices=list(shapes))
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--mib", type=int, default=40)
    p.add_argument("--idle", type=float, default=4.0)
    p.add_argument("--touch", type=float, default=4.0)
    p.add_argument("--worker-start", choices=["fork", "spawn"], default="fork")
    p.add_argument("--unnamed", action="store_true")
    p.add_argument("--in-kernel", action="store_true")
    p.add_argument("--hold", type=float, default=1.0)
    p.add_argument("--device", default="")
    p.add_argument("--sample-mib", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--wait-go", action="store_true", help="read a line from stdin first")
    a = p.parse_args()
    if a.wait_go:
        sys.stdin.readline()
    return shapes[a.shape](a)


if __name__ == "__main__":
    sys.exit(main())
