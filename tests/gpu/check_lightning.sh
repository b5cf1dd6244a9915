#!/bin/bash
# The Lightning strategy on a GPU machine: two workers of examples/lightning/train.py sharing
# cuda0 under the launcher, 40 steps. Beforehand, here: put the wheels of lightning,
# pytorch_lightning, lightning_utilities, torchmetrics and fsspec (and tqdm, pyyaml, packaging,
# typing_extensions, installed there only where missing) for CPython 3.12 into .whl/ beside
# prepare_carry.sh's; there: bash tests/gpu/device_run.sh setup && bash tests/gpu/check_lightning.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/platoon-device-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
install() {
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps "$@" ||
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
      --break-system-packages "$@"
}
install .whl/lightning-*.whl .whl/pytorch_lightning-*.whl .whl/lightning_utilities-*.whl \
  .whl/torchmetrics-*.whl .whl/fsspec-*.whl || exit 1
for pair in tqdm:tqdm yaml:pyyaml packaging:packaging typing_extensions:typing_extensions; do
  "$PY" -c "import ${pair%%:*}" 2>/dev/null || install .whl/"${pair##*:}"-*.whl
done
"$PY" -c "import lightning, torch; print('lightning', lightning.__version__, 'torch',
torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
unset PLATOON_ASSUME_GPUS
cd "$OUT"  # the example writes lightning-bytes/ and platoon-logs/ here
timeout 150 "$PY" -m platoon.launch.cli -D cuda0 cuda0 "$OLDPWD/examples/lightning/train.py" \
  -- --steps 40 > lightning.out 2>&1
code=$?
grep -h "GPU available\|final result\|final validation\|Error\|error" lightning.out | head -20
tail -5 lightning.out
ls lightning-bytes/lightning_logs
echo "exit code $code"
exit $code
