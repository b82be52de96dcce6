"""CPU quotas through cgroups: the files v1 and v2 take (on a made-up hierarchy), the reasons
given where no quota can be made, and on this machine a real group that holds a CPU-bound child
to its quota, goes away afterwards (also after a failure) and is removed when its creator died."""

import os
import subprocess
import sys
import time

import pytest

from conftest import CPU_PROBE, need_system
from dlscale.distributed import cgroup
from dlscale.errors import UsageError

REASON = cgroup.unavailable_reason()


@pytest.fixture
def cgroup_available():
    """Skip where no quota can be made here, or fail where DLSCALE_REQUIRE_NETNS=1 (CI as root:
    a machine that emulates nodes also sets their CPU quotas)."""
    need_system("root and a cgroup cpu controller", None if REASON is None else f"CPU quotas unavailable: {REASON}",
                "DLSCALE_REQUIRE_NETNS")


needs_cgroup = pytest.mark.usefixtures("cgroup_available")


def _fake(tmp_path, version):
    """A directory shaped like a cgroup mount: the parent's control files exist once it is made."""
    root = tmp_path / f"v{version}"
    root.mkdir()
    if version == 2:
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (root / "cgroup.subtree_control").write_text("memory\n")
        (root / "dlscale").mkdir()
        (root / "dlscale" / "cgroup.subtree_control").write_text("")
    return cgroup.Hierarchy(version, str(root))


@pytest.fixture
def fake_fs(monkeypatch):
    # a real cgroup directory goes with its control files; a plain one needs them removed first
    import shutil

    monkeypatch.setattr(cgroup, "_rmdir", shutil.rmtree)
    monkeypatch.setattr(os, "geteuid", lambda: 0)


@pytest.mark.parametrize("version, files", [
    (1, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"}),
    (2, {"cpu.max": "50000 100000"}),
])
def test_quota_files_by_version(tmp_path, fake_fs, version, files):
    h = _fake(tmp_path, version)
    with cgroup.CpuQuota(0.5, h) as q:
        assert os.path.dirname(q.path) == h.parent
        for name, value in files.items():
            assert (open(os.path.join(q.path, name)).read()) == value
        cmd = q.wrap(["python", "-c", "pass"])
        assert cmd[:3] == ["sh", "-c", 'echo $$ > "$0" && exec "$@"']
        assert cmd[3] == os.path.join(q.path, "cgroup.procs") and cmd[4:] == ["python", "-c", "pass"]
        path = q.path
    assert not os.path.exists(path)
    if version == 2:  # cpu enabled for the children of the mount root and of dlscale's parent
        assert "+cpu" in open(os.path.join(h.mount, "cgroup.subtree_control")).read()
        assert "+cpu" in open(os.path.join(h.parent, "cgroup.subtree_control")).read()


def test_quota_is_cores_times_the_period(tmp_path, fake_fs):
    h = _fake(tmp_path, 1)
    for cores, quota in ((0.5, 50_000), (1.5, 150_000), (0.01, 1_000)):
        with cgroup.CpuQuota(cores, h) as q:
            assert q.quota_us == quota
            assert open(os.path.join(q.path, "cpu.cfs_quota_us")).read() == str(quota)
    with pytest.raises(UsageError, match="at least 0.01"):
        cgroup.CpuQuota(0.001)


def test_hierarchy_found_from_mounts(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")  # hybrid: cpu still bound to v1
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw,relatime 0 0\n"
                      "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n"
                      "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n")
    assert cgroup.find_hierarchy(str(mounts)) == cgroup.Hierarchy(1, "/sys/fs/cgroup/cpu,cpuacct")
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory\n")  # unified: v2 wins
    assert cgroup.find_hierarchy(str(mounts)) == cgroup.Hierarchy(2, str(v2))
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert cgroup.find_hierarchy(str(mounts)) is None


def test_unavailable_reasons(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in cgroup.unavailable_reason()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(cgroup, "find_hierarchy", lambda mounts=cgroup.MOUNTS: None)
    assert "cpu controller" in cgroup.unavailable_reason()
    with pytest.raises(UsageError, match="cpu controller"):
        with cgroup.CpuQuota(0.5):
            pass
    blocked = tmp_path / "file"  # the mount is a file: the parent cannot be made
    blocked.write_text("")
    assert "cannot make" in cgroup.unavailable_reason(cgroup.Hierarchy(1, str(blocked)))


def test_stale_groups_of_a_dead_process_are_removed(tmp_path, fake_fs):
    h = _fake(tmp_path, 1)
    os.makedirs(h.parent, exist_ok=True)
    dead = os.path.join(h.parent, f"{2**22 + 12345}-abc123")  # above the default pid_max: no such process
    mine = os.path.join(h.parent, f"{os.getpid()}-def456")
    for p in (dead, mine):
        os.mkdir(p)
    assert cgroup.cleanup_stale(h) == [dead]
    assert not os.path.exists(dead) and os.path.exists(mine)


def _probe(work: float, cores: float | None) -> dict:
    import json

    cmd = [sys.executable, "-c", CPU_PROBE.format(work=work)]
    r = cgroup.run_in_quota(cmd, cores, capture_output=True, text=True) if cores else \
        subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_cgroup
@pytest.mark.slow
@pytest.mark.parametrize("cores", [0.5, 0.1])
def test_a_quota_slows_a_cpu_bound_child_side_by_side(cores):
    """A/B alternating: the same CPU work in a group of ``cores`` and unconstrained. The group never
    gets more than its quota, whatever the load; the unconstrained child, given a machine that
    lets it run faster than that, is measurably faster. Half a core is the fault the acceptance
    suite injects; a tenth of a core shows the same on a machine too busy to give a process half."""
    before = set(cgroup.list_groups())
    free, held = [], []
    for _ in range(3):
        free.append(_probe(cores * 0.6, None))
        held.append(_probe(cores * 0.6, cores))
    share = lambda runs: max(r["cpu"] / r["wall"] for r in runs)  # noqa: E731 - the best share each got
    assert share(held) < cores * 1.2, held  # the quota, and one period's worth of slack
    assert set(cgroup.list_groups()) == before
    if share(free) < cores * 1.5:
        pytest.skip(f"the machine is too busy to show a {cores}-core quota: an unconstrained child got at most "
                    f"{share(free):.2f} cores")
    wall = lambda runs: sorted(r["wall"] for r in runs)[1]  # noqa: E731 - the median of three
    assert wall(held) / wall(free) > 1.3, (held, free)


@needs_cgroup
def test_group_is_removed_after_a_failure_and_its_processes_killed():
    before = set(cgroup.list_groups())
    with pytest.raises(RuntimeError):
        with cgroup.CpuQuota(0.5) as q:
            p = subprocess.Popen(q.wrap(["sleep", "60"]))
            deadline = time.monotonic() + 10
            while p.pid not in q.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert q.pids() == [p.pid]  # the command itself runs in the group (exec, no shell left)
            raise RuntimeError("boom")
    assert p.wait(timeout=10) == -9
    assert set(cgroup.list_groups()) == before
