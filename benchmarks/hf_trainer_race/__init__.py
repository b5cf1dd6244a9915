"""The Hugging Face Trainer race: examples/huggingface's Trainer script (a byte-level GPT-2
from a config on Python's own source, AdamW with a warm-up and a linear decay) to a target
eval loss, as one process, as the Trainer's own DDP under torchrun (2 ranks), and as a platoon
job of 2 workers through PlatoonCallback with EASGD (each worker its own AdamW: EAMSGD's
momentum is AdamW's here) and with DiLoCo.

usage: python -m benchmarks.hf_trainer_race [--tune] [--methods a,b] [--reps N]
                                             [--straggler-reps N] [--quick]

`--tune` runs every method's lr grid on seed 0 and records the point with the fewest steps to
the target (interpolated between evaluations) in
benchmarks/results/hf_trainer_race_tuning.json, keeping the points recorded there already (a
grid extended runs only its new points); the measured run takes the
recorded points (the grid's middle without them), runs every method on new seeds, methods
alternating, then DDP and platoon with one process slowed 2x, and writes
benchmarks/results/hf_trainer_race.{json,md}, each run with the load average as it started.
Each run is a real job (race_trainer.py under python, torchrun or platoon-launcher); its
clock counts training only (evaluations every 100 steps excluded; platoon's evaluate the
centre). `--quick`: a tiny model and an easy target, to check the harness (the test does).
"""
