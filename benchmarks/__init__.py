"""platoon's benchmark suite: `python -m benchmarks` prints one table of ratios.

Every figure is compared with a baseline measured in the same run on the same
machine (numpy copy, the naive formula, raw pyzmq, a plain single process), so
the ratios survive the machine's load better than absolute figures do.
"""
