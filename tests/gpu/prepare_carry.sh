#!/bin/bash
# Prepare, on this machine, what a GPU machine needs to run platoon and has not: run it here
# before a device run, then pass `carry: [".whl"]` with each call of tests/gpu/device_run.sh.
#
# Into .whl/ (ignored by git, about 2.5 MB in all; the device tool carries 64 MiB at most):
#   - the pyzmq 27.3.0 and posix_ipc 1.3.2 wheels for CPython 3.12 on manylinux x86_64
#     (the GPU machine has Python 3.12 and no network, and neither package);
#   - a setuptools wheel, for the editable install there if its Python has no setuptools;
#   - the compiled sync kernels for CPython 3.12 (_sync_kernels.cpython-312-x86_64-linux-gnu.so),
#     built here from platoon/rules/_sync_kernels.c with a Python 3.12's headers (PYTHON312, or
#     pyenv's), for a GPU machine without Python.h or a C compiler.
# Idempotent; exits non-zero naming what it could not prepare.
set -u
cd "$(dirname "$0")/../.."
CARRY=.whl
mkdir -p "$CARRY"
failed=0

pip_download() {  # wheels for CPython 3.12 on x86_64 Linux, whatever this machine's Python is
  python3 -m pip download -q --disable-pip-version-check --only-binary :all: --no-deps \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$CARRY" "$@" 2>&1 | grep -v "is ignored" || true
}

for spec in pyzmq==27.3.0 posix_ipc==1.3.2 setuptools; do
  name=${spec%%=*}
  if ls "$CARRY"/"$name"-*.whl >/dev/null 2>&1; then
    continue
  fi
  pip_download "$spec"
  if ! ls "$CARRY"/"$name"-*.whl >/dev/null 2>&1; then
    echo "prepare_carry: no wheel of $spec for CPython 3.12 could be downloaded" >&2
    failed=1
  fi
done

# The kernels, as setup.py builds them (same flags: the kernels must round like numpy).
SO=$CARRY/_sync_kernels.cpython-312-x86_64-linux-gnu.so
PY312=${PYTHON312:-}
if [ -z "$PY312" ]; then
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "" 2>/dev/null; then
      PY312=$candidate
      break
    fi
  done
fi
if [ ! -f "$SO" ] || [ platoon/rules/_sync_kernels.c -nt "$SO" ]; then
  include=$([ -n "$PY312" ] && "$PY312" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  if [ -z "$include" ] || [ ! -f "$include/Python.h" ]; then
    echo "prepare_carry: no Python 3.12 with headers here (set PYTHON312): the kernels are" \
      "not carried; the GPU machine builds them if it has Python.h and gcc, else syncs with" \
      "numpy" >&2
    failed=1
  elif ! gcc -shared -fPIC -O3 -ffp-contract=off -fno-fast-math -I"$include" \
      platoon/rules/_sync_kernels.c -o "$SO"; then
    echo "prepare_carry: building $SO failed" >&2
    failed=1
  fi
fi
if [ -f "$SO" ]; then  # the newest glibc it needs (the probe stage prints the GPU machine's)
  need=$(objdump -T "$SO" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)
  echo "prepare_carry: kernels for CPython 3.12 in $SO (needs ${need:-an unknown glibc})"
fi

ls -l "$CARRY"
echo "prepare_carry: $(du -sh "$CARRY" | cut -f1) in $CARRY; carry [\"$CARRY\"] with each device run"
exit $failed
