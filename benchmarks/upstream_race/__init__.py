"""The upstream race (issue 45 item 4): each framework's own example script, as the
frameworks ship it (examples/upstream, adapted to run offline), raced with its 1-line platoon
port under ``platoon-launcher -n 2`` against the framework's own DDP on 2 processes, the
same optimizer and lr on both sides, to a target eval loss: steps per process and seconds
from the command's start to the evaluation that first shows the target. The original script
alone, one process (``single``), is the reference: at the targets chosen, DDP's steps per
process are fewer than its.

usage: python -m benchmarks.upstream_race [--framework NAME] [--seeds 1,2,3]
                                          [--only ddp|platoon|single] [--target LOSS]
                                          [--lrs A,B] [--again] [--report] [--out PATH]

Frameworks (``--framework``, default all, one after another):

- ``transformers``: run_clm.py (a tiny GPT-2 from a config, AdamW, a linear decay to
  ``--max_steps``) under ``torchrun --standalone --nproc-per-node 2`` (the Trainer's own DDP
  over gloo) against run_clm_platoon.py (EASGD every 4 steps, the callback's defaults).
- ``lightning``: autoencoder.py, a LightningCLI script (Adam at its own lr 1e-2), with
  ``--trainer.strategy=ddp --trainer.devices=2 --trainer.accelerator=cpu`` against the same
  script with ``--trainer.strategy.class_path=...PlatoonStrategy`` (0 lines changed), both
  validating every ``--trainer.val_check_interval`` steps, seeded by ``--seed_everything``.
- ``lightning_transformer``: transformer.py (SGD at the script's own lr 20, no flag; seed 42,
  its own: a seed there is a repetition) with ``Trainer(devices=2, accelerator="cpu",
  strategy="ddp")`` given through Lightning's ``PL_TRAINER_*`` environment defaults (the
  script has no flag for them) against transformer_platoon.py. Its validation loss swings by
  nats between evaluations at that lr: it has no target (0: run to the horizon, for the
  traces).
- ``accelerate``: local_sgd.py (AdamW at the script's own lr 2e-3 with its linear schedule,
  its LocalSGD every ``--local_sgd_steps`` 8, the default, on both sides: on the DDP side
  Accelerate's own, which averages the parameters every 8 steps without DDP's gradient
  all-reduce in between, as upstream ships the script) under ``torchrun --standalone
  --nproc-per-node 2`` (``accelerate launch --cpu --num_processes 2`` starts one process:
  --cpu takes its simple launcher) against local_sgd_platoon.py. The port's own data, 64
  made-up pairs and 32 evaluated, is not learned (alone its accuracy stayed at or under 0.5
  for 40 epochs), so the probe gives the script MRPC-sized data of the same made-up task
  (2,048 pairs, upstream's batch 16, 256 evaluated) and 30 epochs; its evaluation is once an
  epoch, its loss here 1 - accuracy. No side reached accuracy 0.8 reliably (2026-11-29: DDP
  and platoon 0 of 3 seeds, one process 1 of 3): the task leaves 0.5 at a random epoch.

Each run is one real job, started by `probe.py` (the script unchanged, plus one hook that
prints each evaluation during training with its step and time; for Accelerate also the
data above). The job reaches the target
at the first evaluation step where its eval loss is at or under it: DDP's one model; for
platoon the mean of the two workers' own models' eval losses at that step (the script sees
its worker's model, not the centre: the mean is the conservative choice, the centre is
usually lower). The harness then stops the job. Seconds count from the command's start
(imports, data preparation and evaluations included, the same on both sides except that
each platoon worker evaluates the whole, small, eval set where DDP's ranks split it).

Steps are the claim; seconds are not: the machine is shared, so each run records the
1-minute load average as it started and ended, and prints its command line so that the
seconds can be measured again on a quiet machine (``--only ddp --seeds 2 --again``). Runs already in
the record (same framework, method, lr, seed) are skipped unless ``--again``.
"""
