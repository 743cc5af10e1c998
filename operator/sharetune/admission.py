"""The GPU share ledger: which job holds how much of which GPU, and who is admitted next.

Pure (no kopf, no kubernetes client, no TVM): the operator feeds it the GPU nodes it sees and the
placements the TuningJobs carry in their own status (``status.gpuPlacement``), and writes back the
placements it returns before any server of an admitted job starts. Keeping no state of its own
between ticks is what makes an operator restart safe: the ledger is rebuilt from the cluster every
time, so a booking exists exactly when a job's status says so and cannot be made twice.

Rules (docs/gpu-pools.md):
- a GPU's shares never sum past ``100 x overcommit`` percent, its booked memory never past the
  GPU's memory (where the node says how much it has: no overcommit for memory);
- first come first served by creation time, then namespace and name; a job that does not fit
  blocks the ones behind it unless ``backfill`` is on (then a later, smaller job may pass it and
  the head may wait longer);
- spread: a job goes to the least allocated GPUs that have room (several GPUs: distinct ones);
- a job that could not fit even on idle GPUs (more GPUs than match, more memory than a GPU has)
  does not block the queue: it is reported as unplaceable with the reason;
- without ``cross_namespace``, a GPU holds jobs of one namespace at a time (MPS is no security
  boundary between its clients).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .api.spec import TuningJobSpec, quantity_mib

JobKey = tuple[str, str]  # (namespace, name)
GPU_COUNT_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU (NVIDIA GPU feature discovery)


MPS_MAX_CLIENTS = 48
# A pool job's CUDA processes on each of its GPUs: one RPC session per server, and the merge
# with the child process its serving report measures in.
MERGE_CLIENTS = 2


@dataclass(frozen=True, order=True)
class GpuId:
    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}/{self.index}"


@dataclass(frozen=True)
class Gpu:
    id: GpuId
    memory_mib: int | None = None  # None: unknown, booked memory is not checked on this GPU
    labels: tuple[tuple[str, str], ...] = ()  # the node's labels (spec.nodeSelector matches them)


@dataclass(frozen=True)
class Request:
    """A job that waits for a share: ``share`` percent and ``memory_mib`` on each of ``gpus`` GPUs."""

    key: JobKey
    created: str  # metadata.creationTimestamp (RFC 3339 in UTC: sorts as time)
    share: int
    memory_mib: int = 0
    gpus: int = 1
    node_selector: tuple[tuple[str, str], ...] = ()
    mps_clients: int = 0  # CUDA processes the job runs on each GPU's MPS server at once

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.created, *self.key)


@dataclass(frozen=True)
class Placement:
    devices: tuple[GpuId, ...]  # one per GPU group of the job, in group order
    share: int
    memory_mib: int = 0
    mps_clients: int = 0


@dataclass(frozen=True)
class Policy:
    overcommit: float = 1.0  # shares on a GPU may sum to 100 x this
    backfill: bool = False
    cross_namespace: bool = False
    # One MPS server serves at most 48 client processes (Volta and later; measured on the H200:
    # the 49th got cudaErrorDevicesUnavailable, and so did every session and merge after it).
    mps_clients: int = MPS_MAX_CLIENTS

    @property
    def capacity(self) -> int:
        return int(100 * self.overcommit + 1e-9)


@dataclass
class Admission:
    """One admission round: who got a place (in admission order), who waits (queue order, so a
    job's queue position is its index + 1) and who can never fit here (with the reason)."""

    placed: dict[JobKey, Placement] = field(default_factory=dict)
    queue: list[JobKey] = field(default_factory=list)
    unplaceable: dict[JobKey, str] = field(default_factory=dict)

    def position(self, key: JobKey) -> int | None:
        return self.queue.index(key) + 1 if key in self.queue else None


class DoubleBooking(ValueError):
    """A job placed twice: a bug in the caller, never silently accepted."""


class Ledger:
    def __init__(self, gpus: Iterable[Gpu], policy: Policy | None = None) -> None:
        self.gpus: dict[GpuId, Gpu] = {g.id: g for g in gpus}
        self.policy = policy or Policy()
        self._placed: dict[JobKey, Placement] = {}
        self._share: dict[GpuId, int] = {}
        self._memory: dict[GpuId, int] = {}
        self._clients: dict[GpuId, int] = {}
        self._tenants: dict[GpuId, set[JobKey]] = {}

    @classmethod
    def rebuild(cls, gpus: Iterable[Gpu], placed: Mapping[JobKey, Placement], policy: Policy | None = None
                ) -> "Ledger":
        """The ledger as the cluster shows it: every placement is kept as it is, even where it no
        longer fits (the overcommit was lowered, a node shrank): running jobs are never evicted,
        only new ones wait."""
        ledger = cls(gpus, policy)
        for key, p in placed.items():
            ledger.book(key, p)
        return ledger

    # ---- reading --------------------------------------------------------------------------------
    def placement(self, key: JobKey) -> Placement | None:
        return self._placed.get(key)

    @property
    def placements(self) -> dict[JobKey, Placement]:
        return dict(self._placed)

    def allocated(self, gpu: GpuId) -> int:
        return self._share.get(gpu, 0)

    def memory_booked(self, gpu: GpuId) -> int:
        return self._memory.get(gpu, 0)

    def mps_clients(self, gpu: GpuId) -> int:
        return self._clients.get(gpu, 0)

    def tenants(self, gpu: GpuId) -> frozenset[JobKey]:
        return frozenset(self._tenants.get(gpu, ()))

    def in_use(self) -> set[GpuId]:
        """GPUs with at least one job: the ones whose pool daemon must run."""
        return {g for g, t in self._tenants.items() if t}

    # ---- writing --------------------------------------------------------------------------------
    def book(self, key: JobKey, p: Placement) -> None:
        if key in self._placed:
            raise DoubleBooking(f"{key[0]}/{key[1]} is already placed on {self._placed[key].devices}")
        if len(set(p.devices)) != len(p.devices):
            raise DoubleBooking(f"{key[0]}/{key[1]}: one GPU twice in {p.devices}")
        self._placed[key] = p
        for d in p.devices:
            self._share[d] = self._share.get(d, 0) + p.share
            self._memory[d] = self._memory.get(d, 0) + p.memory_mib
            self._clients[d] = self._clients.get(d, 0) + p.mps_clients
            self._tenants.setdefault(d, set()).add(key)

    def release(self, key: JobKey) -> Placement | None:
        """A job finished, failed or was deleted: its share is free at once."""
        p = self._placed.pop(key, None)
        if p is None:
            return None
        for d in p.devices:
            self._share[d] -= p.share
            self._memory[d] -= p.memory_mib
            self._clients[d] -= p.mps_clients
            self._tenants[d].discard(key)
        return p

    # ---- admission ------------------------------------------------------------------------------
    def _eligible(self, r: Request, g: Gpu) -> bool:
        labels = dict(g.labels)
        return all(labels.get(k) == v for k, v in r.node_selector) and (
            g.memory_mib is None or r.memory_mib <= g.memory_mib)

    def why_never(self, r: Request) -> str | None:
        """Why ``r`` could not be placed even on idle GPUs; None when it could."""
        if r.share > self.policy.capacity:
            return f"a share of {r.share}% is more than a GPU holds ({self.policy.capacity}%)"
        if r.mps_clients > self.policy.mps_clients:
            return (f"{r.mps_clients} CUDA processes on one GPU (servers.replicas + {MERGE_CLIENTS} for the merge) "
                    f"is more than an MPS server takes ({self.policy.mps_clients}): lower servers.replicas")
        eligible = [g for g in self.gpus.values() if self._eligible(r, g)]
        if len(eligible) >= r.gpus:
            return None
        sel = ", ".join(f"{k}={v}" for k, v in r.node_selector)
        what = f"{r.gpus} GPU{'s' if r.gpus > 1 else ''}"
        if r.memory_mib:
            what += f" with {r.memory_mib} MiB of memory each"
        where = f"on nodes matching {sel}" if sel else "on the cluster's GPU nodes"
        return f"needs {what}; {where} there {'is' if len(eligible) == 1 else 'are'} {len(eligible)}"

    def _fits(self, r: Request, g: Gpu) -> bool:
        if self.allocated(g.id) + r.share > self.policy.capacity:
            return False
        if g.memory_mib is not None and self.memory_booked(g.id) + r.memory_mib > g.memory_mib:
            return False
        if self.mps_clients(g.id) + r.mps_clients > self.policy.mps_clients:
            return False  # small shares: many jobs, each a few MPS clients
        if not self.policy.cross_namespace and any(ns != r.key[0] for ns, _ in self.tenants(g.id)):
            return False
        return self._eligible(r, g)

    def choose(self, r: Request) -> Placement | None:
        """Spread: the least allocated GPUs with room (then the least memory booked, then by
        name), ``r.gpus`` distinct ones; None when they are not there now."""
        room = sorted((g for g in self.gpus.values() if self._fits(r, g)),
                      key=lambda g: (self.allocated(g.id), self.memory_booked(g.id), g.id))
        if len(room) < r.gpus:
            return None
        return Placement(tuple(g.id for g in room[:r.gpus]), r.share, r.memory_mib, r.mps_clients)

    def admit(self, waiting: Iterable[Request]) -> Admission:
        """Places waiting jobs first come first served and books them; jobs already placed are
        skipped (never placed twice)."""
        out = Admission()
        blocked = False
        for r in sorted(waiting, key=lambda r: r.order):
            if r.key in self._placed or r.key in out.unplaceable or r.key in out.queue:
                continue
            never = self.why_never(r)
            if never is not None:
                out.unplaceable[r.key] = never
                continue
            p = None if blocked else self.choose(r)
            if p is None:
                out.queue.append(r.key)
                blocked = not self.policy.backfill
                continue
            self.book(r.key, p)
            out.placed[r.key] = p
        return out


# ---- from and to the cluster's own words (pure dict handling) ------------------------------------
def request_of(namespace: str, name: str, created: str, spec: TuningJobSpec) -> Request:
    """What a pool-mode job asks for: spec.gpuSharing.share and pinnedMemory on each of its GPUs,
    on the nodes its spec.nodeSelector matches."""
    return Request(key=(namespace, name), created=created, share=spec.sharing.share,
                   memory_mib=spec.sharing.pinned_memory_mib, gpus=spec.gpu_count,
                   mps_clients=spec.servers.replicas + MERGE_CLIENTS,
                   node_selector=tuple(sorted((str(k), str(v)) for k, v in
                                              (spec.raw.get("nodeSelector") or {}).items())))


def placement_status(p: Placement, pinned_memory: str | None, admitted_at: str) -> dict[str, Any]:
    """``status.gpuPlacement`` of a pool-mode job."""
    first = p.devices[0]
    return {"mode": "pool", "node": first.node, "gpu": first.index, "share": p.share,
            "pinnedMemory": pinned_memory or "", "devices": [{"node": d.node, "gpu": d.index} for d in p.devices],
            "mpsClients": p.mps_clients, "admittedAt": admitted_at}


def placement_of(status: Mapping[str, Any] | None) -> Placement | None:
    """The placement a job's status records (None: not placed, or not in pool mode)."""
    gp = (status or {}).get("gpuPlacement") or {}
    if gp.get("mode") != "pool" or gp.get("share") is None:
        return None
    devices = gp.get("devices") or [{"node": gp.get("node"), "gpu": gp.get("gpu")}]
    try:
        ids = tuple(GpuId(str(d["node"]), int(d["gpu"])) for d in devices)
    except (KeyError, TypeError, ValueError):
        return None
    mem = gp.get("pinnedMemory")
    try:
        mib = quantity_mib(mem) if mem else 0
    except ValueError:
        mib = 0
    try:  # placements written before MPS clients were booked count none
        clients = int(gp.get("mpsClients") or 0)
    except (TypeError, ValueError):
        clients = 0
    return Placement(ids, int(gp["share"]), mib, clients)


def gpus_of_node(name: str, allocatable: Mapping[str, Any], labels: Mapping[str, str], held_elsewhere: int = 0,
                 in_use: Iterable[int] = ()) -> list[Gpu]:
    """A node's GPUs open to pools: its allocatable ``nvidia.com/gpu`` less those held by pods
    that are not pool daemons (jobs in mode exclusive, other workloads), plus any index a pool
    still uses (kept so that its placements stay valid). Memory per GPU from the GPU feature
    discovery label, when the node has it."""
    try:
        total = int(str(allocatable.get(GPU_COUNT_RESOURCE, 0)))
    except ValueError:
        total = 0
    mem_text = labels.get(GPU_MEMORY_LABEL, "")
    memory = int(mem_text) if re.fullmatch(r"[0-9]+", mem_text or "") else None
    indices = set(in_use)
    free = (i for i in range(total + len(indices)) if i not in indices)
    while len(indices) < total - held_elsewhere:
        indices.add(next(free))
    lab = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    return [Gpu(GpuId(name, i), memory, lab) for i in sorted(indices)]
