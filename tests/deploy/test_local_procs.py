"""``deploy/local/procs.py``: a process that is starting is not taken for one that exited."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.scripts_loader import load_script

procs = load_script("deploy/local/procs.py")


def test_a_pid_running_another_command_is_not_alive_but_has_not_exited() -> None:
    """Between fork and exec a child's command line is still its parent's: ``alive`` (the
    recorded command runs) is false then, ``exited`` must be too, or a slow start reads as a
    crash (a spurious "not ready: prometheus" on a loaded machine)."""
    starting = procs.Proc(name="p", cmd=["/usr/bin/prometheus"], pid=os.getpid(), log="-")
    assert not procs.alive(starting)
    assert not procs.exited(starting)


def test_a_reaped_pid_has_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = procs.Proc(name="p", cmd=[sys.executable, "-c", "pass"], pid=child.pid, log="-")
    assert procs.exited(gone) and not procs.alive(gone)
