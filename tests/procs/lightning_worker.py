"""A small Lightning script (an MLP with BatchNorm, made-up data) made a platoon worker by
PlatoonStrategy; writes what it did to OUT_JSON (tests/integrations/test_lightning.py).

usage: lightning_worker.py OUT_JSON ROOT_DIR [--package pytorch_lightning] [--steps N]
                           [--accum K] [--every K] [--save-at S [--ckpt-dir D]] [--refusals]
                           [--rejoin PORT] [--then-alone] [--cli] [--saves] [--adam]
                           [--then-exec PY_FILE]
A checkpoint every S steps and a last.ckpt (by default under the logger's directory, else in
D); a validation every 2 batches; a StepLR halving the lr every 2 steps. Every checkpoint
saved records whether it holds the worker's own weights (those the model had when the
validation began, for a save during one).
--cli: first (before this script imports platoon.integrations.lightning) build three
LightningCLI trainers (run=False) with the strategy selected on the command line by
class_path, in a config file (with a DiLoCo rule), and by its short name "platoon".
--saves: also a ModelCheckpoint monitoring val_loss every step (under ROOT_DIR/monitored),
which defers its first saves to the end of the first validation, where the val_loss is
logged; and a trainer.save_checkpoint in the middle of the first validation.
--adam: AdamW (lr 0.05, no warm-up: the halving schedule) in place of SGD with momentum.
--rejoin PORT: after the job, a fresh model, Trainer and strategy join a second job (the
controller at PORT) with fit(ckpt_path="last") and train to twice --steps.
--refusals: first ask for Lightning's DDP (devices=2, then WORLD_SIZE=2 as torchrun sets it)
and record the errors, before any worker is made.
--then-alone: after the job, this process runs alone (one-worker jobs, under ROOT_DIR/alone):
  1. a GradScaler in Lightning's mixed-precision plugin (Lightning has none on the CPU: the
     script gives it one), the gradients of step 2 infinite; 4 steps, sync every 2, a
     checkpoint at step 3;
  2. a fresh model, Trainer and strategy resume from that checkpoint and train to step 6;
  3. manual optimization with two optimizers, each stepped once a batch, 4 steps, sync every 1;
  4. PlatoonStrategy(counted_optimizer=1) with one optimizer.
--then-exec PY_FILE: last (the report written), without the job's variables
(PLATOON_CONTROL_PORT, PLATOON_WORKER_INDEX), this process runs PY_FILE's code (a check that
needs Lightning imported: a Lightning process fewer in the suite) and says "EXEC DONE" if it
raised nothing, else prints the traceback (and exits 0).
"""

import argparse
import importlib
import json
import os
import sys
import traceback

import torch

from platoon.errors import WorkerClosed

PlatoonStrategy = None  # imported after --cli's trainers (the CLI imports it for them)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("root")
    parser.add_argument("--package", default="lightning")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--refusals", action="store_true")
    parser.add_argument("--rejoin", type=int, default=0)
    parser.add_argument("--then-alone", action="store_true")
    parser.add_argument("--cli", action="store_true")
    parser.add_argument("--then-exec", metavar="PY_FILE")
    parser.add_argument("--saves", action="store_true")
    parser.add_argument("--adam", action="store_true",
                        help="AdamW, not SGD with momentum, under the halving schedule")
    opts = parser.parse_args()
    pl = importlib.import_module("lightning.pytorch" if opts.package == "lightning"
                                 else opts.package)
    report = {"cli": cli_strategies(pl, opts) if opts.cli else None}
    global PlatoonStrategy
    from platoon.integrations.lightning import PlatoonStrategy
    report["refusals"] = refusals(pl, opts) if opts.refusals else []
    report["runs"] = [train(pl, options(opts, scaler=False, inf_at=0, manual=False),
                            opts.steps, None)]
    if opts.rejoin:
        os.environ["PLATOON_CONTROL_PORT"] = str(opts.rejoin)
        report["runs"].append(train(pl, options(opts, scaler=False, inf_at=0, manual=False),
                                    2 * opts.steps, "last"))
    if opts.then_alone:
        del os.environ["PLATOON_CONTROL_PORT"]  # from now on a worker is a one-worker job
        alone = dict(root=os.path.join(opts.root, "alone"), accum=1, every=2, manual=False,
                     ckpt_dir=None, saves=False)
        first = train(pl, options(opts, scaler=True, inf_at=2, save_at=3, **alone), 4, None)
        resumed = train(pl, options(opts, scaler=True, inf_at=0, save_at=3, **alone), 6,
                        first["checkpoint"])
        manual = train(pl, options(opts, scaler=False, inf_at=0, save_at=0,
                                   **dict(alone, every=1, manual=True)), 4, None)
        report["alone"] = [first, resumed, manual]
        report["counted_past_the_list"] = count_past_the_list(pl, options(opts, manual=False))
    with open(opts.out, "w") as f:
        json.dump(report, f)
    if opts.then_exec:
        for var in ("PLATOON_CONTROL_PORT", "PLATOON_WORKER_INDEX"):  # no job's any more
            os.environ.pop(var, None)
        try:
            with open(opts.then_exec) as f:
                exec(compile(f.read(), opts.then_exec, "exec"), {"__name__": "__main__"})
        except Exception:  # the check's own failure: its test reads it, the job's still pass
            traceback.print_exc()
        else:
            print("EXEC DONE", flush=True)


