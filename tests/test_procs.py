"""dlscale.procs: children that die with their parent, a rank that refuses to start without its
launcher, and a process tree found and weighed (PSS counts a shared page once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import end_marked, marked_processes, wait_until
from dlscale import procs

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")


def _python(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], **kw)


@linux_only
@pytest.mark.parametrize("tied", [True, False])
def test_a_child_started_with_die_with_parent_ends_with_its_killed_parent(tied):
    marker = f"DLSCALE_TEST_MARK=procs-{os.getpid()}-{tied}"
    parent = _python(f"""
        import subprocess, sys, time
        from dlscale.procs import die_with_parent
        extra = {{"preexec_fn": die_with_parent()}} if {tied} else {{}}
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **extra)
        print(child.pid, flush=True)
        time.sleep(60)
    """, stdout=subprocess.PIPE, text=True, env={**os.environ, marker.split("=")[0]: marker.split("=")[1]})
    try:
        child = int(parent.stdout.readline())
        parent.kill()  # SIGKILL: no cleanup runs in the parent
        parent.wait()
        gone = wait_until(lambda: child not in marked_processes(marker), 5)
        assert gone is tied  # without the parent-death signal the child runs on: the test can tell
    finally:
        parent.kill()
        parent.wait()
        end_marked(marker)


@linux_only
def test_a_process_whose_launcher_is_gone_is_told_to_leave():
    code = "import sys; from dlscale.procs import tie_to_launcher; sys.exit(0 if tie_to_launcher() else 3)"
    env = {k: v for k, v in os.environ.items() if k != procs.LAUNCHER_PID_ENV}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0  # no launcher named
    mine = {**env, procs.LAUNCHER_PID_ENV: str(os.getpid())}  # this test is an ancestor of the child
    assert subprocess.run([sys.executable, "-c", code], env=mine).returncode == 0
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:  # a live process that is not an ancestor: the launcher died and its pid went to another
        gone = {**env, procs.LAUNCHER_PID_ENV: str(other.pid)}
        assert subprocess.run([sys.executable, "-c", code], env=gone).returncode == 3
    finally:
        other.kill()
        other.wait()


@linux_only
def test_a_rank_without_its_launcher_does_not_start():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # alive, not an ancestor
    env = {**os.environ, procs.LAUNCHER_PID_ENV: str(other.pid), "RANK": "0", "WORLD_SIZE": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "dlscale.distributed.rank", "--spec", '{"family": "train", "config": {}}'],
                           env=env, capture_output=True, text=True, timeout=60)
    finally:
        other.kill()
        other.wait()
    assert r.returncode == 1 and r.stderr.strip() == (
        "error: the dlscale launcher of this rank is gone; the rank does not start")


@linux_only
def test_tree_and_ancestors_follow_the_parent_links():
    parent = _python("""
        import subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        print(kid.pid, flush=True)
        time.sleep(30)
    """, stdout=subprocess.PIPE, text=True)
    try:
        kid = int(parent.stdout.readline())
        assert procs.tree(parent.pid) == [parent.pid, kid]
        assert procs.children(os.getpid()).count(parent.pid) == 1
        assert procs.ancestors(kid)[:2] == [parent.pid, os.getpid()]
    finally:
        procs.kill(procs.tree(parent.pid))
        parent.wait()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs /proc/PID/smaps_rollup (Linux >= 4.14)")
def test_a_tree_weighs_a_page_its_processes_share_once():
    mib = 96
    parent = _python(f"""
        import os, sys, time
        x = bytearray({mib} * 2**20)
        x[::4096] = b"1" * len(x[::4096])  # touched: resident in the parent
        pid = os.fork()  # the child shares every page of x until one of them writes it
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(30)
    """, stdout=subprocess.PIPE, text=True)
    try:
        kid = int(parent.stdout.readline())
        assert wait_until(lambda: procs.tree(parent.pid) == [parent.pid, kid], 5)
        members = procs.tree(parent.pid)
        total, rss = procs.proportional_bytes(members), procs.resident_bytes(members)
        assert rss > 2 * mib * 2**20  # each resident set holds the shared array
        assert mib * 2**20 < total < 1.5 * mib * 2**20 + 64 * 2**20  # the sum of PSS holds it once
        assert total <= rss
    finally:
        procs.kill(procs.tree(parent.pid), signal.SIGKILL)
        parent.wait()


@linux_only
def test_end_tree_ends_a_tree_that_ignores_sigterm_left_its_session_and_orphaned_a_process():
    marker = f"DLSCALE_TEST_MARK=endtree-{os.getpid()}"
    # root: a subreaper that ignores SIGTERM; below it a process in a session of its own that ignores
    # SIGTERM and sleeps, and an orphan (its parent exited at once) that the subreaper inherits
    root = _python("""
        import signal, subprocess, sys, time
        from dlscale.procs import become_subreaper
        assert become_subreaper()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
        orphaner = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
        subprocess.run([sys.executable, "-c", orphaner])
        print("ready", flush=True)
        time.sleep(600)
    """, stdout=subprocess.PIPE, text=True, env={**os.environ, marker.split("=")[0]: marker.split("=")[1]})
    try:
        assert root.stdout.readline().strip() == "ready"
        assert wait_until(lambda: len(marked_processes(marker)) == 3, 10)  # root, the stubborn one, the orphan
        ended = procs.end_tree(root.pid, grace_s=0.5)
        root.wait(timeout=10)
        assert len(ended) == 3 and root.pid in ended
        assert wait_until(lambda: not marked_processes(marker), 10), marked_processes(marker)
    finally:
        end_marked(marker)
        if root.poll() is None:
            root.kill()
            root.wait()
