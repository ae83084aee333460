"""Calls the stand-in CUDA driver's cuStreamSynchronize N times in a tight loop (scenario
`spin:0`: each call returns at once) and prints how long they took: the bench's measure of what
gpustall's uprobe and uretprobe add to each call (`cargo xtask bench cuda-uprobes`).

    cuda_calls.py LIBCUDA CALLS

A DataLoader with one worker runs first, so that gpustall knows the process as a trainer (the
probes time only trainers and ranks), then it waits 2 s for gpustall to probe the library.
"""

import ctypes
import json
import sys
import time

import torch.utils.data as data


def main():
    lib, calls = sys.argv[1], int(sys.argv[2])
    cuda = ctypes.CDLL(lib)
    cuda.cuInit(0)
    for _ in data.DataLoader(range(4), num_workers=1):
        pass
    time.sleep(2)
    sync = cuda.cuStreamSynchronize
    t0 = time.perf_counter()
    for _ in range(calls):
        sync(None)
    s = time.perf_counter() - t0
    print(json.dumps({"calls": calls, "s": s}), flush=True)


if __name__ == "__main__":
    main()
