"""compressed_mean across the ranks of `mpiexec -n 2 python compressed_mean_ranks.py`.

Each rank averages arrays of its own (every codec, float32 and float64, with and without
error feedback, a subset of the ranks) and checks against the others that every rank got the
same bits, the bytes it was told it sent, and the error bound; a rank holding NaN makes every
rank raise NonFiniteValues (none is left waiting). Prints "OK rank R checks N" at the end.
"""

import math

import numpy as np
from mpi4py import MPI

from platoon.errors import NonFiniteValues
from platoon.mpi.compress import compressed_mean
from platoon.node.compress import BLOCK, ErrorFeedback, RawCodec, make_codec

LEVELS = {"int8": 127, "int4": 7}


def bound(inputs, name):
    """Per element: the mean over ranks of each rank's scale/2 (0 for a lossless codec)."""
    if name not in LEVELS:
        return np.zeros(inputs[0].size)
    halves = []
    for x in inputs:
        padded = np.zeros(math.ceil(x.size / BLOCK) * BLOCK, np.float32)
        padded[:x.size] = x
        scale = np.abs(padded.reshape(-1, BLOCK)).max(axis=1) / LEVELS[name]
        halves.append(np.repeat(scale, BLOCK)[:x.size] / 2)
    return np.mean(halves, axis=0)


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    checks = 0

    def same_everywhere(mean, what):
        copies = comm.allgather(mean.tobytes())
        assert all(c == copies[0] for c in copies), "ranks differ: %s" % what

    for name in ("float32", "int8", "int4", "raw"):
        for dtype in (np.float32, np.float64):
            codec = RawCodec(dtype) if name == "raw" else make_codec(name)
            for n in (1000, 257, 1):
                rng = np.random.default_rng(100 * rank + n)
                feedback = ErrorFeedback(n, dtype) if name in LEVELS else None
                for rnd in range(20):
                    x = (rng.normal(size=n) * 10 ** rng.uniform(-3, 2, size=n)).astype(dtype)
                    fed = x + feedback.residual if feedback is not None else x
                    mean, sent = compressed_mean(comm, x, codec, feedback)
                    what = (name, dtype.__name__, n, rnd)
                    assert mean.dtype == dtype and mean.shape == x.shape, what
                    assert sent == codec.encoded_size(n) * (size - 1), (what, sent)
                    same_everywhere(mean, what)
                    inputs = comm.allgather(fed)
                    exact = np.mean(np.array(inputs, np.float64), axis=0)
                    lossy = dtype == np.float32 or name == "float32"  # float32 rounding
                    slack = np.abs(inputs).max(axis=0) * (1e-6 if lossy else 1e-12)
                    error = np.abs(mean - exact)
                    assert (error <= bound(inputs, name) * (1 + 1e-4) + slack + 1e-30).all(), \
                        (what, float(error.max()))
                    checks += 1
    # Only rank 1's message: rank 0 sends nothing, and everyone gets rank 1's value as sent.
    x = np.random.default_rng(rank).normal(size=300).astype(np.float32)
    mean, sent = compressed_mean(comm, x, RawCodec(np.float32), None, among=[1])
    assert sent == (0 if rank == 0 else 1200 * (size - 1)), sent
    same_everywhere(mean, "among [1]")
    assert mean.tobytes() == comm.bcast(x.tobytes(), root=1)
    checks += 1
    # NaN or Inf on rank 1 only, whatever the codec (lossless ones too: the mean would carry
    # it to every rank): both ranks raise, naming rank 1; the next call works again.
    for name in ("int8", "int4", "float32", "raw"):
        for dtype in (np.float32, np.float64, np.float16):
            if dtype == np.float16 and name != "raw":
                continue
            codec = RawCodec(dtype) if name == "raw" else make_codec(name)
            for bad in (np.nan, np.inf, -np.inf):
                y = np.ones(600, dtype)
                if rank == 1:
                    y[5] = bad
                try:
                    compressed_mean(comm, y, codec, None)
                    raise AssertionError("%r was averaged by %s %s" % (bad, name, dtype))
                except NonFiniteValues as exc:
                    assert "rank(s) 1 of %d hold NaN or Inf" % size in str(exc), exc
                    assert exc.ranks == [1], exc.ranks
                mean, _ = compressed_mean(comm, np.ones(600, dtype), codec, None)
                assert (mean == 1).all()
                checks += 1
    # A float64 value beyond float32's range cannot travel as float32 either.
    y = np.ones(10, np.float64)
    if rank == 1:
        y[3] = 1e300
    try:
        compressed_mean(comm, y, make_codec("float32"), None)
        raise AssertionError("1e300 went out as float32 inf")
    except NonFiniteValues as exc:
        assert "rank(s) 1 of %d" % size in str(exc), exc
    checks += 1
    print("OK rank %d checks %d" % (rank, checks), flush=True)


if __name__ == "__main__":
    main()
