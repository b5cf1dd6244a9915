"""The status file: what a launched controller tells its launcher, as one JSON object.

The controller writes it (atomically, 0600) at most twice a second and when `serve`
ends; the launcher reads it for the status line, the failure report and the end-of-job
summary. Its keys are the contract between the two processes:

- ``minibatches``, ``syncs``: totals over the job; ``metrics``: the latest reported;
  ``reports``: {worker id: its reported totals and latest metrics};
  ``workers`` (registered), ``done`` (left); ``worker_pids``: the pid of every worker
  that registered (written before its registration is answered, so a worker process that
  has exited and is not listed never registered); ``elapsed_s`` (since `serve` started) and
  ``syncs_per_s``; ``tie_rounds``, ``tie_bytes_sent`` (of which ``tie_lossless_rounds``,
  ``tie_lossless_bytes_sent``) in a multi-node job with a centre tie;
  ``metrics_dropped`` (in the job's and in each report): how many reported metrics were not
  kept (the first MAX_METRICS names are kept, each of at most MAX_NAME characters; a value
  that is not a number is cut to MAX_TEXT characters);
- ``failure``: {``error``: "Type: message", ``thread``: a thread's name}, once `serve`
  raised an error of its own (the controller's fault: it leads the failure report);
- ``failed_worker``: {``worker_id``, ``pid``}, once `serve` ended because
  `handle_worker_death` raised for that worker (that worker leads the report).

An elastic job's lighthouse and nodes each write one too, where their settings'
``status_file`` says (``--status-file``; `platoon._os.elasticsettings`), with the same
`write_status`; ``platoon-launcher --elastic`` reads them, not their logs:

- the lighthouse's: ``address`` (where it serves), ``pid``, ``quorum`` (its latest,
  {``id``, ``members``}, or null before the first), ``left_out`` ({node: why it is out of
  the quorums}), ``nodes`` ({node: what it last told the lighthouse, in its heartbeats and
  its last message: ``state``, ``rounds``, ``kept_own_centre``, ``final_result``, ``error``,
  as in its own file}); written as it starts, at each new quorum, at most twice a second as
  the nodes' statuses change, and as it ends;
- an elastic node's: ``name``, ``pid``, ``state`` (``running``, then ``finished``,
  ``failed`` or ``refused``), ``quorum`` (the newest it has heard of, {``id``, ``members``},
  or null), ``quorums`` (the ids of those it made outer rounds in), ``rounds``,
  ``kept_own_centre`` (true once it gave the final round up and kept its own centre),
  ``final_result`` ({``metrics``, ``worker``}: the agreed centre's evaluation, on the node that
  made it), ``error`` (once it failed: why); written as they change and when it ends.

Standard library only: the launcher loads neither zmq nor numpy.
"""

import json
import os
from typing import Any, Dict, Optional, Sequence

MAX_METRICS = 32  # metric names kept for the job, and for each worker (the first reported)
MAX_NAME = 64  # characters in a metric's name, at most
MAX_TEXT = 100  # characters of a metric that is not a number (longer ones are cut)


def shortened(text: str) -> str:
    """`text` cut to MAX_TEXT characters, ending with "…" when cut."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def write_status(path: str, status: Dict[str, Any], dir_fd: Optional[int] = None) -> None:
    """Replace the status file at `path` with `status`, atomically, readable by its owner only.
    With `dir_fd` (the directory of `path`, opened by the launcher), the file is written in
    that directory by name, whatever `path`'s directories lead to now. Never through a link.
    Raises OSError, TypeError or ValueError (not JSON) as `json.dump` and `os.open` do."""
    name = os.path.basename(path) if dir_fd is not None else path
    tmp = "%s.%d.tmp" % (name, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        json.dump(status, f)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_status(path: Optional[str]) -> Dict[str, Any]:
    """The status file at `path` as a dict; {} when there is none (yet) or it is unreadable."""
    if path is None:
        return {}
    try:
        with open(path) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def quorum_entry(quorum_id: int, members: Sequence[str]) -> Dict[str, Any]:
    """A quorum as a status file holds it."""
    return {"id": int(quorum_id), "members": list(members)}


def quorum_text(entry: Any) -> Optional[str]:
    """``quorum ID: A, B`` for a status file's quorum entry; None for none (or a damaged one)."""
    try:
        return "quorum %d: %s" % (entry["id"], ", ".join(map(str, entry["members"])))
    except (TypeError, KeyError, ValueError):
        return None


def final_result_text(node: str, metrics: Dict[str, Any]) -> str:
    """How an elastic job's final result is said: by the node that evaluated it, in its log,
    and by the launcher, in its summary."""
    return "final result (the agreed centre, evaluated once by node %s): %s" % (
        node, ", ".join("%s %s" % item for item in metrics.items()))
