"""An autoencoder with LightningCLI: the structure of pytorch-lightning's
examples/pytorch/basics/autoencoder.py, reduced to run offline.

Adapted from Lightning's autoencoder.py (its module, its data module's four loaders, and its
cli_main: LightningCLI(run=False) with seed_everything_default and trainer_defaults, then
fit, test(ckpt_path="best") and predict(ckpt_path="best")), written anew: 28x28 images made
up in code (blobs drawn at random places) instead of MNIST's download, and no ImageSampler
callback (it needs torchvision, not installed here). It needs no change to be a platoon
worker: a flag selects the strategy (docs/lightning.md). Example:

    python autoencoder.py --trainer.max_epochs=2 \
        --trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy
"""

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def blobs(n, seed):
    """`n` 1x28x28 images, each a bright blob at a random place, with its row as the label."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randint(4, 24, (n, 2), generator=g)
    grid = torch.arange(28.0)
    rows = (grid.view(1, 28, 1) - centres[:, 0].view(n, 1, 1)) ** 2
    cols = (grid.view(1, 1, 28) - centres[:, 1].view(n, 1, 1)) ** 2
    return TensorDataset(torch.exp(-(rows + cols) / 8.0).unsqueeze(1), centres[:, 0])


class LitAutoEncoder(LightningModule):
    def __init__(self, hidden_dim: int = 64, learning_rate=10e-3):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, hidden_dim), nn.ReLU(),
                                     nn.Linear(hidden_dim, 3))
        self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(),
                                     nn.Linear(hidden_dim, 28 * 28))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, batch_idx, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        return self(self._prepare_batch(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def _prepare_batch(self, batch):
        x, _ = batch
        return x.view(x.size(0), -1)

    def _common_step(self, batch, batch_idx, stage: str):
        x = self._prepare_batch(batch)
        loss = F.mse_loss(x, self(x))
        self.log(f"{stage}_loss", loss, on_step=True)
        return loss


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        dataset = blobs(576, 0)
        self.blobs_test = blobs(64, 1)
        self.blobs_train, self.blobs_val = random_split(
            dataset, [512, 64], generator=torch.Generator().manual_seed(42))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.blobs_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.blobs_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.blobs_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.blobs_test, batch_size=self.batch_size)


def cli_main():
    cli = LightningCLI(
        LitAutoEncoder,
        MyDataModule,
        seed_everything_default=1234,
        run=False,  # fit, test and predict below
        trainer_defaults={"max_epochs": 10},
        save_config_kwargs={"overwrite": True},
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.test(ckpt_path="best", datamodule=cli.datamodule)
    predictions = cli.trainer.predict(ckpt_path="best", datamodule=cli.datamodule)
    print(predictions[0])


if __name__ == "__main__":
    cli_main()
