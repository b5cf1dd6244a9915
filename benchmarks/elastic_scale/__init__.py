"""An elastic round's cost as nodes are added: bytes each node sends per round (from its link's
kernel counters) and the round's time, at 2, 4, 8 and 16 nodes (network namespaces on one
switch; each node one process running `QuorumGroup.compressed_mean` on a tiny model, no
training), the reduce-scatter round against the all-gather of whole messages it replaced.
``python -m benchmarks.elastic_scale`` (root: it makes namespaces)."""
