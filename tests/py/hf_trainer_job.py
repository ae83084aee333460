"""A real Hugging Face Trainer job for gpustall's tests (tests/tests/frameworks.rs): transformers'
own Trainer and training loop (with accelerate's DataLoader wrapper) on a tiny model, on the
CPU, fed by a DataLoader whose samples are expensive to make.

  hf_trainer_job.py cpu --output-dir DIR [--workers 1] [--item-cpu-ms 60] [--steps 150]
      Each sample burns --item-cpu-ms of CPU in decode_tile_expensive (pure Python, in the
      DataLoader worker); the training step is cheap. With one worker on a 2-CPU machine the
      input pipeline is CPU-bound and a CPU sits idle. The Trainer logs as it does on a
      console (its loss dicts every 50 steps).

Prints {"role": "lines", ...} first (the lines the test expects named), then at the end
{"role": "trainer", "steps": N, "seconds": S, "in_next_s": T}: T is the time the trainer spent
inside the DataLoader iterator's next(), timed by the job itself.
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


def time_fetches():
    """The trainer's time inside the DataLoader iterator's next() (accelerate's wrapper calls
    it for every batch): what a data_time would measure, without the loop around it."""
    import torch.utils.data.dataloader as dl

    total = {"s": 0.0}
    inner = dl._BaseDataLoaderIter.__next__

    def timed(self):
        t = time.perf_counter()
        try:
            return inner(self)
        finally:
            total["s"] += time.perf_counter() - t

    dl._BaseDataLoaderIter.__next__ = timed
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=["cpu"])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--item-cpu-ms", type=float, default=60)
    p.add_argument("--steps", type=int, default=150)
    a = p.parse_args()

    import torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

    lines, first = inspect.getsourcelines(decode_tile_expensive)
    say("lines", hot=[first, first + len(lines) - 1],
        file=os.path.basename(inspect.getsourcefile(decode_tile_expensive)))

    class Tiles(Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            decode_tile_expensive(i, a.item_cpu_ms)
            return {"x": torch.rand(16), "labels": torch.rand(1)}

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.steps,
        per_device_train_batch_size=1,
        dataloader_num_workers=a.workers,
        dataloader_persistent_workers=True,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    fetched = time_fetches()
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Tiles())
    start = time.monotonic()
    trainer.train()
    say("trainer", steps=trainer.state.global_step, seconds=round(time.monotonic() - start, 3),
        in_next_s=round(fetched["s"], 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
