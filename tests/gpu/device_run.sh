#!/bin/bash
# One GPU machine, lent for about 30 minutes: platoon's GPU paths, checked in stages.
#
#   bash tests/gpu/device_run.sh STAGE...      stages: probe setup gputests launch suite bench
#
# Beforehand, here: bash tests/gpu/prepare_carry.sh (fills .whl/). Each call on the GPU machine
# carries [".whl"]; a call that names no `setup` gets it first when the machine is fresh (setup
# is idempotent, about a minute). Each stage runs at most 9 minutes and the stages of one call
# stop short of DEVICE_RUN_BUDGET_S (570 s: the device tool stops a call at 600 s), so a call
# always returns what it has. Everything is written under $OUT: STAGE.log per stage, pytest's
# junit XML, the launcher's logs (packed in launch-logs.tar.gz). Suggested calls (minutes):
#   1. probe setup gputests launch   (~6)    2. suite (~5)    3. bench (~6-8)
# Without a GPU (or with DEVICE_RUN_NO_GPU=1) every stage says so and exits 0 at once.
#
#   probe     what the machine is: GPUs, MIG, CUDA_VISIBLE_DEVICES, /dev/shm, memlock, toolchain,
#             the frameworks and the device attributes the registered centre relies on
#   setup     pyzmq and posix_ipc from .whl (no network there), an editable install (the
#             launcher's console script, the distribution's name), the compiled kernels (built
#             there if Python.h is, else the cp312 build carried in .whl), /dev/shm >= 32 GiB
#   gputests  every GPU test the suite has: test_adapters, test_torch_sync,
#             test_torch_tensor_moves, tests/gpu
#   launch    the launcher on the GPU: LSTM on cuda0, two workers sharing cuda0 (with and
#             without overlap), -n 3 on the GPUs, the environment workers get, the LM example as
#             a platoon job and its DDP baseline (torchrun, two ranks on one GPU)
#   suite     the whole suite, with the GPUs hidden (CUDA_VISIBLE_DEVICES=""), so that it
#             means what it means on a machine without one (gputests covers the GPU)
#   bench     python -m benchmarks.bench_gpu_sync $BENCH_ARGS, if that module exists
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/platoon-device-out}
PY=${PYTHON:-python3}
CARRY=$ROOT/.whl
STAGES="probe setup gputests launch suite bench"
STAGE_MAX_S=540
BUDGET_S=${DEVICE_RUN_BUDGET_S:-570}
SETUP_DONE=/tmp/platoon-device-setup-done
export PYTHONUNBUFFERED=1
# the checkout on every process's path, also where the editable install fails (subprocesses of
# the tests start from other folders)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

log() { echo "== device_run: $* ($(date +%T))"; }

no_gpu() {  # prints why there is no GPU to use, and succeeds; fails when there is one
  if [ -n "${DEVICE_RUN_NO_GPU:-}" ]; then
    echo "DEVICE_RUN_NO_GPU is set"
  elif ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi is not on PATH"
  elif ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
    echo "nvidia-smi -L lists no GPU"
  else
    return 1
  fi
}

# ---- the stages (each runs in a shell of its own, under a time limit) ----

probe() {
  nvidia-smi
  nvidia-smi -L
  nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,mig.mode.current,memory.total,driver_version \
    --format=csv
  nvidia-smi topo -m
  uname -r; nproc; free -g; df -h /dev/shm; echo "ulimit -l: $(ulimit -l)"; ldd --version | head -1
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER-unset}"
  echo "python: $(command -v "$PY") $("$PY" -V 2>&1); pip: $("$PY" -m pip -V 2>&1)"
  for tool in gcc cc nvcc mpiexec torchrun; do echo "$tool: $(command -v $tool || echo none)"; done
  echo "carried: $(ls "$CARRY" 2>/dev/null | tr '\n' ' ')"
  timeout 180 "$PY" - <<'PY'
import importlib, os, sys, sysconfig
print("Python.h:", os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
      "site:", sysconfig.get_paths()["purelib"],
      "externally managed:", os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"],
                                                         "EXTERNALLY-MANAGED")))
for name in ("setuptools", "numpy", "zmq", "posix_ipc", "mpi4py", "pytest", "pytest_timeout"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "(no __version__)"))
    except Exception as exc:
        print(name, "MISSING:", exc)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "devices",
          torch.cuda.device_count(), torch.cuda.get_device_name(0))
    print(torch.cuda.get_device_properties(0))