def options(opts, **changes):
    return argparse.Namespace(**dict(vars(opts), **changes))


def cli_strategies(pl, opts):
    """The strategies of three LightningCLI trainers (not run), and whether the first one
    imported platoon.integrations.lightning (this script has not)."""
    cli_module = importlib.import_module(pl.__name__ + ".cli")
    config = os.path.join(opts.root, "cli.yaml")
    with open(config, "w") as f:
        f.write("trainer:\n  strategy:\n"
                "    class_path: platoon.integrations.lightning.PlatoonStrategy\n"
                "    init_args:\n      sync_every: 5\n"
                "      rule: {class_path: platoon.DiLoCo, init_args: {outer_lr: 0.5}}\n")
    imported = "platoon.integrations.lightning" in sys.modules
    found = []
    sys.argv[1:] = []  # LightningCLI parses args=, and warns when it sees both
    for args in (["--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy",
                  "--trainer.strategy.init_args.sync_every=3"],
                 ["--config", config], ["--trainer.strategy=platoon"]):
        cli = cli_module.LightningCLI(
            type(make_module(pl, options(opts, manual=False))), run=False, args=args,
            seed_everything_default=False, save_config_callback=None,
            trainer_defaults=dict(accelerator="cpu", logger=False, enable_progress_bar=False))
        strategy = cli.trainer.strategy
        found.append({"type": "%s.%s" % (type(strategy).__module__, type(strategy).__name__),
                      "sync_every": strategy.sync_every, "rule": repr(strategy.rule)})
    return {"imported_before": imported, "strategies": found}


def data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] - 2 * x[:, 1:2])


def make_module(pl, opts):
    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                           torch.nn.ReLU(), torch.nn.Linear(16, 1))
            self.automatic_optimization = not opts.manual
            self.on_centre = []  # per validation batch: did the model differ from its own?
            self.own_back = []  # per validation: were its own weights back after it?
            self.first_batch = None
            self.real_steps = 0
            self.saves = []  # per checkpoint saved: (during a validation, holds own weights)
            self._own = None

        def training_step(self, batch, batch_idx):
            x, y = batch
            if self.first_batch is None:
                self.first_batch = x[:, 0].tolist()
            if self._own is not None:  # the first training step after a validation
                self.own_back.append(all(torch.equal(p, o) for p, o in
                                         zip(self.net.parameters(), self._own)))
                self._own = None
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if not self.automatic_optimization:
                first, second = self.optimizers()
                for opt in (first, second):
                    opt.zero_grad()
                    self.manual_backward(torch.nn.functional.mse_loss(self.net(x), y))
                    opt.step()
                return loss
            return loss

        def on_validation_start(self):  # before the strategy's hook: the worker's own weights
            self._own = [p.detach().clone() for p in self.net.parameters()]

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.on_centre.append(any(not torch.equal(p, o) for p, o in
                                      zip(self.net.parameters(), self._own)))
            if opts.saves and batch_idx == 0 and not self.saves:  # a save mid-validation
                self.trainer.save_checkpoint(os.path.join(self.trainer.log_dir,
                                                          "mid-validation.ckpt"))
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def on_save_checkpoint(self, checkpoint):
            own = self._own or list(self.net.parameters())  # during a validation: its start's
            saved = [checkpoint["state_dict"]["net." + name] for name, _ in
                     self.net.named_parameters()]
            self.saves.append((self._own is not None,
                               all(torch.equal(s, o) for s, o in zip(saved, own))))

        def configure_optimizers(self):
            first = torch.optim.SGD(self.net[:2].parameters(), lr=0.05)
            if not self.automatic_optimization:
                return [first, torch.optim.SGD(self.net[2:].parameters(), lr=0.05)]
            sgd = torch.optim.AdamW(self.net.parameters(), lr=0.05) if opts.adam else \
                torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)
            halving = torch.optim.lr_scheduler.StepLR(sgd, 2, gamma=0.5)
            return {"optimizer": sgd,
                    "lr_scheduler": {"scheduler": halving, "interval": "step"}}

    return Regression()


def poison(module, at):
    """The gradients of backward pass `at` (1-based; optimizer step `at` without gradient
    accumulation) made infinite: the GradScaler skips that step."""
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return grad * float("inf") if calls[0] == at else grad
    next(module.parameters()).register_hook(hook)


