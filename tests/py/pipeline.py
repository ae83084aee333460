#!/usr/bin/env python3
"""Input-pipeline job shapes for gpustall's pipeline verdict tests, standard library only.

  pipeline.py cpu [--workers 1] [--cost 0.15] [--step 0.1] [--trainer-cost 0] [--seconds 6]
                  [--fetch HOST:PORT] [--wait-go]
      A trainer with --workers DataLoader workers (forked, named pt_data_worker). Each worker
      makes batches: --cost s of CPU per batch (a busy loop on its own CPU clock), or with
      --fetch a request to a storage server for each sample (it answers after its delay), and
      writes each batch to a pipe. The trainer reads one batch per step with a plain blocking
      read of that pipe, spends --trainer-cost s of CPU on it (host-side preprocessing), then
      "runs the step on the GPU" (sleeps --step s). After --seconds it reports
      {"role": "result", "steps": N, "wait_s": W, "wait_share": W / elapsed}.
  pipeline.py server [--delay 0.1]
      A storage server: listens on 127.0.0.1, prints {"role": "server", "port": P}, and answers
      each 1-byte request with a 4 KiB sample after --delay s (object storage's latency).
  pipeline.py spin [--name NAME]
      A busy loop named NAME: a process outside the job that takes a CPU.
"""
import argparse
import ctypes
import json
import os
import socket
import sys
import threading
import time

PR_SET_NAME = 15
BATCH = 4096


def set_name(name):
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def say(role, **fields):
    fields.update(role=role, pid=os.getpid(), ppid=os.getppid())
    os.write(1, (json.dumps(fields) + "\n").encode())


def burn(seconds):
    """Spends `seconds` of this process's CPU time."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(2000):
            x += i * i
    return x


def wait_go(a):
    if a.wait_go:
        sys.stdin.readline()


def worker(index, a, w):
    set_name("pt_data_worker")
    say("worker", index=index)
    conn = None
    if a.fetch:
        host, port = a.fetch.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)))
    batch = bytes([index % 256]) * BATCH
    store = os.open(a.read, os.O_RDONLY) if a.read else None
    while True:
        if store is not None:
            # A sample from a file on a network filesystem (a FUSE mount here): each read
            # waits on its server.
            os.pread(store, BATCH, 0)
        if conn is not None:
            conn.sendall(b"x")
            got = 0
            while got < BATCH:
                chunk = conn.recv(BATCH - got)
                if not chunk:
                    os._exit(0)
                got += len(chunk)
        if a.cost > 0:
            burn(a.cost)
        try:
            os.write(w, batch)
        except BrokenPipeError:
            os._exit(0)


def cpu(a):
    wait_go(a)
    say("trainer")
    r, w = os.pipe()
    pids = []
    for i in range(a.workers):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            worker(i, a, w)
        pids.append(pid)
    os.close(w)
    start = time.monotonic()
    waited = 0.0
    steps = 0
    while time.monotonic() - start < a.seconds:
        t0 = time.monotonic()
        got = 0
        while got < BATCH:
            got += len(os.read(r, BATCH - got))  # a plain blocking read of the pipe
        waited += time.monotonic() - t0
        if a.trainer_cost > 0:
            burn(a.trainer_cost)
        time.sleep(a.step)  # the GPU step
        steps += 1
    elapsed = time.monotonic() - start
    os.close(r)  # the workers' next write fails (EPIPE): they exit 0, as DataLoader's do
    for pid in pids:
        os.waitpid(pid, 0)
    say("result", steps=steps, wait_s=round(waited, 3), wait_share=round(waited / elapsed, 3))


def server(a):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    say("server", port=s.getsockname()[1])

    def serve(c):
        with c:
            while c.recv(1):
                time.sleep(a.delay)
                c.sendall(b"\x02" * BATCH)

    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def spin(a):
    set_name(a.name)
    say("spin")
    while True:
        pass


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--workers", type=int, default=1)
    c.add_argument("--cost", type=float, default=0.15)
    c.add_argument("--step", type=float, default=0.1)
    c.add_argument("--trainer-cost", type=float, default=0.0)
    c.add_argument("--seconds", type=float, default=6.0)
    c.add_argument("--fetch")
    c.add_argument("--read", help="read each sample from this file (a network filesystem's)")
    c.add_argument("--wait-go", action="store_true")
    s = sub.add_parser("server")
    s.add_argument("--delay", type=float, default=0.1)
    sp = sub.add_parser("spin")
    sp.add_argument("--name", default="spin")
    a = p.parse_args()
    {"cpu": cpu, "server": server, "spin": spin}[a.mode](a)


if __name__ == "__main__":
    main()
