"""Models users bring: ONNX files that other projects' tools produced, as stock TVM compiles them.

The corpus ships with the ``onnx`` package: nine ImageNet architectures exported by ONNX's model-zoo
tooling from Caffe2 (IR v3, opset 9, every weight computed in the graph by ``ConstantOfShape``,
initializers listed among the inputs, some input names with ``/``) and layers exported by
``torch.onnx`` at opset 6. ``bench/model_corpus.py`` tunes each of them; here every architecture
loads and extracts, one is tuned end to end, and models TVM cannot handle fail once, fast, with a
ModelError that names the operator or pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("tvm")

from sharetune_tuner.errors import ModelError
from sharetune_tuner.model import loader as model_mod
from sharetune_tuner.model.tasks import extract
from sharetune_tuner.targets import make_target

pytestmark = pytest.mark.tvm

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
LIGHT = DATA / "light"
PRELU = DATA / "pytorch-converted" / "test_PReLU_2d_multiparam" / "model.onnx"

# Task counts at the models' own 1x3x224x224 (llvm) pin the import + fusion result; GFLOP = the
# published multiply-accumulates x 2 (e.g. ResNet-50 4.1 G MACs, VGG-19 19.6 G).
CORPUS = {
    "bvlc_alexnet": ("data_0", 20, 1.32), "densenet121": ("data_0", 188, 5.73),
    "inception_v1": ("data_0", 79, 2.90), "inception_v2": ("data_0", 61, 4.09),
    "resnet50": ("gpu_0/data_0", 41, 8.25), "shufflenet": ("gpu_0/data_0", 39, 0.27),
    "squeezenet": ("data_0", 30, 0.71), "vgg19": ("data_0", 20, 39.3),
    "zfnet512": ("gpu_0/data_0", 19, 3.00),
}


def test_the_corpus_is_what_onnx_ships() -> None:
    assert sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx")) == sorted(CORPUS)
    m = onnx.load(str(LIGHT / "light_resnet50.onnx"))
    # What made these fail before: IR v3 (initializers among the inputs), weights computed in the graph.
    assert m.ir_version == 3 and m.opset_import[0].version == 9 and m.producer_name == "onnx-caffe2"
    assert sum(n.op_type == "ConstantOfShape" for n in m.graph.node) == 239


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_model_loads_and_extracts(name: str) -> None:
    input_name, tasks, gflop = CORPUS[name]
    m = model_mod.load(onnx_path=LIGHT / f"light_{name}.onnx")
    assert (m.input_name, m.input_shape, m.params) == (input_name, (1, 3, 224, 224), [])  # weights bound
    got = extract(m.mod, make_target("llvm", 1))
    assert len(got) == tasks
    assert sum(t.info.flops * t.info.weight for t in got) / 1e9 == pytest.approx(gflop, rel=0.02)


def test_weights_are_folded_once_at_load_to_the_same_tasks() -> None:
    """``fold_weights`` computes graph-computed weights in numpy; without it TVM's FoldConstant
    gets the same kernels (same task hashes), only slower (a kernel build per shape)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    m = model_mod.load(onnx_path=LIGHT / "light_squeezenet.onnx", input_shape=(1, 3, 64, 64))
    raw = from_onnx(onnx.load(str(LIGHT / "light_squeezenet.onnx")), {"data_0": [1, 3, 64, 64]})
    raw = relax.transform.CanonicalizeBindings()(relax.transform.DecomposeOpsForInference()(raw))
    target = make_target("llvm", 1)
    assert ({t.info.workload_hash for t in extract(m.mod, target)}
            == {t.info.workload_hash for t in extract(raw, target)})
    consts = [b.value for blk in m.mod["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and all(isinstance(a, tvm.ir.GenericConst) for a in b.value.args)]
    assert consts == []  # nothing left for TVM to fold


def _dynamic_variant(tmp_path: Path, logits: bool = False) -> Path:
    """SqueezeNet as a dynamic-shape export names its input: batch and spatial dims symbolic,
    a ``/`` in the input name (TF- and Caffe2-style scopes). ``logits``: without the final
    Softmax, whose output is uniform with these constant weights (1/1000 whatever the kernels
    compute), so that comparing outputs checks the kernels."""
    m = onnx.load(str(LIGHT / "light_squeezenet.onnx"))
    if logits:
        softmax = m.graph.node[-1]
        assert softmax.op_type == "Softmax"
        m.graph.node.remove(softmax)
        m.graph.output[0].name = softmax.input[0]
    inp = next(i for i in m.graph.input if i.name == "data_0")  # IR v3: the initializers are inputs too
    new = "images/input:0"
    for n in m.graph.node:
        n.input[:] = [new if i == inp.name else i for i in n.input]
    inp.name = new
    for d, p in zip(inp.type.tensor_type.shape.dim, ("batch", None, "height", "width")):
        if p:
            d.dim_param = p
    f = tmp_path / "squeezenet-dynamic.onnx"
    onnx.save(m, str(f))
    return f


def test_dynamic_input_needs_and_takes_the_spec_shape(tmp_path: Path) -> None:
    f = _dynamic_variant(tmp_path)
    with pytest.raises(ModelError, match=r"input 'images/input:0' has a dynamic shape \['batch', 3, 'height', "
                                         r"'width'\]; set spec.model.inputShape"):
        model_mod.load(onnx_path=f)
    with pytest.raises(ModelError, match=r"inputShape \[1, 64, 64\] has rank 3; input 'images/input:0' has rank 4"):
        model_mod.load(onnx_path=f, input_shape=(1, 64, 64))
    m = model_mod.load(onnx_path=f, input_shape=(2, 3, 64, 64))
    assert m.input_shape == (2, 3, 64, 64) and m.input_name == "images/input:0"


def test_user_model_tuned_end_to_end(tmp_path: Path) -> None:
    """The product's local mode on the dynamic SqueezeNet (input ``images/input:0``, shape given
    by ``spec.model.inputShape``): tuned, merged, its output checked against the untuned model."""
    import yaml

    doc = {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": "corpus-e2e"},
           "spec": {"model": {"onnx": {"path": str(_dynamic_variant(tmp_path, logits=True))},
                              "inputShape": [1, 3, 64, 64]},
                    "target": "llvm", "trials": {"total": 8, "perTask": 4, "perIteration": 4},
                    "servers": {"replicas": 1}, "clients": {"shards": 1}, "costModel": "xgb", "seed": 0}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir",
                        str(tmp_path / "run"), "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["model"] == "squeezenet-dynamic" and s["input_shape"] == [1, 3, 64, 64]
    assert s["records"] == 8 and len(s["tasks"]) == 27
    # The two heaviest convs got 4 trials each; their records beat TVM's default loops (measured
    # 2.6x and 7.8x), so the merge compiled the tuned model and compared its output.
    assert s["best_records"] == 2 and s["latency_records_ms"] is not None, s
    assert s["max_relative_error"] < 1e-3
    assert s["improved"] and s["latency_tuned_ms"] < s["latency_untuned_ms"], s  # measured 1.5x


def test_torch_style_dynamic_batch_flatten_imports_at_the_given_shape(tmp_path: Path) -> None:
    """What ``torch.onnx.export(..., dynamic_axes={"input.1": {0: "batch_size"}})`` writes for
    ``x.view(x.size(0), -1)``: Shape -> Gather -> Unsqueeze -> Concat -> Reshape on a dynamic batch."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv.weight"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(rng.standard_normal((10, 256)).astype(np.float32), "fc.weight")]
    nodes = [helper.make_node("Conv", ["input.1", "conv.weight"], ["c"], pads=[1, 1, 1, 1], name="/features/Conv"),
             helper.make_node("Relu", ["c"], ["r"], name="/features/Relu"),
             helper.make_node("Shape", ["r"], ["s"], name="/Shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="/Gather"),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="/Unsqueeze"),
             helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0, name="/Concat"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="/Reshape"),
             helper.make_node("Gemm", ["f", "fc.weight"], ["logits"], transB=1, name="/classifier/Gemm")]
    g = helper.make_graph(nodes, "main_graph",
                          [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch_size", 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "net.onnx"))
    m = model_mod.load(onnx_path=tmp_path / "net.onnx", input_shape=(4, 3, 8, 8))
    assert sorted(t.info.name for t in extract(m.mod, make_target("llvm", 1))) == ["fused_conv2d_relu", "matmul",
                                                                                   "reshape"]


def test_torch_opset6_layer_exports_load_and_extract() -> None:
    """Every layer ``torch.onnx`` exported at opset 6 for ONNX's backend tests (IR v3) loads and
    extracts, except what sharetune or TVM cannot take, which fails with a ModelError saying why."""
    target, failed = make_target("llvm", 1), {}
    dirs = sorted((DATA / "pytorch-converted").glob("test_*"))
    assert len(dirs) >= 80
    for d in dirs:
        try:
            assert extract(model_mod.load(onnx_path=d / "model.onnx").mod, target)
        except ModelError as e:
            failed[d.name] = str(e)
    assert sorted(failed) == ["test_Embedding", "test_Embedding_sparse", "test_PReLU_1d_multiparam",
                              "test_PReLU_2d_multiparam", "test_PReLU_3d_multiparam"], failed
    assert "input '0' is not a float32 tensor" in failed["test_Embedding"]  # token ids: sharetune feeds floats
    assert "LegalizeOps: relax.nn.prelu: AssertionError" in failed["test_PReLU_3d_multiparam"]


def _celu_model(tmp_path: Path) -> Path:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3, 3], [0.1] * 144)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="stem/conv", pads=[1, 1, 1, 1]),
                           helper.make_node("Celu", ["c"], ["y"], name="stem/act")], "g", [x], [y], [w])
    f = tmp_path / "celu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(f))
    return f


def test_models_tvm_cannot_handle_raise_model_errors_naming_operator_or_pass(tmp_path: Path) -> None:
    target = make_target("llvm", 1)
    # An operator TVM's ONNX frontend lacks.
    with pytest.raises(ModelError, match=r"^TVM cannot import celu: ONNX operator Celu: not supported"):
        model_mod.load(onnx_path=_celu_model(tmp_path))
    # A node the frontend converts and rejects: named, with its operator.
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="head/flatten")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                          [helper.make_tensor("s", TensorProto.INT64, [1], [3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "r.onnx"))
    with pytest.raises(ModelError, match=r"^TVM cannot import r: ONNX node head/flatten \(Reshape\): Reshape expects"):
        model_mod.load(onnx_path=tmp_path / "r.onnx")
    # torch.onnx's opset-6 PReLU export: imports, but relax.nn.prelu's legalisation fails.
    m = model_mod.load(onnx_path=PRELU)
    with pytest.raises(ModelError, match=r"^cannot extract tuning tasks: LegalizeOps: relax\.nn\.prelu: "
                                         r"AssertionError: `assert get_const_int"):
        extract(m.mod, target)
    # The failure this issue reported: the IR v3 zoo models imported with their weights as inputs
    # (keep_params_in_input=True, what sharetune did) break TVM's RemoveAllUnused.
    from tvm.relax.frontend.onnx import from_onnx

    old = from_onnx(onnx.load(str(LIGHT / "light_zfnet512.onnx")),
                                        {"gpu_0/data_0": [1, 3, 224, 224]}, keep_params_in_input=True)
    with pytest.raises(ModelError, match=r"^cannot extract tuning tasks: FoldConstant: RemoveAllUnused: "
                                         r"Variable \S+ was used before its definition$"):
        extract(old, target)


def test_untunable_model_fails_once_fast_with_one_line(tmp_path: Path) -> None:
    """Local mode on the PReLU export: the client exits 3 with the ModelError's one line, no
    traceback, and is not restarted (exit 3 is permanent)."""
    import yaml

    doc = {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": "corpus-bad"},
           "spec": {"model": {"onnx": {"path": str(PRELU)}}, "target": "llvm",
                    "trials": {"total": 4, "perTask": 4, "perIteration": 4},
                    "servers": {"replicas": 1}, "clients": {"shards": 1}, "seed": 0}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 3, out  # the client's model error, passed on
    assert "client 0 failed (model error, not retried)" in out, out
    log = (tmp_path / "run" / "logs" / "client-0.log").read_text()
    assert "Traceback" not in log, log
    assert log.count("sharetune-tuner client: error: cannot extract tuning tasks: LegalizeOps: relax.nn.prelu: "
                     "AssertionError: `assert get_const_int(slope.shape[0]) == get_const_int(x.shape[axis])` failed "
                     "(topi/nn/elemwise.py:137)") == 1, log
    assert took < 90, took
    # The client alone: exit code 3 and that one line on stderr.
    r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", "client", "--job", str(job), "--work-dir",
                        str(tmp_path / "w"), "--tracker", "127.0.0.1:9", "--tracker-wait", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "sharetune-tuner client: error: cannot extract tuning tasks: LegalizeOps: relax.nn.prelu:"), r.stderr
