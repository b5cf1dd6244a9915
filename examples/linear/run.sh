#!/usr/bin/env bash
# Run the linear-regression example by hand: one controller and N workers on this machine.
# usage: examples/linear/run.sh [N_WORKERS] [PORT]
set -euo pipefail
cd "$(dirname "$0")"
workers=${1:-2}
port=${2:-5567}
python linear_controller.py --port "$port" --workers "$workers" &
pids=($!)
for _ in $(seq "$workers"); do
    python linear_worker.py --port "$port" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT INT TERM
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
trap - EXIT
exit $status