except Exception as exc:
    print("torch:", exc)
try:
    import cupy
    rt = cupy.cuda.runtime
    # what the registered centre relies on: cudaDevAttrHostRegisterSupported (99),
    # cudaDevAttrCanUseHostPointerForRegisteredMem (91)
    print("cupy", cupy.__version__, "hostRegisterSupported", rt.deviceGetAttribute(99, 0),
          "canUseHostPointerForRegisteredMem", rt.deviceGetAttribute(91, 0))
except Exception as exc:
    print("cupy:", exc)
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
try:
    import jax
    print("jax", jax.__version__, jax.default_backend(), jax.devices())
except Exception as exc:
    print("jax:", exc)
PY
}

pip_install() {  # into the interpreter's environment, past a distribution's EXTERNALLY-MANAGED
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps "$@" && return 0
  echo "setup: retrying with --break-system-packages"
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --break-system-packages "$@"
}

setup() {
  local missing=0
  for name in pyzmq posix_ipc; do
    if ! ls "$CARRY"/$name-*.whl >/dev/null 2>&1; then
      echo "setup: no $name wheel in .whl/: run tests/gpu/prepare_carry.sh where there is a" \
        "network, and carry [\".whl\"]"
      missing=1
    fi
  done
  if ! "$PY" -c "import zmq, posix_ipc" 2>/dev/null; then
    [ $missing = 0 ] || return 1
    pip_install "$CARRY"/pyzmq-*.whl "$CARRY"/posix_ipc-*.whl || return 1
  fi
  if ! "$PY" -c "import setuptools" 2>/dev/null && ls "$CARRY"/setuptools-*.whl >/dev/null 2>&1; then
    pip_install "$CARRY"/setuptools-*.whl
  fi
  # the distribution (its name, the platoon-launcher script); builds the kernels if it can
  # --use-pep517: without it pip runs `setup.py develop`, which setuptools >= 80 hands to a
  # nested pip that builds in isolation, i.e. needs a network (the first device run failed so)
  pip_install --no-build-isolation --use-pep517 -e . 2>&1 | tail -15
  local so=platoon/rules/_sync_kernels.cpython-312-x86_64-linux-gnu.so
  if ! "$PY" -c "from platoon.rules import kernels as k; exit(k.compiled is None)" 2>/dev/null \
      && [ -f "$CARRY/${so##*/}" ]; then
    echo "setup: the kernels were not built here; using the cp312 build carried in .whl"
    cp "$CARRY/${so##*/}" "$so"
  fi
  "$PY" - <<'PY'
import importlib.metadata, os, sys
import platoon, zmq, posix_ipc
from platoon.rules import kernels
print("platoon from", os.path.dirname(platoon.__file__), "| distribution",
      importlib.metadata.packages_distributions().get("platoon"), "| pyzmq", zmq.__version__,
      "| compiled kernels:", kernels.compiled is not None)
script = os.path.join(os.path.dirname(sys.executable), "platoon-launcher")
print("console script:", script, "present" if os.path.exists(script) else "MISSING")
PY
  local shm_kib ram_kib  # a centre of 1e9 f32 needs /dev/shm >= 8 GiB (and 2x for the bench)
  shm_kib=$(df --output=size -k /dev/shm | tail -1)
  ram_kib=$(awk '/^MemTotal/ {print $2}' /proc/meminfo)
  if [ "$shm_kib" -lt 33554432 ] && [ "$ram_kib" -ge 100663296 ]; then  # < 32 GiB, RAM >= 96
    echo "setup: /dev/shm is $((shm_kib / 1048576)) GiB; remounting it at 64 GiB"
    mount -o remount,size=64G /dev/shm || echo "setup: remount failed; big bench sizes may fail"
  fi
  touch "$SETUP_DONE"
}

gputests() {
  # -o addopts: pytest.ini's "-n 2" needs pytest-xdist, which the GPU machine lacks
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest -o addopts= -q -rs -p no:cacheprovider --timeout 240 \
    --junitxml "$OUT/gputests.xml" tests/test_adapters.py tests/test_torch_sync.py \
    tests/test_torch_tensor_moves.py tests/gpu
}

