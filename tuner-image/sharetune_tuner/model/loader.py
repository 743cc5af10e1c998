"""Loads a model (built-in zoo name, ONNX path or URL) into a Relax module ready for tuning.

Users' ONNX files are imported the way stock TVM compiles them: initializers bound as constants
(``keep_params_in_input=False``), so weights an exporter computes inside the graph (old exporters'
``ConstantOfShape`` weights, shape tensors that ``Reshape`` reads) and IR v3 graphs, which list
their initializers among the inputs too, import as TVM expects; ``LoadedModel.params`` is empty for
them. The zoo's models keep their weights as parameters after the input.

Whatever fails while importing, extracting tasks from or compiling a user's model is a
:class:`ModelError` that names the ONNX operator (node) or the TVM pass that failed
(:func:`model_errors`), never a TVM traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sharetune.api.spec import ModelSpec
from sharetune.api.topology import MODEL_DIR, MODEL_DIR_ENV, MODEL_FILE
from sharetune.models import MODEL_CACHE_ENV, check_builtin, fetch_url

from ..errors import ModelError, TunerError
from .zoo import ZOO

log = logging.getLogger("sharetune.model")

INPUT_NAME = "input"


@dataclass
class LoadedModel:
    name: str
    input_shape: tuple[int, ...]
    input_name: str
    mod: Any  # tvm.IRModule, decomposed for inference but not fused (what compile_relax takes)
    params: list[Any]  # the weights, in the order main() takes them after the input (ONNX files: none, bound)

    def sample_input(self, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal(self.input_shape).astype(np.float32)


def _onnx_from_file(path: Path) -> Any:
    import onnx

    if not path.exists():
        raise ModelError(f"model file {path} does not exist")
    try:
        m = onnx.load(str(path))
        onnx.checker.check_model(m)
    except Exception as e:  # onnx raises DecodeError, ValidationError, ... for bad files
        raise ModelError(f"{path} is not a valid ONNX model: {type(e).__name__}: {e}") from None
    return m


def _dims(inp: Any) -> list[int | str]:
    """An ONNX input's dimensions: sizes, or the symbolic name (``?`` when unnamed) of a dynamic one."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in inp.type.tensor_type.shape.dim]


