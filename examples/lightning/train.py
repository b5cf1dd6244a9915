"""A small byte-level language model trained by Lightning on Python's own source.

single_process.py is an ordinary Lightning script: a byte-level model built in code (an
embedding, two convolutions with BatchNorm over a 32-byte context, a linear head: nothing
downloaded), Python's standard library as the text (a fixed list of modules, read offline),
AdamW with gradients clipped at norm 1 and a linear decay stepped every optimizer step,
gradient accumulation (--accumulation), a validation and a checkpoint every 200 steps, a
validation at the end. Lightning's own multi-process mode adds ``devices=2`` to the Trainer
(and runs under ``torchrun --nproc-per-node 2``, or lets Lightning start the processes).
train.py is the same script as a platoon worker, two lines apart (docs/lightning.md); run
alone, it trains as single_process.py does:
    python examples/lightning/single_process.py
    platoon-launcher -n 2 examples/lightning/train.py
    python examples/lightning/train.py
"""

import argparse
import os
import sysconfig

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
import platoon.integrations.lightning_auto  # noqa: F401 (every Trainer from here: a worker)

TRAIN_FILES = ["argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py",
               "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py",
               "difflib.py", "fractions.py", "functools.py", "heapq.py", "inspect.py"]
VALID_FILES = ["queue.py", "pprint.py"]


class Windows(torch.utils.data.Dataset):
    """(32 bytes, the byte after them) from the standard library's `files`, every 8th
    position (at most `limit` windows)."""

    def __init__(self, files, context=32, limit=None):
        stdlib = sysconfig.get_paths()["stdlib"]
        text = b"".join(open(os.path.join(stdlib, name), "rb").read() for name in files)
        self.data = torch.tensor(list(text), dtype=torch.long)
        self.context = context
        self.count = (len(self.data) - context - 1) // 8
        if limit is not None:
            self.count = min(self.count, limit)

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        start = i * 8
        return self.data[start:start + self.context], self.data[start + self.context]


class ByteModel(L.LightningModule):
    def __init__(self, lr, steps, width=128, context=32):
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.Embedding(256, width)
        self.convs = torch.nn.Sequential(
            torch.nn.Conv1d(width, width, 5, padding=2), torch.nn.BatchNorm1d(width),
            torch.nn.ReLU(),
            torch.nn.Conv1d(width, width, 5, padding=2), torch.nn.BatchNorm1d(width),
            torch.nn.ReLU())
        self.head = torch.nn.Linear(width * context, 256)

    def forward(self, x):
        h = self.convs(self.embed(x).transpose(1, 2))
        return self.head(h.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        decay = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: max(0.0, 1 - step / self.hparams.steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=1,
                        help="batches per optimizer step")
    parser.add_argument("--output-dir", default="lightning-bytes")
    parser.add_argument("--resume", default=None, help="a checkpoint file to resume from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    L.seed_everything(args.seed)
    model = ByteModel(args.lr, args.steps)
    train = torch.utils.data.DataLoader(Windows(TRAIN_FILES), batch_size=args.batch_size,
                                        shuffle=True)
    val = torch.utils.data.DataLoader(Windows(VALID_FILES, limit=2048), batch_size=256)
    trainer = L.Trainer(
        max_steps=args.steps, accumulate_grad_batches=args.accumulation, gradient_clip_val=1.0,
        val_check_interval=200 * args.accumulation, check_val_every_n_epoch=None,
        log_every_n_steps=50, enable_progress_bar=False,
        callbacks=[ModelCheckpoint(every_n_train_steps=200, save_last=True)],
        default_root_dir=args.output_dir,
    )
    trainer.fit(model, train, val, ckpt_path=args.resume)
    print("final validation:", trainer.validate(model, val, verbose=False))


if __name__ == "__main__":
    main()
