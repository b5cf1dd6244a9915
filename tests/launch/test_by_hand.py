"""Running a job by hand, as the README shows it: controller first, then workers."""

import os
import re
import socket

import pytest

from platoon import Controller, RemoteError, Worker

from helpers import ROOT

README = os.path.join(ROOT, "README.md")


def readme_block(first_line):
    with open(README) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert found, "README.md has no python block starting with %r" % first_line
    return found[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_example_by_hand_with_a_late_second_worker(procs, tmp_path):
    """Before: worker 0 finished the job alone, serve() returned, and worker 1 died with
    ControllerTimeout 60 s later."""
    port = str(free_port())
    for name in ("my_controller.py", "my_worker.py"):
        (tmp_path / name).write_text(readme_block("# " + name).replace("5567", port))
    controller = procs(str(tmp_path / "my_controller.py"))
    first = procs(str(tmp_path / "my_worker.py"))
    assert first.wait(60) == 0, first.output + controller.output
    second = procs(str(tmp_path / "my_worker.py"))  # after the first has trained it all
    assert second.wait(30) == 0, second.output + controller.output
    assert controller.wait(30) == 0, controller.output


class Steps(Controller):
    def handle_control(self, req, worker_id, req_info):
        return "stop"


def test_a_worker_that_comes_after_the_job_ended_fails_at_once(serve):
    ctl = Steps(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        assert w.send_req("next") == "stop"
    serving.join()  # serve() has returned; the controller is still open
    with pytest.raises(RemoteError, match="has ended: its 1 worker.* came too late"):
        Worker(ctl.control_port, timeout_s=20)
    ctl.close()


def test_a_script_pair_written_for_the_original_platoon_runs_unchanged(procs):
    """Before: `platoon.compat.param_sync` was missing, dict requests were refused, and
    Controller.default_parser / default_arguments did not exist."""
    controller = procs("original_controller.py", "--control-port", "0", "-nw", "2")
    port = controller.wait_for_line("PORT").split()[1]
    workers = [procs("original_worker.py", port) for _ in range(2)]
    for w in workers:
        assert w.wait(60) == 0, w.output + controller.output
    assert controller.wait(30) == 0, controller.output
    assert int(controller.wait_for_line("TRAINED").split()[1]) >= 40
