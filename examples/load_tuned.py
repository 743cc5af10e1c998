"""Run a tuned model in TVM's runtime: what `sharetune result compile WHERE -o DIR` wrote.

    python examples/load_tuned.py DIR

Loads DIR/model.so into a Relax VirtualMachine, feeds it a random input of the shape in
DIR/model.json and the weights in DIR/params.npz (in main()'s order), and times it. The
README's "Using the result" shows this code; tests/tuner/test_result.py runs this file.
"""

import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

out = Path(sys.argv[1] if len(sys.argv) > 1 else "tuned")
info = json.loads((out / "model.json").read_text())
dev = tvm.cpu() if info["target"] == "llvm" else tvm.cuda()
vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / "model.so")), dev)

inp = info["inputs"][0]  # name, shape, dtype
x = np.random.default_rng(0).standard_normal(inp["shape"]).astype(inp["dtype"])
params = np.load(out / "params.npz")  # empty for ONNX files: their weights are in model.so
args = [tvm.runtime.tensor(x, dev), *(tvm.runtime.tensor(params[k], dev) for k in params.files)]

y = vm["main"](*args)
y = (y if hasattr(y, "numpy") else y[0]).numpy()  # the first output
ms = vm.time_evaluator("main", dev, repeat=5, min_repeat_ms=200)(*args).median * 1e3
print(f"{info['model']}: output {list(y.shape)}, {ms:.3f} ms "
      f"(the merge measured {info['latency_tuned_ms']} ms, {info['speedup']}x faster than untuned)")
