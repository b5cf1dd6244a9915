"""Runs an upstream example script unchanged, as `python probe.py ARGS...` (the script named
by UPSTREAM_RACE_SCRIPT, ARGS its own), after adding one thing to its framework: a hook
that prints each evaluation made during training as a line

    upstream_race: {"step": S, "loss": L, "t": UNIX_TIME, "rank": R}

(a Trainer's `on_evaluate`, a Lightning `on_validation_end` outside the sanity check, an
Accelerate script's `epoch N: {...}` line as it prints it). Run as a file, so that torchrun,
platoon-launcher and Lightning's own DDP (which starts its ranks with `sys.argv`) all start
it again. Standalone: it imports nothing of the benchmarks package."""

import json
import os
import runpy
import sys
import time

MARK = "upstream_race: "
SCRIPT = os.environ.get("UPSTREAM_RACE_SCRIPT")
FRAMEWORK = os.environ.get("UPSTREAM_RACE_FRAMEWORK")


def say(step, loss, rank):
    print(MARK + json.dumps({"step": int(step), "loss": float(loss), "t": time.time(),
                             "rank": int(rank)}), flush=True)


def hook_transformers():
    import transformers

    class Probe(transformers.TrainerCallback):
        training = False

        def on_train_begin(self, args, state, control, **kwargs):
            self.training = True

        def on_train_end(self, args, state, control, **kwargs):
            self.training = False

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if self.training and state.is_world_process_zero and metrics \
                    and "eval_loss" in metrics:
                say(state.global_step, metrics["eval_loss"], args.process_index)

    init = transformers.Trainer.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Probe())
    transformers.Trainer.__init__ = __init__


def hook_lightning():
    import lightning.pytorch as pl

    class Probe(pl.Callback):
        def on_validation_end(self, trainer, pl_module):
            metrics = trainer.callback_metrics  # val_loss_epoch: a loss logged on_step too
            loss = metrics.get("val_loss_epoch", metrics.get("val_loss"))
            if not trainer.sanity_checking and trainer.is_global_zero and loss is not None \
                    and trainer.state.fn == "fit":
                say(trainer.global_step, loss, trainer.global_rank)

    fit = pl.Trainer.fit  # not __init__: LightningCLI reads its signature

    def probed_fit(self, *args, **kwargs):
        if not any(isinstance(c, Probe) for c in self.callbacks):
            self.callbacks.append(Probe())
        return fit(self, *args, **kwargs)
    pl.Trainer.fit = probed_fit


def run_accelerate():
    """Accelerate's script with upstream's MRPC-sized data instead of the port's 64 pairs:
    UPSTREAM_RACE_PAIRS made-up training pairs (256 evaluated), batch
    UPSTREAM_RACE_BATCH, UPSTREAM_RACE_EPOCHS epochs, seed UPSTREAM_RACE_SEED; the rest of
    its config (lr) and flow its own. Each epoch's evaluation (its own `epoch N: {...}`
    print) is reported with 1 - accuracy as the loss, at the steps this process has made."""
    import math

    import accelerate
    from torch.utils.data import DataLoader

    pairs, batch = int(os.environ["UPSTREAM_RACE_PAIRS"]), int(os.environ["UPSTREAM_RACE_BATCH"])
    script = runpy.run_path(SCRIPT, run_name="upstream_race_script")
    made = script["training_function"].__globals__  # the functions' own globals

    def get_dataloaders(accelerator, batch_size=16):
        return (DataLoader(made["sentence_pairs"](pairs, 0), shuffle=True,
                           batch_size=batch_size),
                DataLoader(made["sentence_pairs"](256, 1), shuffle=False,
                           batch_size=made["EVAL_BATCH_SIZE"]))
    made["get_dataloaders"] = get_dataloaders
    training_function = made["training_function"]

    def sized(config, args):
        return training_function(dict(config, batch_size=batch,
                                      num_epochs=int(os.environ["UPSTREAM_RACE_EPOCHS"]),
                                      seed=int(os.environ["UPSTREAM_RACE_SEED"])), args)
    made["training_function"] = sized
    printed = accelerate.Accelerator.print

    def print_(self, *args, **kwargs):
        printed(self, *args, **kwargs)
        if self.is_main_process and len(args) == 2 and str(args[0]).startswith("epoch ") \
                and "accuracy" in args[1]:
            epoch = int(str(args[0]).split()[1].rstrip(":"))
            steps = math.ceil(math.ceil(pairs / batch) / self.num_processes)
            say((epoch + 1) * steps, 1.0 - args[1]["accuracy"], self.process_index)
    accelerate.Accelerator.print = print_
    sys.argv = [SCRIPT] + sys.argv[1:]
    made["main"]()


def main():
    if not SCRIPT or FRAMEWORK not in ("transformers", "lightning", "accelerate"):
        raise SystemExit("probe.py needs UPSTREAM_RACE_SCRIPT (the script) and "
                         "UPSTREAM_RACE_FRAMEWORK (transformers, lightning or accelerate)")
    if FRAMEWORK == "accelerate":
        sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT)))
        return run_accelerate()
    if FRAMEWORK == "transformers":
        hook_transformers()
    elif FRAMEWORK == "lightning":
        hook_lightning()
    sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT)))
    runpy.run_path(SCRIPT, run_name="__main__")


if __name__ == "__main__":
    main()
