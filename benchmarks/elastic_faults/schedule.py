"""The fault race's pure logic: the fault schedule (the same for every member: it depends on
the seed only), and the accounting of a run from its processes' events (useful steps,
goodput, each joiner's time to its first contributing round)."""

import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

NODES = ("a", "b", "c")


@dataclass(frozen=True)
class Fault:
    """Node `node`'s processes are killed -9 at `kill_s` and it is started again at
    `restart_s` (seconds from the race's start)."""
    kill_s: float
    node: str
    restart_s: float


def fault_schedule(seed: int, horizon_s: float, every_s: float = 60.0, down_s: float = 10.0,
                   jitter_s: float = 5.0, nodes: Sequence[str] = NODES,
                   first_s: Optional[float] = None) -> List[Fault]:
    """A kill about every `every_s` seconds (each gap `every_s` +- `jitter_s`; the first at
    `first_s` +- `jitter_s`, by default half a gap in, so that a run shorter than two gaps also
    sees a node come back) until `horizon_s`, each of a node drawn at random (never the same
    node twice running), each node started again `down_s` later. Raises ValueError for
    settings where a node would be killed again before it is back."""
    if not every_s - jitter_s > down_s or down_s <= 0 or jitter_s < 0:
        raise ValueError("a fault every %g +- %g s with nodes down %g s: a node would be "
                         "killed before it is back; give every_s - jitter_s > down_s > 0"
                         % (every_s, jitter_s, down_s))
    rng = random.Random(seed)
    out, t, last = [], (every_s / 2 if first_s is None else first_s) - every_s, None
    while True:
        t += every_s + rng.uniform(-jitter_s, jitter_s)
        if t >= horizon_s:
            return out
        node = rng.choice([n for n in nodes if n != last])
        out.append(Fault(round(t, 3), node, round(t + down_s, 3)))
        last = node


@dataclass
class Incarnation:
    """One start of one node's processes: `started` (time.time() of its start command),
    `ended` (when it was killed by a fault, else None: alive at the end), its worker's
    `steps` events [(time, steps)], the CPU seconds a step took it (`step_s`), and its
    contributions: `rounds` (times of the rounds its
    centre went into: elastic and torchft) or `checkpoints` (times its node's centre was saved:
    the fixed-world job, which restarts from them)."""
    node: str
    started: float
    ended: Optional[float] = None
    steps: Optional[List] = None
    rounds: Optional[List[float]] = None
    checkpoints: Optional[List[float]] = None
    step_s: Optional[float] = None
    first_contribution_s: Optional[float] = None  # its own report, where it makes one
    loaded: Optional[float] = None  # when its worker had imported, read its data, built its model
    worker_started: Optional[float] = None  # when its worker's process started
    healed_s: Optional[float] = None  # its own report of its heal (elastic), from its start
    on_the_way: Optional[Dict[str, float]] = None  # its node's milestones (elastic), from its start
    trained_from: Optional[float] = None  # when its worker began its steps


def _steps_at(steps, t):
    """Steps made by time `t` (the last event at or before it; 0 before the first)."""
    done = 0
    for when, n in steps or ():
        if when <= t:
            done = n
    return done


def useful_steps(inc: Incarnation, end: float) -> int:
    """The steps of `inc` that the job kept, up to `end` (the target's time): all of them when
    it was alive at the end; when a fault killed it, those made before its last contribution
    (round or checkpoint) before the kill: what came after was lost with it."""
    if inc.ended is None or inc.ended >= end:
        return _steps_at(inc.steps, end)
    marks = inc.checkpoints if inc.checkpoints is not None else inc.rounds
    kept = [t for t in marks or () if t <= inc.ended]
    return _steps_at(inc.steps, max(kept)) if kept else 0


def first_contribution_s(inc: Incarnation) -> Optional[float]:
    """Seconds from `inc`'s start command to its first contributing round: its own report
    where it made one (the elastic node's), else its first round after its start."""
    if inc.first_contribution_s is not None:
        return inc.first_contribution_s
    later = [t for t in inc.rounds or () if t >= inc.started]
    return min(later) - inc.started if later else None


def _since(when, start):
    """Seconds from `start` to `when` (None if unknown; 0 for a hair before: a process's
    start time is known to a clock tick)."""
    return None if when is None else round(max(0.0, when - start), 3)


def survivors_go_on_s(incarnations: Sequence[Incarnation], kill_at: float, node: str,
                      end: float) -> Optional[float]:
    """Seconds from `node`'s kill at `kill_at` until every other node alive then had made a
    round again (None when one made none before `end`, or none survived: the MPI job)."""
    alive = [i for i in incarnations if i.node != node and i.started <= kill_at
             and (i.ended is None or i.ended > kill_at)]
    if not alive:
        return None
    after = [min((t for t in i.rounds or () if kill_at < t <= end), default=None) for i in alive]
    return None if None in after else round(max(after) - kill_at, 3)


def node_rates(incarnations: Sequence[Incarnation], end: float) -> Dict:
    """{node: {"steps", "train_s", "steps_per_s"}}: each node's steps made by `end` (all its
    incarnations), the seconds its workers trained (from their first step, after start-up, to
    their kill or `end`) and the steps a second over them (None when it never trained)."""
    out: Dict = {}
    for i in incarnations:
        until = min(end, i.ended or end)
        node = out.setdefault(i.node, {"steps": 0, "train_s": 0.0})
        node["steps"] += _steps_at(i.steps, until)
        if i.trained_from is not None and i.trained_from < until:
            node["train_s"] += until - i.trained_from
    for node in out.values():
        node["train_s"] = round(node["train_s"], 3)
        node["steps_per_s"] = node["steps"] / node["train_s"] if node["train_s"] else None
    return {n: out[n] for n in sorted(out)}


def account(incarnations: Sequence[Incarnation], start: float, end: float,
            workers: int = len(NODES), kills: Sequence = ()) -> Dict:
    """A run's steps, useful steps and goodput (useful steps over the steps `workers` workers
    could have made from `start` to `end` at the median CPU time a step took them: a core
    each, no faults, no start-up), and each restarted node's time to its first contributing
    round, for each kill (time, node) before `end` how long the survivors took to make a
    round again, and each node's steps a second (`node_rates`)."""
    made = sum(_steps_at(i.steps, min(end, i.ended or end)) for i in incarnations)
    useful = sum(useful_steps(i, end) for i in incarnations)
    step_times = sorted(i.step_s for i in incarnations if i.step_s)
    possible = (workers * (end - start) / step_times[len(step_times) // 2]
                if step_times and end > start else None)
    joiners = []
    seen = set()
    for i in sorted(incarnations, key=lambda i: i.started):
        if i.node in seen and i.started < end:
            joiners.append({"node": i.node, "started_s": round(i.started - start, 3),
                            "first_contribution_s": first_contribution_s(i),
                            "worker_started_s": _since(i.worker_started, i.started),
                            "worker_loaded_s": _since(i.loaded, i.started),
                            "healed_s": i.healed_s, "on_the_way": i.on_the_way,
                            "window_s": round(end - i.started, 3)})
        seen.add(i.node)
    return {"steps": made, "useful_steps": useful,
            "step_s": step_times[len(step_times) // 2] if step_times else None,
            "steps_possible": possible,
            "goodput": useful / possible if possible else None, "joiners": joiners,
            "nodes": node_rates(incarnations, end),
            "survivors_go_on_s": [survivors_go_on_s(incarnations, t, node, end)
                                  for t, node in kills if t < end]}
