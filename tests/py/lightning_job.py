"""A real PyTorch Lightning job for gpustall's tests (tests/tests/frameworks.rs): Lightning's own
Trainer and fit loop on a tiny model, on the CPU, fed by a DataLoader whose samples are
expensive to make.

  lightning_job.py cpu [--workers 1] [--item-cpu-ms 60] [--steps 150] [--wait-go]
      Each sample burns --item-cpu-ms of CPU in decode_tile_expensive (pure Python, in the
      DataLoader worker); the training step is cheap. With one worker on a 2-CPU machine the
      input pipeline is CPU-bound and a CPU sits idle.

Prints {"role": "lines", ...} first (the lines the test expects named), then at the end
{"role": "trainer", "steps": N, "seconds": S}.
"""

import argparse
import inspect
import json
import os
import sys
import time

from stacks import decode_tile_expensive  # the same decode as the stacks jobs (this folder)


def say(role, **fields):
    print(json.dumps({"role": role, **fields}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=["cpu"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--item-cpu-ms", type=float, default=60)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--wait-go", action="store_true")
    a = p.parse_args()

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, Dataset

    lines, first = inspect.getsourcelines(decode_tile_expensive)
    say("lines", hot=[first, first + len(lines) - 1],
        file=os.path.basename(inspect.getsourcefile(decode_tile_expensive)))

    class Tiles(Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            decode_tile_expensive(i, a.item_cpu_ms)
            return torch.rand(16), torch.rand(1)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.set_num_threads(1)
    loader = DataLoader(Tiles(), batch_size=1, num_workers=a.workers,
                        persistent_workers=True, multiprocessing_context="fork")
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    if a.wait_go:
        sys.stdin.readline()
    start = time.monotonic()
    trainer.fit(Tiny(), loader)
    say("trainer", steps=trainer.global_step, seconds=round(time.monotonic() - start, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
