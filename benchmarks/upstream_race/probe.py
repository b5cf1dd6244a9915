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


def main():
    if not SCRIPT or FRAMEWORK not in ("transformers", "lightning", "accelerate"):
        raise SystemExit("probe.py needs UPSTREAM_RACE_SCRIPT (the script) and "
                         "UPSTREAM_RACE_FRAMEWORK (transformers, lightning or accelerate)")
    if FRAMEWORK == "transformers":
        hook_transformers()
    elif FRAMEWORK == "lightning":
        hook_lightning()
    sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT)))
    runpy.run_path(SCRIPT, run_name="__main__")


if __name__ == "__main__":
    main()
