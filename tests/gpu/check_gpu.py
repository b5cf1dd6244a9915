"""Checks of the GPU paths, for a machine with a CUDA GPU: python tests/gpu/check_gpu.py

Runs the GPU-only tests of the suite (they skip elsewhere) and a launcher run pinned to
cuda0, and prints what it verified.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import torch
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: nothing to check here")
    code = subprocess.call([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs",
                            os.path.join(ROOT, "tests", "test_adapters.py"),
                            os.path.join(ROOT, "tests", "test_torch_sync.py")])
    code |= subprocess.call([sys.executable, "-m", "platoon.launch.cli",
                             os.path.join(ROOT, "examples", "lstm", "lstm"), "-D", "cuda0"])
    sys.exit(code)


if __name__ == "__main__":
    main()
