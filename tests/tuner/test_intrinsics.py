"""The tensor-intrinsics cache (sharetune_tuner/model/intrinsics.py) against TVM's own parsed ones.

Each case runs in a fresh interpreter: registering intrinsics is process-wide and one-way, and
the cache only matters in a process that has not imported ``tvm.s_tir.tensor_intrin`` yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Prints one JSON line: how the intrinsics were registered, then the design spaces MetaSchedule
# generates for an fp16 matmul on sm_90a and the tensor intrinsics they tensorize with. The
# tensor-core schedule rule looks intrinsics up by name, so the spaces fail without them.
_DESIGN_SPACES = r"""
import json, re, sys, time
from pathlib import Path
t = time.monotonic()
from sharetune_tuner.model import intrinsics as I
how = I.ensure_registered(Path(sys.argv[1])) if sys.argv[1] != "none" else (I.register_from([]) or "none")
register_s = time.monotonic() - t
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
A = te.placeholder((128, 128), "float16", name="A")
B = te.placeholder((128, 128), "float16", name="B")
k = te.reduce_axis((0, 128), "k")
C = te.compute((128, 128), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k))
mod = tvm.IRModule({"main": te.create_prim_func([A, B, C])})
target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a", "max_threads_per_block": 1024,
                            "max_shared_memory_per_block": 49152, "thread_warp_size": 32}, host={"kind": "llvm"})
try:
    spaces = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                            task_name="mm").generate_design_space()
    used = sorted({m for s in spaces for m in re.findall(r'ann_val="(wmma[^"]+)"', str(s.trace))})
    error = None
except Exception as e:
    used, error = [], str(e).splitlines()[-1]
out = {"how": how, "register_s": register_s, "tensorized_with": used, "error": error,
       "package_executed": hasattr(sys.modules[I.PACKAGE], "cuda")}
if sys.argv[2:] == ["import-submodule"]:  # what dlight does: the real file must still import
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group
    out["wmma_group"] = sorted(get_wmma_intrin_group("shared", "shared", "float16", "float32", False).values())
print(json.dumps(out))
"""

# Reads the cache, then parses the real package in the same process and compares every
# intrinsic's description and implementation structurally.
_COMPARE = r"""
import json, sys
from pathlib import Path
import tvm_ffi
from sharetune_tuner.model import intrinsics as I
cached = I.read_cache(I.cache_path(Path(sys.argv[1])))
parsed = I.capture()
c, p = {n: (d, i) for n, d, i in cached}, {n: (d, i) for n, d, i in parsed}
differ = [n for n in p if n in c and not (tvm_ffi.structural_equal(c[n][0], p[n][0])
                                          and tvm_ffi.structural_equal(c[n][1], p[n][1]))]
print(json.dumps({"cached": sorted(c), "parsed": sorted(p), "differ": differ}))
"""


def _py(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir whose cache file is corrupt: the first client must rebuild it, not crash."""
    d = tmp_path_factory.mktemp("intrinsics")
    key = _py("import json; from sharetune_tuner.model import intrinsics as I; print(json.dumps(I.cache_key()))")
    (d / f"tensor-intrinsics-{key}.json").write_text('{"key": "' + key + '", "names": ["x"], "ir": "not json')
    first = _py(_DESIGN_SPACES, str(d))
    assert first["how"] == "built"
    assert first["error"] is None and first["tensorized_with"]
    return d


def test_cached_intrinsics_equal_the_ones_tvm_parses(cache_dir: Path) -> None:
    r = _py(_COMPARE, str(cache_dir))
    assert len(r["parsed"]) > 100  # cuda, x86, arm, rocm, hexagon, ... (124 in TVM 0.27)
    assert r["cached"] == r["parsed"]
    assert r["differ"] == []


def test_a_process_registers_from_the_cache_and_tunes_with_tensor_cores(cache_dir: Path) -> None:
    r = _py(_DESIGN_SPACES, str(cache_dir), "import-submodule")
    assert r["how"] == "cache"
    assert not r["package_executed"]  # TVMScript of the package was not parsed
    assert r["error"] is None
    assert "wmma_sync_16x16x16_f16f16f32" in r["tensorized_with"]
    # a real import of a submodule afterwards (dlight does this) still works
    assert "wmma_sync_16x16x16_f16f16f32" in r["wmma_group"]


def test_without_intrinsics_the_tensor_core_rule_fails() -> None:
    """The check above can fail: with nothing registered, design-space generation refuses."""
    r = _py(_DESIGN_SPACES, "none")
    assert r["tensorized_with"] == []
    assert "is not registered" in (r["error"] or "")


def test_a_stale_cache_is_not_used(tmp_path: Path) -> None:
    """A file of another TVM build (other key) is ignored: a rebuilt cache gets its own name."""
    from sharetune_tuner.model import intrinsics as I

    stale = tmp_path / "tensor-intrinsics-0000000000000000.json"
    stale.write_text(json.dumps({"key": "0000000000000000", "names": [], "ir": "[]"}))
    assert I.cache_path(tmp_path) != stale
    assert I.read_cache(tmp_path / "tensor-intrinsics-1111111111111111.json") is None
    moved = tmp_path / "tensor-intrinsics-1111111111111111.json"
    stale.rename(moved)
    assert I.read_cache(moved) is None  # key inside differs from the name's


def test_clients_started_together_parse_the_intrinsics_once(tmp_path: Path) -> None:
    """Two processes on an empty cache at the same time: one parses and writes, the other waits
    for it and reads the file (the quickstart's two clients)."""
    code = "import sys; from pathlib import Path; from sharetune_tuner.model import intrinsics as I; " \
           "print(I.ensure_registered(Path(sys.argv[1])))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert sorted(o.strip().splitlines()[-1] for o, _ in outs) == ["built", "cache"]