def _input_shape(model: Any, override: tuple[int, ...] | None) -> tuple[str, tuple[int, ...]]:
    """The model's one input and the shape to import it at: ``override`` (``spec.model.inputShape``)
    where given (it sets dynamic dimensions, a dynamic batch for one; it must keep the input's
    rank), else the model's own, which must then be static."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]  # IR v3 lists initializers too
    if len(inputs) != 1:
        names = ", ".join(repr(i.name) for i in inputs)
        raise ModelError(f"sharetune tunes single-input models; this one has {len(inputs)} inputs ({names})")
    inp = inputs[0]
    dims = _dims(inp)
    if not inp.type.HasField("tensor_type") or inp.type.tensor_type.elem_type not in (0, 1):  # FLOAT
        raise ModelError(f"input {inp.name!r} is not a float32 tensor; sharetune feeds float32 inputs")
    if override is not None:
        shape = tuple(int(d) for d in override)
        has_shape = inp.type.tensor_type.HasField("shape")
        if has_shape and len(dims) != len(shape):
            raise ModelError(f"spec.model.inputShape {list(shape)} has rank {len(shape)}; "
                             f"input {inp.name!r} has rank {len(dims)} {dims}")
        return inp.name, shape
    if not dims or any(isinstance(d, str) for d in dims):
        raise ModelError(f"input {inp.name!r} has a dynamic shape {dims}; set spec.model.inputShape")
    return inp.name, tuple(int(d) for d in dims)


def load(name: str | None = None, onnx_path: str | Path | None = None, url: str | None = None,
         input_shape: tuple[int, ...] | None = None, cache_dir: Path | None = None) -> LoadedModel:
    """Exactly one of ``name`` (zoo), ``onnx_path`` or ``url``."""
    if sum(x is not None for x in (name, onnx_path, url)) != 1:
        raise ModelError("give exactly one of a built-in model name, an ONNX path or a URL")
    if name is not None:
        check_builtin(name)
        entry = ZOO[name]
        shape = tuple(input_shape or entry.default_shape)
        try:
            proto = entry.build(list(shape))
        except Exception as e:
            raise ModelError(f"cannot build {name} for input shape {list(shape)}: {e}") from None
        return _to_relax(name, proto, INPUT_NAME, shape, weights_as_params=True)
    path = Path(onnx_path) if onnx_path is not None else fetch_url(
        str(url), cache_dir or Path.home() / ".cache" / "sharetune" / "models")
    proto = _onnx_from_file(path)
    input_name, shape = _input_shape(proto, input_shape)
    label = path.stem if onnx_path is not None else str(url).rsplit("/", 1)[-1]
    return _to_relax(label, proto, input_name, shape)


def _to_relax(label: str, proto: Any, input_name: str, shape: tuple[int, ...],
              weights_as_params: bool = False) -> LoadedModel:
    """The Relax module of an ONNX model. ``weights_as_params`` (the zoo): initializers become
    parameters after the input (``LoadedModel.params``); otherwise (users' files) they are bound
    as constants, as stock TVM imports a model."""
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    with model_errors(f"TVM cannot import {label}"):
        # The frontend prints a failing node's inputs (whole tensors) to stdout: keep it out of logs.
        with contextlib.redirect_stdout(io.StringIO()):
            mod = from_onnx(proto, {input_name: list(shape)}, keep_params_in_input=weights_as_params)
        params: list[Any] = []
        if weights_as_params:
            mod, detached = relax.frontend.detach_params(mod)
            params = list(detached.get("main", []))
        # Batch-norm & co. decomposed, bindings canonicalised. Not fused here: compile_relax fuses
        # itself, and fusing an already fused module yields other PrimFuncs whose records never
        # match (measured: every conv missed its record, tuned == untuned). tasks.extract fuses a copy.
        mod = relax.transform.DecomposeOpsForInference()(mod)
        mod = relax.transform.CanonicalizeBindings()(mod)
        if not weights_as_params:
            mod = fold_weights(mod)
    _check_output(label, mod)
    return LoadedModel(label, tuple(shape), input_name, mod, params)


def _check_output(label: str, mod: Any) -> None:
    """The merge compares one float tensor (the first output); say so now if there is none."""
    from tvm import relax

    ret = mod["main"].ret_ty
    first = ret.fields[0] if isinstance(ret, relax.TupleType) and ret.fields else ret
    if not isinstance(first, relax.TensorType):
        raise ModelError(f"{label}: the first output is a {type(first).__name__}, not a tensor; "
                         f"sharetune checks the tuned model's first output against the untuned one")


# -- weights computed in the graph ----------------------------------------------------------------

# What exporters compute weights with (and DecomposeOpsForInference adds for batch-norm), folded
# in numpy: TVM's FoldConstant would build an LLVM kernel per shape for each of them, in every
# extraction and compilation (ResNet-50 from onnx-caffe2: 17-24 s each; this: 0.4 s once).
_UNARY: dict[str, Any] = {"relax.sqrt": np.sqrt, "relax.rsqrt": lambda x: 1 / np.sqrt(x),
                          "relax.negative": np.negative, "relax.exp": np.exp, "relax.abs": np.abs}
_BINARY: dict[str, Any] = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
                           "relax.divide": np.divide, "relax.power": np.power, "relax.maximum": np.maximum,
                           "relax.minimum": np.minimum}


def _fold(call: Any, value_of: Any) -> np.ndarray | None:
    """The value of ``call`` when it is one of the ops above (or a layout op) on constants."""
    import tvm

    if not isinstance(call, tvm.relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    if name in _UNARY or name in _BINARY:
        args = [value_of(a) for a in call.args]
        if any(a is None for a in args):
            return None
        return np.asarray((_UNARY.get(name) or _BINARY[name])(*args))
    x = value_of(call.args[0]) if call.args else None
    if x is None:
        return None
    attrs = call.attrs
    if name == "relax.expand_dims":
        for ax in sorted(int(i) % (x.ndim + len(attrs.axis)) for i in attrs.axis):
            x = np.expand_dims(x, ax)
        return x
    if name == "relax.permute_dims":
        return np.transpose(x, None if attrs.axes is None else [int(i) for i in attrs.axes])
    if name in ("relax.reshape", "relax.broadcast_to") and type(call.args[1]).__name__ == "ShapeExpr":
        shape = [int(v) for v in call.args[1].values]
        return x.reshape(shape) if name == "relax.reshape" else np.broadcast_to(x, shape).copy()
    if name == "relax.astype":
        return x.astype(str(attrs.dtype))
    return None


@functools.cache
def _folder_class() -> Any:
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class WeightFolder(relax.PyExprMutator):  # type: ignore[misc]  # relax has no stubs: a subclass of Any
        """Replaces each binding :func:`_fold` can compute by the constant it computes (where the
        result has the binding's static shape and dtype); everything else is left to TVM."""

        def _value(self, e: Any) -> np.ndarray | None:
            if isinstance(e, relax.Var):
                e = self.lookup_binding(e)
            return e.value.numpy() if isinstance(e, tvm.ir.GenericConst) else None

        def visit_var_binding_(self, binding: Any) -> None:
            value = self.visit_expr(binding.value)
            try:
                with np.errstate(all="ignore"):  # what TVM would compute too (inf, nan)
                    arr = _fold(value, self._value)
            except Exception:  # anything unexpected: TVM folds it (or not) as before
                arr = None
            ty = binding.var.ty
            shape = getattr(ty, "shape", None)
            if (arr is not None and shape is not None and str(arr.dtype) == str(ty.dtype)
                    and all(type(d).__name__ == "IntImm" for d in shape.values)
                    and [int(d) for d in shape.values] == list(arr.shape)):
                value = relax.const(arr, str(arr.dtype))
            # Inside a dataflow block only its outputs are plain Vars; elsewhere every var is one.
            dataflow = self.builder_.current_block_is_dataflow()
            emit = self.builder_.emit_output if dataflow and not isinstance(binding.var, relax.DataflowVar) \
                else self.builder_.emit
            self.set_var_remap(binding.var, emit(value, binding.var.name))

    return WeightFolder


def fold_weights(mod: Any) -> Any:
    """``mod`` with weights computed from constants (``ConstantOfShape`` weights, batch-norm's
    scale and shift, transposed ``Gemm`` weights) folded to constants. The module compiles to the
    same kernels (same task hashes) as without it, where TVM's FoldConstant does this slowly."""
    import tvm
    from tvm import relax

    try:
        funcs = dict(mod.functions.items())
        funcs[mod.get_global_var("main")] = _folder_class()(mod).visit_expr(mod["main"])
        out = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)
        out = relax.transform.CanonicalizeBindings()(out)
        return relax.transform.DeadCodeElimination()(out)
    except Exception as e:  # a graph this folder does not know: TVM's FoldConstant does it all, slower
        log.warning("weights not folded at load (%s); compilation folds them", describe(e))
        return mod


# -- errors: which operator or pass failed ----------------------------------------------------------

# C++ frames that only carry a failure through (pass managers, FFI, visitor dispatch, checks).
_GENERIC_FRAME = re.compile(
    r"^(transform::|ffi::|runtime::|Pass|Sequential|ModulePass|FunctionPass|PrimFuncPass|"
    r"DataflowBlockPass|TypedPackedFunc|PackedFunc|Function|.*Functor|.*Visitor|.*Mutator|"
    r".*::operator\(\)|operator\(\)|.*::Visit\w*|.*::Call$|.*::CallPacked|.*::Invoke|.*Check|"
    r".*Fatal|.*Error\w*|TVMFFI\w*)")
# "void tvm::relax::UDChain::DefineVar(const tvm::Var&)" -> "UDChain::DefineVar"
_CPP_NAME = re.compile(r"tvm::(?:[a-z_0-9]+::)*((?:[A-Z]\w*::)*~?[A-Za-z_]\w*)(?:<[^(]*>)?\s*\(")
_ONNX_FRONTEND = os.path.join("frontend", "onnx") + os.sep
_LEGALIZE = re.compile(r"legalize_ops[/\\](\w+)\.py$")
_UNSUPPORTED = re.compile(r"The following operators are not supported for frontend ONNX: (.*)")
PASS_ATTR = "sharetune_failed_pass"  # set on an exception by whoever knows the pass it escaped from


def _frames(e: BaseException) -> list[Any]:
    out, tb = [], e.__traceback__
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


def failed_where(e: BaseException) -> str | None:
    """Where ``e`` was raised, from its traceback (TVM's FFI puts the C++ frames in it):
    ``ONNX node conv1 (Conv)`` when the ONNX frontend was converting a node; else the pass (set
    by :mod:`.tasks` as ``PASS_ATTR``), the Relax operator whose legalisation failed (from the
    frame of its rule in ``legalize_ops/``) and the outermost C++ function that is not machinery
    (pass manager, FFI, visitor dispatch), e.g. ``LegalizeOps: relax.nn.prelu`` or
    ``FoldConstant: RemoveAllUnused``; ``ONNX operator Celu`` for operators the frontend lacks."""
    frames = _frames(e)
    m = _UNSUPPORTED.search(str(e))
    if m:  # the frontend's check of the whole graph, before any node is converted
        return f"ONNX operator {m.group(1).strip()}"
    for tb in reversed(frames):  # the innermost ONNX frontend frame that holds the node it converts
        f = tb.tb_frame
        if _ONNX_FRONTEND in f.f_code.co_filename and hasattr(f.f_locals.get("node"), "op_type"):
            node = f.f_locals["node"]
            return f"ONNX node {node.name or '(unnamed)'} ({node.op_type})"
    parts: list[str] = []
    if getattr(e, PASS_ATTR, None):
        parts.append(str(getattr(e, PASS_ATTR)))
    summary = traceback.extract_tb(e.__traceback__)
    for fr in reversed(summary):  # the innermost operator legalisation (LegalizeOps' Python rules)
        m = _LEGALIZE.search(fr.filename)
        if m:
            module, fn = m.group(1), fr.name.lstrip("_")
            parts.append(f"relax.{module}.{fn[len(module) + 1:]}" if fn.startswith(module + "_")
                         else f"legalize_ops/{module}.py:{fr.name}")
            break
    for fr in summary:
        if fr.filename.endswith((".py", ".pxi")):
            continue
        m = _CPP_NAME.search(fr.name)
        if m and not _GENERIC_FRAME.match(m.group(1)):
            if m.group(1) not in parts:
                parts.append(m.group(1))
            break
    return ": ".join(parts) or None


def _message(e: BaseException) -> str:
    """TVM's message without its ``Check failed: (...) is false:`` preamble; for a bare
    ``assert`` the failing line and where it is."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    # TVM's messages may carry a traceback of their own; the message is the last line then.
    msg = lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
    msg = re.sub(r"^Check failed: \(.*?\) is false:\s*", "", msg)
    msg = re.sub(r"^(InternalError|TVMError|ValueError|TypeError|AssertionError):\s*", "", msg)
    if not msg or msg == type(e).__name__:
        tb = traceback.extract_tb(e.__traceback__)
        last = tb[-1] if tb else None
        if last is not None and last.line:
            where = os.sep.join(Path(last.filename).parts[-3:])
            return f"{type(e).__name__}: `{last.line.strip()}` failed ({where}:{last.lineno})"
        return type(e).__name__
    return msg if len(msg) <= 500 else msg[:500] + "..."


def describe(e: BaseException) -> str:
    """One line: where ``e`` happened (:func:`failed_where`) and TVM's message, e.g.
    ``RemoveAllUnused: Variable x was used before its definition``."""
    msg = _message(e)
    if _UNSUPPORTED.search(msg):
        msg = "not supported by TVM's ONNX frontend"
    where = failed_where(e)
    if where is None:
        return msg if msg.startswith(type(e).__name__) else f"{type(e).__name__}: {msg}"
    return f"{where}: {msg}"


@contextlib.contextmanager
def model_errors(what: str) -> Iterator[None]:
    """Turns whatever TVM raises while it imports, extracts tasks from or compiles a model into a
    :class:`ModelError` ``"<what>: <operator or pass>: <message>"``: exit code 3, one line, not
    retried as a transient fault. Machine trouble (out of memory, OS errors) passes through."""
    try:
        yield
    except (TunerError, MemoryError, OSError):
        raise
    except Exception as e:
        raise ModelError(f"{what}: {describe(e)}") from None


def load_for_spec(spec: ModelSpec, cache_dir: Path | None = None) -> LoadedModel:
    """The model a job's ``spec.model`` names."""
    if spec.name is not None:
        return load(name=spec.name, input_shape=spec.input_shape)
    src = spec.onnx
    assert src is not None  # the spec parser: exactly one of name or onnx
    if src.url:
        cache = os.environ.get(MODEL_CACHE_ENV)
        return load(url=src.url, input_shape=spec.input_shape, cache_dir=cache_dir or (Path(cache) if cache else None))
    if src.path:
        return load(onnx_path=src.path, input_shape=spec.input_shape)
    # A ConfigMap or PVC source: the operator mounts it at SHARETUNE_MODEL_DIR in the client and
    # merge pods (the ConfigMap's key as model.onnx, the PVC as a whole).
    root = Path(os.environ.get(MODEL_DIR_ENV, MODEL_DIR))
    if src.config_map:
        path, where = root / MODEL_FILE, f"ConfigMap {src.config_map} key {src.config_map_key}"
    else:
        path, where = root / str(src.pvc_path or "").lstrip("/"), f"PVC {src.pvc} path {src.pvc_path}"
    if not path.is_file():
        raise ModelError(f"no model file at {path} ({where}); outside a pod, use spec.model.onnx.path")
    return load(onnx_path=path, input_shape=spec.input_shape)
