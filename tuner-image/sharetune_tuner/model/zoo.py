"""Built-in model zoo: ONNX graphs generated in code with seeded random weights.

No downloads and no torch: each model is written with ``onnx.helper`` so the tuner image can
build it offline, and so the built-in models and user ONNX files take the same import path.
Batch-norm is folded into the convolutions' weights and biases, as inference compilers do.
Weights use He initialisation so activations stay in range and output checks mean something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass
class GraphBuilder:
    """Accumulates ONNX nodes and initializers with unique names and seeded weights."""

    seed: int = 0
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    _n: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, array: np.ndarray, prefix: str = "w") -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), n))
        return n

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    # --- layers -----------------------------------------------------------------------------
    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             act: str | None = "relu") -> str:
        fan_in = cin // groups * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k)).astype(np.float32)
        b = self.rng.normal(0, 0.01, (cout,)).astype(np.float32)
        y = self.op("Conv", [x, self.const(w), self.const(b, "b")], kernel_shape=[k, k],
                    strides=[stride, stride], pads=[k // 2] * 4, group=groups)
        if act == "relu":
            y = self.op("Relu", [y])
        elif act == "relu6":
            y = self.op("Clip", [y, self.const(np.array(0, np.float32), "lo"),
                                 self.const(np.array(6, np.float32), "hi")])
        return y

    def linear(self, x: str, din: int, dout: int) -> str:
        w = self.rng.normal(0, np.sqrt(1.0 / din), (din, dout)).astype(np.float32)
        b = self.rng.normal(0, 0.01, (dout,)).astype(np.float32)
        return self.op("Add", [self.op("MatMul", [x, self.const(w)]), self.const(b, "b")])

    def classifier(self, x: str, channels: int, classes: int) -> str:
        pooled = self.op("GlobalAveragePool", [x])
        flat = self.op("Flatten", [pooled], axis=1)
        return self.linear(flat, channels, classes)

    def model(self, name: str, inp: str, shape: list[int], out: str) -> onnx.ModelProto:
        def make(outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
            graph = helper.make_graph(self.nodes, name,
                                      [helper.make_tensor_value_info(inp, TensorProto.FLOAT, shape)],
                                      outputs, self.inits)
            m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="sharetune-zoo")
            m.ir_version = 8
            return m
        # The output's shape comes from ONNX shape inference rather than being written by hand.
        inferred = onnx.shape_inference.infer_shapes(make([onnx.ValueInfoProto(name=out)]))
        out_info = next(v for v in inferred.graph.value_info if v.name == out)
        m = make([out_info])
        onnx.checker.check_model(m, full_check=True)
        return m


def _resnet(name: str, shape: list[int], blocks: list[int], bottleneck: bool, classes: int = 1000,
            width: int = 64) -> onnx.ModelProto:
    g = GraphBuilder()
    x = g.conv("input", shape[1], width, 7, stride=2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, n in enumerate(blocks):
        mid = width * 2 ** stage
        cout = mid * 4 if bottleneck else mid
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:
                y = g.conv(x, cin, mid, 1)
                y = g.conv(y, mid, mid, 3, stride=stride)
                y = g.conv(y, mid, cout, 1, act=None)
            else:
                y = g.conv(x, cin, mid, 3, stride=stride)
                y = g.conv(y, mid, cout, 3, act=None)
            short = x if (stride == 1 and cin == cout) else g.conv(x, cin, cout, 1, stride=stride, act=None)
            x = g.op("Relu", [g.op("Add", [y, short])])
            cin = cout
    return g.model(name, "input", shape, g.classifier(x, cin, classes))


def resnet18(shape: list[int]) -> onnx.ModelProto:
    return _resnet("resnet18", shape, [2, 2, 2, 2], bottleneck=False)


def resnet34(shape: list[int]) -> onnx.ModelProto:
    return _resnet("resnet34", shape, [3, 4, 6, 3], bottleneck=False)


def resnet50(shape: list[int]) -> onnx.ModelProto:
    return _resnet("resnet50", shape, [3, 4, 6, 3], bottleneck=True)


def mobilenet_v2(shape: list[int]) -> onnx.ModelProto:
    g = GraphBuilder()
    x = g.conv("input", shape[1], 32, 3, stride=2, act="relu6")
    cin = 32
    # (expansion t, channels c, repeats n, stride s) from the MobileNetV2 paper.
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x if t == 1 else g.conv(x, cin, hidden, 1, act="relu6")
            y = g.conv(y, hidden, hidden, 3, stride=stride, groups=hidden, act="relu6")
            y = g.conv(y, hidden, c, 1, act=None)
            x = g.op("Add", [x, y]) if (stride == 1 and cin == c) else y
            cin = c
    x = g.conv(x, cin, 1280, 1, act="relu6")
    return g.model("mobilenet_v2", "input", shape, g.classifier(x, 1280, 1000))


def transformer_encoder(shape: list[int], layers: int = 2, heads: int = 4, ff: int = 512
                        ) -> onnx.ModelProto:
    """Post-LN encoder on an already-embedded sequence: input shape [batch, seq, d_model]."""
    batch, seq, d = shape
    dh = d // heads
    g = GraphBuilder()
    x = "input"

    def layernorm(v: str) -> str:
        return g.op("LayerNormalization", [v, g.const(np.ones(d, np.float32), "gamma"),
                                           g.const(np.zeros(d, np.float32), "beta")], axis=-1)

    def split_heads(v: str) -> str:
        r = g.op("Reshape", [v, g.const(np.array([batch, seq, heads, dh], np.int64), "shape")])
        return g.op("Transpose", [r], perm=[0, 2, 1, 3])

    for _ in range(layers):
        q, k, v = (split_heads(g.linear(x, d, d)) for _ in range(3))
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              g.const(np.array(1.0 / np.sqrt(dh), np.float32), "scale")])
        att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        merged = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]),
                                  g.const(np.array([batch, seq, d], np.int64), "shape")])
        x = layernorm(g.op("Add", [x, g.linear(merged, d, d)]))
        hidden = g.op("Relu", [g.linear(x, d, ff)])
        x = layernorm(g.op("Add", [x, g.linear(hidden, ff, d)]))
    return g.model("transformer_encoder", "input", shape, x)


def tiny_cnn(shape: list[int]) -> onnx.ModelProto:
    """A few-task CNN for CI and the quickstart: tunes in minutes on 2 cores."""
    g = GraphBuilder()
    x = g.conv("input", shape[1], 32, 3)
    x = g.conv(x, 32, 64, 3, stride=2)
    x = g.conv(x, 64, 64, 3)
    return g.model("tiny_cnn", "input", shape, g.classifier(x, 64, 10))


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[[list[int]], onnx.ModelProto]
    default_shape: tuple[int, ...]


ZOO: dict[str, ZooEntry] = {
    "resnet18": ZooEntry(resnet18, (1, 3, 224, 224)),
    "resnet34": ZooEntry(resnet34, (1, 3, 224, 224)),
    "resnet50": ZooEntry(resnet50, (1, 3, 224, 224)),
    "mobilenet_v2": ZooEntry(mobilenet_v2, (1, 3, 224, 224)),
    "transformer_encoder": ZooEntry(transformer_encoder, (1, 64, 128)),
    "tiny_cnn": ZooEntry(tiny_cnn, (1, 3, 64, 64)),
}
