"""Measurement windows on a shared GPU (measure/window.py): who shares the GPU while a candidate is
measured, and the merge measuring alone. Real processes and real flocks; the GPU's pipe directory
is a temporary one (windows need only its files, not a running MPS daemon), and the last test goes
through a real TVM RPC server and session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sharetune_tuner.client import Progress
from sharetune_tuner.measure import window as mw
from sharetune_tuner.measure.callbacks import count_windows

from .conftest import free_port, registered, tuner, wait_until

# A child that enters a shared window (or joins as a tenant), says so, and holds it for a while.
CHILD = """
import sys, time
from pathlib import Path
from sharetune_tuner.measure.window import Windows
w = Windows(Path(sys.argv[1]))
what, hold = sys.argv[2], float(sys.argv[3])
if what == "join":
    w.join(sys.argv[4])
    print("in", flush=True)
    time.sleep(hold)
elif what == "shared":
    fenced, waited = w.begin_shared(timeout_s=float(sys.argv[4]))
    print("in", fenced, round(waited, 3), flush=True)
    time.sleep(hold)
    w.end_shared()
else:  # "stream": back-to-back measurements for `hold` seconds, always one in flight per child
    t_end = time.monotonic() + hold
    print("in", flush=True)
    while time.monotonic() < t_end:
        w.begin_shared(timeout_s=30)
        time.sleep(0.05)
        w.end_shared()
