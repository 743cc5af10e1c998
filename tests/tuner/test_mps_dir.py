"""`sharetune-tuner mps-dir`, a daemon pod's init container: the host directory a kubelet created as
root goes to the tuner UID/GID, so the MPS control daemon and its clients run as that one non-root
user (a root daemon without CAP_SETUID cannot serve them: bench/results/h200-mps-isolation-probe.txt).
Real chown calls, so the test needs root, as the init container has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="changing a file's owner needs root, as in the init container")


def mps_dir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", "mps-dir", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_directory_goes_to_the_daemons_user_and_links_are_not_followed(tmp_path: Path) -> None:
    host = tmp_path / "host" / "mps"
    (host / "pipe").mkdir(parents=True)  # an earlier root daemon's
    (host / "pipe" / "control").write_text("")
    outside = tmp_path / "outside"
    outside.write_text("not the daemon's")
    (host / "pipe" / "planted").symlink_to(outside)  # a client's link to a path outside the directory
    r = mps_dir(str(host), "--owner", "1000:1000")
    assert r.returncode == 0, r.stderr
    for p in (host, host / "pipe", host / "log", host / "pipe" / "control", host / "pipe" / "planted"):
        st = p.lstat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), p
    assert (outside.stat().st_uid, outside.stat().st_gid) == (0, 0)
    assert host.stat().st_mode & 0o777 == 0o750
    assert mps_dir(str(host), "--owner", "1000:1000").stdout.strip().endswith("(0 entries changed)")


def test_a_bad_owner_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    r = mps_dir(str(tmp_path), "--owner", "tuner")
    assert r.returncode != 0 and "--owner 'tuner' is not UID:GID" in r.stderr and "Traceback" not in r.stderr
