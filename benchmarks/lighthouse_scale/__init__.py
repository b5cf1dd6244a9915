"""The lighthouse at scale: one real lighthouse process (python -m platoon.elastic.lighthouse)
and 100 or 1,000 simulated nodes (`sim`: heartbeat-only clients speaking the lighthouse's
signed protocol, many per process, each from its own source address 127.1.x.y so that the
per-source connection cap holds as on a cluster; no training, no data plane). Measured: the
time from the last node's registration to the first quorum that holds them all (against the
join grace window), heartbeat reply latency (p50, p99), the lighthouse process's CPU share
over the run (from /proc/PID/stat), its serving thread's CPU per request and the requests
waiting per read (its own counts), and the timeouts by cause, with the simulators niced and
not; and the pace the lighthouse asks its nodes for (`--max-heartbeats-per-s`: past 200 nodes
at its default, each node heartbeats less often than its own 0.1 s) beside the requests per
second it got. ``python -m benchmarks.lighthouse_scale``."""
