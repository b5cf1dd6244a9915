from setuptools import Extension, find_packages, setup

# One-pass sync kernels (platoon/rules/kernels.py). Optional: without a C compiler the install
# still succeeds and platoon syncs with numpy, logging once that it does. No FMA
# contraction and no fast-math: the kernels must round exactly like the numpy formulas.
SYNC_KERNELS = Extension(
    "platoon.rules._sync_kernels", ["platoon/rules/_sync_kernels.c"], optional=True,
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"])

setup(
    name="platoon-dp",  # the import name is platoon; "platoon" on the index is another project
    version="0.1.0",
    description="Data-parallel training of one model by many worker processes (EASGD, ASGD, "
                "Downpour, DiLoCo, DelayedNesterov, all-reduce) over ZeroMQ and POSIX shared "
                "memory",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    packages=find_packages(include=["platoon", "platoon.*"]),
    package_data={"platoon": ["py.typed"]},  # users' type checkers read the annotations
    ext_modules=[SYNC_KERNELS],
    python_requires=">=3.9",
    install_requires=["numpy>=1.22", "pyzmq>=22", "posix_ipc>=1.0"],
    entry_points={"console_scripts": ["platoon-launcher=platoon.launch.cli:main"]},
    extras_require={
        # torch is pinned: that release has a CPU build; an unpinned one pulls a CUDA build.
        # pytest-xdist: the suite runs its test files on 2 processes, longest first (pytest.ini;
        # --no-loadscope-reorder is new in 3.8)
        "test": ["pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3.8", "scikit-learn",
                 "matplotlib", "torch==2.13.0", "ruff==0.17.6", "mypy==2.4.1"],
        "examples": ["scikit-learn", "matplotlib"],
        "torch": ["torch==2.13.0"],
        # benchmarks.time_to_accuracy: MNIST-1D (generated offline) and the torch peers
        "bench": ["scikit-learn", "mnist1d", "torch==2.13.0"],
        "gpu": ["pycuda"],
        "mpi": ["mpi4py", "mpich"],
        # platoon.elastic's data plane (gloo); its lighthouse and membership need pyzmq only
        "elastic": ["torch==2.13.0"],
        # platoon.integrations.huggingface: the Trainer (which needs accelerate); tested with
        # transformers 5.24.0 and accelerate 1.15.0
        "huggingface": ["transformers>=4.46", "accelerate>=1.1", "torch==2.13.0"],
        # platoon.integrations.accelerate: LocalSGD; tested with accelerate 1.15.0
        "accelerate": ["accelerate>=1.1", "torch==2.13.0"],
        # platoon.integrations.lightning: PlatoonStrategy, for either of Lightning's packages
        # (the tests use both, and LightningCLI, which needs jsonargparse); tested with
        # lightning 2.6.6, pytorch-lightning 2.6.6 and jsonargparse 4.53.0
        "lightning": ["lightning>=2.1", "pytorch-lightning>=2.1", "jsonargparse[signatures]",
                      "torch==2.13.0"],
    },
)