def refusals(pl, opts):
    errors = []
    for devices, env in ((2, {}), (1, {"WORLD_SIZE": "2"})):
        os.environ.update(env)
        try:
            trainer = pl.Trainer(accelerator="cpu", devices=devices, max_steps=1,
                                 strategy=PlatoonStrategy(),
                                 logger=False, enable_progress_bar=False)
            trainer.fit(make_module(pl, options(opts, manual=False)),
                        torch.utils.data.DataLoader(data(0)))
            errors.append(None)
        except Exception as exc:  # the strategy's PlatoonError
            errors.append("%s: %s" % (type(exc).__name__, exc))
        finally:
            for key in env:
                del os.environ[key]
    return errors


def count_past_the_list(pl, opts):
    """PlatoonStrategy(counted_optimizer=1) with one optimizer: the error, and whether the
    worker made for the fit left its (one-worker) job."""
    strategy = PlatoonStrategy(counted_optimizer=1, package=opts.package)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False)
    try:
        trainer.fit(make_module(pl, opts), torch.utils.data.DataLoader(data(0)))
        error = None
    except Exception as exc:  # the strategy's ValueError
        error = "%s: %s" % (type(exc).__name__, exc)
    try:
        strategy.worker.start_together()
        closed = False
    except WorkerClosed:
        closed = True
    return {"error": error, "worker_closed": closed}


def train(pl, opts, steps, ckpt):
    torch.manual_seed(0)
    module = make_module(pl, opts)
    strategy = PlatoonStrategy(sync_every=opts.every)  # the package: the one imported
    plugins = []
    if opts.scaler:
        scaler = torch.amp.GradScaler("cpu", init_scale=16.0)  # no overflow but step 2's
        plugins = [pl.plugins.precision.MixedPrecision("16-mixed", "cpu", scaler=scaler)]
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=opts.ckpt_dir, save_top_k=-1,
                                              every_n_train_steps=opts.save_at,
                                              save_last=True)
                 ] if opts.save_at else []
    if opts.saves:  # val_loss is logged in validation only: the first saves wait for it
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=os.path.join(opts.root, "monitored"), monitor="val_loss",
            every_n_train_steps=1, filename="monitored-{step}"))
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, accumulate_grad_batches=opts.accum,
                         strategy=strategy, plugins=plugins, callbacks=callbacks,
                         default_root_dir=opts.root, val_check_interval=2,
                         check_val_every_n_epoch=None, limit_val_batches=2,
                         num_sanity_val_steps=0, enable_progress_bar=False,
                         enable_model_summary=False, logger=pl.loggers.CSVLogger(opts.root))
    if opts.inf_at and ckpt is None:
        poison(module, opts.inf_at)
    loader = torch.utils.data.DataLoader(data(0), batch_size=8, shuffle=True)
    val = torch.utils.data.DataLoader(data(1), batch_size=32)
    trainer.fit(module, loader, val, ckpt_path=ckpt)
    resumed_from = trainer.ckpt_path  # (trainer.validate sets it again)
    centre_after_fit = [p.detach().clone() for p in module.parameters()]
    validated = trainer.validate(module, val, verbose=False)
    unchanged = all(torch.equal(p, q) for p, q in zip(module.parameters(), centre_after_fit))
    on_own = on_fits = None  # after fit: a checkpoint's path, then "last", the fit's model
    if opts.save_at:
        own = os.path.join(callbacks[0].dirpath, "last.ckpt")
        on_own = trainer.validate(dataloaders=val, ckpt_path=own, verbose=False)
        on_fits = trainer.validate(dataloaders=val, ckpt_path="last", verbose=False)
    fits_model_back = all(torch.equal(p, q) for p, q in zip(module.parameters(),
                                                              centre_after_fit))
    try:  # a second fit with the same strategy
        trainer.fit(module, loader)
        refit = None
    except Exception as exc:  # the strategy's PlatoonError
        refit = "%s: %s" % (type(exc).__name__, exc)
    last = None
    if opts.save_at:
        saved = sorted(os.listdir(callbacks[0].dirpath))  # epoch=0-step=S.ckpt, ..., last.ckpt
        last = os.path.join(callbacks[0].dirpath, saved[0])
    state = torch.load(last, weights_only=False) if last else {}
    return {"global_step": trainer.global_step, "platoon_steps": strategy.sync.steps,
            "syncs": strategy.worker.syncs,
            "final_result": strategy.final_result, "validated": validated,
            "on_centre": module.on_centre, "own_back": module.own_back,
            "first_batch": module.first_batch, "log_dir": trainer.log_dir,
            "checkpoint": last, "checkpoint_platoon": state.get("platoon"),
            "resumed_from": resumed_from,
            "unchanged_by_validate": unchanged, "on_own": on_own, "on_fits": on_fits,
            "fits_model_back": fits_model_back,
            "lr": trainer.optimizers[0].param_groups[0]["lr"], "refit": refit,
            "saves": module.saves}


if __name__ == "__main__":
    main()
