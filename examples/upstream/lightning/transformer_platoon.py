"""A Transformer language model with a plain Lightning Trainer: the structure of
pytorch-lightning's examples/pytorch/basics/transformer.py, reduced to run offline.

Adapted from Lightning's transformer.py (its LanguageModel around
lightning.pytorch.demos.Transformer, nll_loss on next words, SGD at lr 20, and its main():
seed_everything(42), a random_split into train, validation and test, three DataLoaders,
`Trainer(gradient_clip_val=0.25, max_epochs=...)`, fit, then test(model, ...)), written anew:
a word-level dataset of Python's standard library (read offline, as WikiText2 is read)
instead of WikiText2's download, a smaller Transformer (ninp and nhid 32, one layer) and
split, and a few flags the upstream script lacks (it has none): --max_steps,
--accumulate_grad_batches, --precision, --ckpt_path (passed to fit, to resume). Its diff to
transformer_platoon.py is docs/lightning.md's. Example:

    python transformer.py --max_steps 8 --accumulate_grad_batches 2 --precision bf16-mixed
"""

import argparse
import os
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, random_split

import lightning as L
from lightning.pytorch.demos import Transformer
import platoon.integrations.lightning_auto  # noqa: F401 (each Trainer: a platoon worker)

TEXT_FILES = ["argparse.py", "ast.py", "bisect.py"]  # of the standard library


class StdlibText(Dataset):
    """WikiText2's interface (vocab_size; items of block_size word ids and the next ones) on
    Python's standard library: its `words` most common words, the rest <unk>."""

    def __init__(self, block_size: int = 35, words: int = 2000) -> None:
        stdlib = os.path.dirname(os.__file__)
        tokens = []
        for name in TEXT_FILES:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                for line in f:
                    tokens += line.split() + ["<eos>"]
        vocab = ["<unk>"] + [w for w, _ in Counter(tokens).most_common(words - 1)]
        index = {w: i for i, w in enumerate(vocab)}
        self.data = torch.tensor([index.get(t, 0) for t in tokens])
        self.dictionary = vocab
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int):
        start = index * self.block_size
        end = start + self.block_size
        return self.data[start:end], self.data[start + 1:end + 1]


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size, ninp=32, nhid=32, nlayers=1)

    def training_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("test_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=20.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_epochs", type=int, default=20)
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.add_argument("--precision", default=None, help="e.g. bf16-mixed")
    parser.add_argument("--ckpt_path", default=None, help="a checkpoint to resume fit from")
    args = parser.parse_args()

    L.seed_everything(42)
    dataset = StdlibText()

    n = len(dataset)
    train_dataset, val_dataset, test_dataset = random_split(dataset, [n - 80, 40, 40])
    train_dataloader = DataLoader(train_dataset, batch_size=20, shuffle=True)
    val_dataloader = DataLoader(val_dataset, batch_size=20, shuffle=False)
    test_dataloader = DataLoader(test_dataset, batch_size=20, shuffle=False)

    model = LanguageModel(vocab_size=dataset.vocab_size)
    trainer = L.Trainer(gradient_clip_val=0.25, max_epochs=args.max_epochs,
                        max_steps=args.max_steps,
                        accumulate_grad_batches=args.accumulate_grad_batches,
                        precision=args.precision, enable_progress_bar=False)
    trainer.fit(model, train_dataloader, val_dataloader, ckpt_path=args.ckpt_path)
    trainer.test(model, test_dataloader)


if __name__ == "__main__":
    main()