LAUNCH_FAILED=""
launched() {  # NAME ARGS...: one launcher job; its plan, last lines and what the workers said
  local name=$1 code
  shift
  log "launch $name: platoon-launcher $*"
  rm -rf "$OUT/launch/$name" "$OUT/launch/$name.out"
  timeout 150 "$PY" -m platoon.launch.cli --log-dir "$OUT/launch/$name" "$@" \
    > "$OUT/launch/$name.out" 2>&1
  code=$?
  grep -h "planned\|worker(s) on" "$OUT/launch/$name.out"
  tail -6 "$OUT/launch/$name.out"
  grep -h "training on\|^DEVICE\|epoch\|Error\|error" "$OUT/launch/$name"/worker*.log 2>/dev/null \
    | tail -12
  echo "exit code $code"
  [ $code = 0 ] || LAUNCH_FAILED="$LAUNCH_FAILED $name"
}

launch() {
  mkdir -p "$OUT/launch"
  unset PLATOON_ASSUME_GPUS
  launched lstm-cuda0 examples/lstm/lstm -D cuda0
  launched lstm-shared examples/lstm/lstm -D cuda0 cuda0
  launched lstm-shared-overlap examples/lstm/lstm -D cuda0 cuda0 -w --overlap
  launched envcheck-n3 tests/experiments/envcheck -n 3
  launched envcheck-shared tests/experiments/envcheck -D cuda0 cuda0 cpu
  local quick="--epochs 1 --max-batches 40 --valid-bytes 4000"
  launched lm-platoon -n 2 examples/lm/train.py -- $quick
  log "launch lm-ddp: torchrun --nproc-per-node 2 examples/lm/ddp.py (two ranks on the GPUs)"
  timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 examples/lm/ddp.py \
    $quick > "$OUT/launch/lm-ddp.out" 2>&1 || LAUNCH_FAILED="$LAUNCH_FAILED lm-ddp"
  tail -8 "$OUT/launch/lm-ddp.out"
  # one file: the device tool returns only so many files, and the workers' logs matter
  tar czf "$OUT/launch-logs.tar.gz" -C "$OUT" launch && rm -rf "$OUT/launch"
  [ -z "$LAUNCH_FAILED" ] || { echo "launch: failed:$LAUNCH_FAILED"; return 1; }
}

suite() {
  CUDA_VISIBLE_DEVICES="" "$PY" -m pytest -o addopts=-ra -q -p no:cacheprovider --durations 15 \
    --junitxml "$OUT/suite.xml" ${SUITE_ARGS:-}
}

bench() {
  if [ ! -f benchmarks/bench_gpu_sync.py ]; then
    echo "bench: benchmarks/bench_gpu_sync.py is not in this checkout: nothing to run"
    return 0
  fi
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m benchmarks.bench_gpu_sync ${BENCH_ARGS:-}
}

# ---- dispatch ----

if [ "${1:-}" = "--in-stage" ]; then  # one stage, in this shell (the loop below starts it)
  "$2"
  exit $?
fi
if [ $# = 0 ]; then
  echo "usage: bash tests/gpu/device_run.sh STAGE...   (stages: $STAGES)" >&2
  exit 2
fi
for stage in "$@"; do
  case " $STAGES " in
    *" $stage "*) ;;
    *) echo "device_run: unknown stage '$stage' (stages: $STAGES)" >&2; exit 2 ;;
  esac
done
if why=$(no_gpu); then
  for stage in "$@"; do
    log "$stage: skipped, no GPU here ($why)" | tee "$OUT/$stage.log"
  done
  exit 0
fi
stages=("$@")
if [ ! -f "$SETUP_DONE" ] && [[ " $* " != *" setup "* ]] && [[ " $* " != " probe " ]]; then
  stages=(setup "$@")  # a fresh machine: the others need platoon installed
fi
start=$SECONDS
failed=0
for stage in "${stages[@]}"; do
  left=$((BUDGET_S - (SECONDS - start)))
  limit=$((left < STAGE_MAX_S ? left : STAGE_MAX_S))
  if [ "$limit" -lt 30 ]; then
    log "$stage: skipped, ${left} s left of this call's ${BUDGET_S} s" | tee "$OUT/$stage.log"
    continue
  fi
  log "$stage (at most $limit s)"
  timeout -k 10 "$limit" bash "$0" --in-stage "$stage" > >(tee "$OUT/$stage.log") 2>&1
  code=$?
  [ $code = 124 ] && log "$stage: stopped after $limit s" | tee -a "$OUT/$stage.log"
  log "$stage: exit code $code"
  [ $code = 0 ] || failed=1
done
exit $failed
