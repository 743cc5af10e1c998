"""Measurement windows on a shared GPU (docs/gpu-pools.md, "Measurement fidelity").

Jobs on one GPU pool measure candidates side by side, and a co-tenant's kernels disturb a
measurement. Two things keep that honest:

* **Who was there.** Every tuning server holds a *tenant* file of its job in the GPU's pipe
  directory for as long as it lives (an ``flock`` held by the process: it ends with the process,
  so no heartbeat and no stale entry). A server measuring a candidate names the other jobs
  present; the client counts them per job into its shard's progress report (``co_tenants``:
  candidates measured while that job was on the GPU, ``measured_alone``).
* **Measuring alone.** Servers measure inside a *shared* window and the merge judges its job's
  best candidates inside an *exclusive* one: while the merge measures, the co-tenants' servers
  hold their next measurement back (their builds and searches go on). Windows are a reader-writer
  lock on a file of the GPU's pipe directory with a turnstile, so a waiting merge is not starved
  by a stream of candidates. Both sides wait a bounded time and then measure anyway (noted):
  a hung co-tenant never stalls a job.

Both live in the GPU's MPS pipe directory because that is what every process on one GPU shares
(the pool's hostPath in a cluster, ``.pool/gpu-N/pipe`` locally). The MPS daemon command creates
the files (``prepare``: who may write what is explained there); without them (CPU jobs, an older
daemon) windows are off and measuring is unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sharetune.api.topology import TENANT_ENV

__all__ = ["TENANT_ENV", "AloneMeasurements", "MeasureLog", "Windows", "prepare", "serve_remote", "tenant"]

log = logging.getLogger("sharetune.window")

LOCK = "sharetune-measure.lock"
TURNSTILE = "sharetune-measure.turnstile"
TENANTS = "sharetune-tenants"
LOG_ENV = "SHARETUNE_MEASURE_LOG"  # a client's runner workers append one line per measurement here
BEGIN, END = "sharetune.window.begin", "sharetune.window.end"
SHARED_WAIT_S = 30.0  # a server's measurement waits at most this for a merge's exclusive window
EXCLUSIVE_WAIT_S = 60.0  # a merge waits at most this for the servers' windows to drain
POLL_S = 0.01


def tenant(fallback: str) -> str:
    """This process's job as the GPU's other tenants see it: ``$SHARETUNE_TENANT`` (namespace/name,
    set by the operator and local mode), else ``fallback`` (a process started by hand)."""
    return os.environ.get(TENANT_ENV) or fallback


LOCK_MODE = 0o644  # the daemon's; every client opens them read-only
TENANTS_MODE = 0o1770  # the daemon and the clients' group add files; sticky: only a file's owner removes it


def prepare(pipe_dir: Path, group: int | None = None) -> None:
    """The window files in a GPU's pipe directory (the MPS daemon command, at start).

    Who writes and reads them: the daemon command creates them (in a cluster as the tuner UID,
    which every job's servers share; in local mode as the user). Its clients, the tuning servers and the merge
    (in a cluster every job's run as
    the tuner UID and group 1000; locally, as the user), open the lock and the turnstile read-only
    and ``flock`` them, which needs no write access, so these are the daemon's and only readable
    by others (``LOCK_MODE``, whatever the umask). The clients do write in the tenant directory
    (each adds its tenant file and removes dead ones), so it is writable by the daemon and by
    ``group``, the clients' GID (None: the daemon's own group, as in local mode), and by no one
    else (``TENANTS_MODE``). An older daemon's world-writable files are narrowed where this
    process may."""
    for name in (LOCK, TURNSTILE):
        fd = os.open(pipe_dir / name, os.O_RDONLY | os.O_CREAT, LOCK_MODE)
        try:
            with contextlib.suppress(PermissionError):  # another user's: left as it is
                os.fchmod(fd, LOCK_MODE)
        finally:
            os.close(fd)
    tenants = pipe_dir / TENANTS
    tenants.mkdir(exist_ok=True)
    if group is not None:
        try:
            os.chown(tenants, -1, group)
        except PermissionError:
            log.warning("cannot give %s to group %d: only this process's group adds tenants", tenants, group)
    with contextlib.suppress(PermissionError):
        os.chmod(tenants, TENANTS_MODE)


def _flock(fd: int, op: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def _safe(tenant: str) -> str:
    return tenant.replace("/", "~")


class Windows:
    """The windows and tenants of one GPU (its MPS pipe directory)."""

    def __init__(self, pipe_dir: Path) -> None:
        self.dir = pipe_dir
        self._lock_fd: int | None = None  # the shared window this process holds (servers' sessions)

    @classmethod
    def of(cls, env: dict[str, str] | os._Environ[str] | None = None) -> Windows | None:
        """This process's GPU windows, or None when it has none (no MPS, no window files)."""
        pipe = (os.environ if env is None else env).get("CUDA_MPS_PIPE_DIRECTORY")
        if not pipe or not (Path(pipe) / LOCK).exists():
            return None
        return cls(Path(pipe))

    # ---- tenants --------------------------------------------------------------------------
    def join(self, tenant: str) -> int:
        """Marks ``tenant`` present for as long as this process lives (or until the returned
        descriptor is closed)."""
        p = self.dir / TENANTS / f"{_safe(tenant)}@{socket.gethostname()}-{os.getpid()}"
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def tenants(self) -> set[str]:
        """The jobs with a live process on this GPU (files whose holder died are removed)."""
        out: set[str] = set()
        try:
            entries = list((self.dir / TENANTS).iterdir())
        except OSError:
            return out
        for p in entries:
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue  # removed meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                out.add(p.name.rsplit("@", 1)[0].replace("~", "/"))  # held: its process lives
            else:
                with contextlib.suppress(OSError):  # not ours to remove (sticky dir): skip it then
                    p.unlink()
            finally:
                os.close(fd)
        return out

    # ---- windows --------------------------------------------------------------------------
    def _open(self, name: str) -> int:
        return os.open(self.dir / name, os.O_RDONLY)

    def begin_shared(self, timeout_s: float = SHARED_WAIT_S) -> tuple[bool, float]:
        """Enters a shared window (a server, around one measurement): (fenced, seconds waited).
        Not fenced: an exclusive window held past ``timeout_s``; the measurement goes on anyway."""
        t0 = time.monotonic()
        self.end_shared()
        turnstile = self._open(TURNSTILE)
        try:  # passes only while no exclusive window is held or awaited
            through = _flock(turnstile, fcntl.LOCK_SH, timeout_s)
        finally:
            os.close(turnstile)
        fd = self._open(LOCK)
        if through and _flock(fd, fcntl.LOCK_SH, max(0.0, timeout_s - (time.monotonic() - t0))):
            self._lock_fd = fd
            return True, time.monotonic() - t0
        os.close(fd)
        return False, time.monotonic() - t0

    def end_shared(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the description drops its lock
            self._lock_fd = None

    @contextlib.contextmanager
    def exclusive(self, timeout_s: float = EXCLUSIVE_WAIT_S) -> Iterator[bool]:
        """Nothing else measures on this GPU inside (True), or ``timeout_s`` passed (False)."""
        turnstile, fd = self._open(TURNSTILE), self._open(LOCK)
        t0 = time.monotonic()
        try:
            got = _flock(turnstile, fcntl.LOCK_EX, timeout_s) and \
                _flock(fd, fcntl.LOCK_EX, max(0.0, timeout_s - (time.monotonic() - t0)))
            if not got:
                log.warning("measuring beside co-tenants: their windows did not drain in %.0f s", timeout_s)
            yield got
        finally:
            os.close(fd)
            os.close(turnstile)


# ---- the server's side: remote functions in each RPC session process ---------------------------
def serve_remote(pipe_dir: str, tenant: str) -> None:
    """``server_init_callback`` of TVM's RPC server: registers the window functions in its
    process, which every session process it forks inherits."""
    import tvm_ffi

    windows = Windows(Path(pipe_dir))

    @tvm_ffi.register_global_func(BEGIN, override=True)
    def _begin() -> str:
        fenced, waited = windows.begin_shared()
        return json.dumps({"with": sorted(windows.tenants() - {tenant}), "fenced": fenced,
                           "waited_s": round(waited, 4)})

    @tvm_ffi.register_global_func(END, override=True)
    def _end() -> None:
        windows.end_shared()


# ---- the client's side: around each measurement in a runner worker ------------------------------
def remote_functions(session: Any) -> tuple[Any, Any] | None:
    """The session's window functions, or None when its server has none (no windows there)."""
    try:
        return session.get_function(BEGIN), session.get_function(END)
    except Exception:  # a server without windows: a CPU job, exclusive without MPS, an older server
        return None


def note(entry: dict[str, Any]) -> None:
    """One measurement's window into the client's log (O_APPEND: lines from several worker
    processes never interleave)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def run_in_window(funcs: tuple[Any, Any] | None, measure: Any) -> Any:
    """``measure()`` inside the server's shared window, noted in the client's log."""
    if funcs is None:
        return measure()
    begin, end = funcs
    entry = json.loads(str(begin()))
    try:
        return measure()
    finally:
        end()
        note(entry)


def windowed_run_evaluator(session: Any, rt_mod: Any, device: Any, evaluator_config: Any,
                           repeated_args: Any) -> list[float]:
    """``f_run_evaluator`` of stock ``RPCRunner`` (a session per candidate) with the window."""
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    return run_in_window(remote_functions(session),
                         lambda: run_evaluator_common(rt_mod, device, evaluator_config, repeated_args))


class MeasureLog:
    """A client's measurement log read incrementally into its progress report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


# ---- the merge's side: its measurements alone on the GPU -------------------------------------
class AloneMeasurements:
    """The merge's measurements, each inside an exclusive window of its GPU, and what they saw:
    which co-tenants were held back, and how many windows did not drain in time."""

    def __init__(self, tenant: str, windows: Windows | None = None, timeout_s: float = EXCLUSIVE_WAIT_S) -> None:
        self.tenant = tenant
        self.windows = windows if windows is not None else Windows.of()
        self.timeout_s = timeout_s
        self.exclusive_windows = 0
        self.not_alone = 0
        self.held_back: set[str] = set()

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        if self.windows is None:
            yield
            return
        with self.windows.exclusive(self.timeout_s) as alone:
            self.exclusive_windows += 1
            self.not_alone += 0 if alone else 1
            self.held_back |= self.windows.tenants() - {self.tenant}
            yield

    def summary(self) -> dict[str, Any]:
        """The merge summary's ``measurement``: how its judgements and latencies were measured."""
        if self.windows is None:
            return {"windows": False, "alone": None, "note": "no GPU windows here (CPU, or MPS without a pool)"}
        return {"windows": True, "alone": self.not_alone == 0, "exclusive_windows": self.exclusive_windows,
                "not_alone": self.not_alone, "co_tenants_held_back": sorted(self.held_back)}