"""


def _child(pipe: Path, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(pipe), *args], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.stdout is not None
    first = p.stdout.readline().split()
    assert first and first[0] == "in", first
    p.first = first
    return p


@pytest.fixture()
def pipe(tmp_path: Path) -> Path:
    d = tmp_path / "pipe"
    d.mkdir()
    mw.prepare(d)
    return d


def test_windows_are_off_without_the_daemons_files(tmp_path: Path) -> None:
    assert mw.Windows.of({}) is None
    assert mw.Windows.of({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) is None  # an MPS dir of an older daemon
    mw.prepare(tmp_path)
    assert mw.Windows.of({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) is not None


def _mode(p: Path) -> str:
    return oct(p.stat().st_mode & 0o7777)


def test_window_files_are_writable_only_by_the_daemon_and_the_clients_group(tmp_path: Path) -> None:
    old_umask = os.umask(0)  # the modes hold whatever the daemon's umask
    try:
        (tmp_path / mw.LOCK).touch(mode=0o666)  # an older daemon's, world-writable
        mw.prepare(tmp_path, group=os.getgid())
    finally:
        os.umask(old_umask)
    assert _mode(tmp_path / mw.LOCK) == _mode(tmp_path / mw.TURNSTILE) == "0o644"  # clients only read them
    tenants = tmp_path / mw.TENANTS
    assert _mode(tenants) == "0o1770" and tenants.stat().st_gid == os.getgid()


@pytest.mark.skipif(os.geteuid() != 0, reason="switches users: needs root")
def test_the_clients_group_joins_and_other_users_only_read(tmp_path: Path) -> None:
    """As in a cluster: the daemon (root) prepares the files for the clients' group (GID 1000). A
    server of that group read-locks the window (what ``Windows`` does: open read-only, flock) and
    adds its tenant file; a process of another UID and group can read-lock too but adds no tenant.
    (flock(1) and touch(1) stand in for the server: the interpreter may not be readable by them.)"""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sharetune-windows-"))  # pytest's tmp is root's only
    try:
        base.chmod(0o755)
        pipe = base / "pipe"
        pipe.mkdir(mode=0o755)
        mw.prepare(pipe, group=1000)
        script = (f'flock -s -w 5 "$1/{mw.LOCK}" true && echo locked; '
                  f'touch "$1/{mw.TENANTS}/team-a~job@host-$(id -u)" 2>/dev/null && echo joined || echo refused')

        def as_user(uid: int, gid: int) -> list[str]:
            def drop() -> None:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)

            r = subprocess.run(["sh", "-c", script, "sh", str(pipe)], capture_output=True, text=True, timeout=60,
                               preexec_fn=drop, cwd="/")
            return r.stdout.split()

        assert as_user(1000, 1000) == ["locked", "joined"]
        assert as_user(1001, 1001) == ["locked", "refused"]
        assert sorted(p.name for p in (pipe / mw.TENANTS).iterdir()) == ["team-a~job@host-1000"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_tenant_is_present_exactly_while_its_process_lives(pipe: Path) -> None:
    w = mw.Windows(pipe)
    a = _child(pipe, "join", "60", "team-a/resnet")
    b = _child(pipe, "join", "60", "team-b/bert")
    try:
        assert w.tenants() == {"team-a/resnet", "team-b/bert"}
        a.send_signal(signal.SIGKILL)  # no goodbye: the kernel drops its flock
        a.wait()
        assert w.tenants() == {"team-b/bert"}
        assert len(list((pipe / mw.TENANTS).iterdir())) == 1  # the dead one's file is cleared
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_the_merge_measures_alone_and_servers_wait_for_it(pipe: Path) -> None:
    w = mw.Windows(pipe)
    server = _child(pipe, "shared", "1.0", "10")  # a candidate being measured for 1 s
    t0 = time.monotonic()
    with w.exclusive(timeout_s=10) as alone:
        waited_for_server = time.monotonic() - t0
        assert alone and waited_for_server > 0.7  # it entered only after the measurement ended
        late = subprocess.Popen([sys.executable, "-c", CHILD, str(pipe), "shared", "0", "10"],
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        time.sleep(1.0)  # the merge measures; the next candidate is held back meanwhile
        assert late.poll() is None
    out, _ = late.communicate(timeout=30)
    _, fenced, waited = out.split()
    server.wait(10)
    assert fenced == "True" and float(waited) > 0.5


def test_windows_give_up_after_their_timeout_and_say_so(pipe: Path) -> None:
    w = mw.Windows(pipe)
    stuck = _child(pipe, "shared", "30", "10")  # a hung co-tenant measurement
    try:
        t0 = time.monotonic()
        with w.exclusive(timeout_s=0.3) as alone:
            assert not alone
        assert time.monotonic() - t0 < 5
        merge = mw.AloneMeasurements("ns/me", w, timeout_s=0.3)
        with merge.window():
            pass
        assert merge.summary() == {"windows": True, "alone": False, "exclusive_windows": 1, "not_alone": 1,
                                   "co_tenants_held_back": []}
    finally:
        stuck.kill()
        stuck.wait()
    with w.exclusive(timeout_s=5) as alone:  # once the holder is gone the window is free again
        assert alone


def test_a_stream_of_measurements_does_not_starve_the_merge(pipe: Path) -> None:
    w = mw.Windows(pipe)
    streams = [_child(pipe, "stream", "20") for _ in range(3)]  # overlapping: never a gap without the turnstile
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        with w.exclusive(timeout_s=10) as alone:
            assert alone
        assert time.monotonic() - t0 < 2
    finally:
        for p in streams:
            p.kill()
            p.wait()


def test_each_measurement_is_counted_into_the_shards_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "measure-windows.jsonl"
    monkeypatch.setenv(mw.LOG_ENV, str(log))
    reader = mw.MeasureLog(log)
    progress = Progress("job", 0, 1)
    mw.note({"with": ["ns/b"], "fenced": True, "waited_s": 0.5})
    mw.note({"with": [], "fenced": True, "waited_s": 0.0})
    count_windows(progress, reader.read_new())
    with open(log, "a") as f:
        f.write('{"with": ["ns/b", "ns/c"], "fenced": false, "waited_s": 30.0}\n{"with": [')  # a line half written
    count_windows(progress, reader.read_new())
    assert progress.co_tenants == {"ns/b": 2, "ns/c": 1}
    assert (progress.measured_alone, progress.measured_beside_others, progress.unfenced) == (1, 2, 1)
    assert progress.window_wait_s == 30.5
    with open(log, "a") as f:
        f.write('"ns/c"], "fenced": true, "waited_s": 0}\n')
    count_windows(progress, reader.read_new())
    assert progress.co_tenants["ns/c"] == 2


@pytest.mark.tvm
def test_a_real_rpc_session_measures_inside_the_servers_window(pipe: Path, tmp_path: Path) -> None:
    """The window functions reach TVM's forked session processes (server_init_callback) and name
    the other jobs on the GPU."""
    from tvm import rpc

    port = free_port()
    tracker = tuner(["tracker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "tracker.log")
    base = free_port()
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), mw.TENANT_ENV: "team-a/resnet"}
    server = tuner(["server", "--tracker", f"127.0.0.1:{port}", "--key", "k", "--host", "127.0.0.1",
                    "--port", str(base), "--port-end", str(base + 1), "--name", "s0"], tmp_path / "server.log", env)
    other = _child(pipe, "join", "120", "team-b/bert")
    try:
        wait_until(lambda: registered(port, "k") == 1, 60, "server registered")
        sess = rpc.connect_tracker("127.0.0.1", port).request("k", session_timeout=0)
        funcs = mw.remote_functions(sess)
        assert funcs is not None
        begin, end = funcs
        first = json.loads(str(begin()))
        end()
        assert first["with"] == ["team-b/bert"] and first["fenced"]  # not itself, the other job
        assert mw.Windows(pipe).tenants() == {"team-a/resnet", "team-b/bert"}
        got: dict[str, object] = {}
        with mw.Windows(pipe).exclusive(timeout_s=10) as alone:
            t = threading.Thread(target=lambda: got.update(json.loads(str(begin()))))
            t.start()
            time.sleep(0.8)
            assert alone and t.is_alive()  # the server's next measurement waits for the merge
        t.join(30)
        end()
        assert got["fenced"] and float(got["waited_s"]) > 0.5
    finally:
        other.kill()
        other.wait()
        server.stop()
        tracker.stop()
