#!/usr/bin/env bash
# Run the linear-regression example by hand: one controller and N workers on this machine.
# usage: examples/linear/run.sh [N_WORKERS] [PORT]
# The interpreter: $PYTHON if set, else the repository's .venv (the README's set-up), else python3.
set -euo pipefail
cd "$(dirname "$0")"
venv_python="$(cd ../.. && pwd)/.venv/bin/python"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$venv_python" ]]; then PYTHON=$venv_python; else PYTHON=python3; fi
fi
workers=${1:-2}
port=${2:-5567}
"$PYTHON" linear_controller.py --port "$port" --workers "$workers" &
pids=($!)
for _ in $(seq "$workers"); do
    "$PYTHON" linear_worker.py --port "$port" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT INT TERM
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
trap - EXIT
exit $status
