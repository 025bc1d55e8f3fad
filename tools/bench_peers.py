"""W1-W7, ResNet-18 and ResNet-50 in peer frameworks and in kfuse, measured in one run on one machine.

    python tools/bench_peers.py [--kfuse target/release/kfuse] [--runs 10] [--rounds 3]

Peers: numpy (eager; W1-W5), jax.jit, onnxruntime (the models use ORT's fused Softmax,
LayerNormalization and BatchNormalization ops where ONNX has them, and give weights as
initializers so ORT can fold and fuse them), torch eager and torch.compile (inductor, which
compiles C++ with the system's g++; both under `torch.inference_mode`). Every framework is
limited to two threads; a framework that is not installed is skipped with a line on stderr.

The frameworks take turns: each round times every peer and then kfuse (`kfuse bench`), and a
framework's figure for a workload is the best of its per-round medians, as in WORKLOADS.md's
"median ms, best of three full runs". A slow spell of a shared machine then costs no framework
its figure (onnxruntime, for one, alternates between a fast and a two-times-slower mode
between rounds on this VM). Prints a Markdown
table of those figures and writes the raw numbers as JSON to stdout's last line.
Needs `pip install numpy onnx onnxruntime "jax[cpu]" torch` in an environment of its own (PyPI's
torch wheel brings about 4 GB of CUDA libraries it does not use here); kfuse's build and tests
never need any of this.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

THREADS = "2"
os.environ.setdefault("OMP_NUM_THREADS", THREADS)
os.environ.setdefault("OPENBLAS_NUM_THREADS", THREADS)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=" + THREADS)

import numpy as np  # noqa: E402

N = 16_777_216
SOFTMAX = (4096, 4096)
LAYERNORM = (8192, 1024)


DENSE = (1024, 1024, 4096)  # W5: M, K, N
DSC = (8, 64, 112, 112, 128)  # W6: N, C, H, W, C_out
CBR = (8, 64, 56, 56)  # W7: N, C, H, W
R18 = (8, 224)  # ResNet-18 and ResNet-50 for inference (batchnorms folded into the convolutions): N, H = W


def r18_convs():
    """(c_in, c_out, k, stride) of ResNet-18's convolutions in the order `r18_forward` uses
    them, as `kfuse bench resnet18` builds the network."""
    convs, c = [(3, 64, 7, 2)], 64
    for stage, co in enumerate([64, 128, 256, 512]):
        for block in range(2):
            s = 2 if stage > 0 and block == 0 else 1
            convs += [(c, co, 3, s), (co, co, 3, 1)] + ([(c, co, 1, 2)] if s == 2 else [])
            c = co
    return convs


def r50_convs():
    """(c_in, c_out, k, stride) of ResNet-50's convolutions in the order `r50_forward` uses
    them, as `kfuse bench resnet50` builds the network (bottleneck blocks, the stride on the
    3x3, a 1x1 projection on the skip where the shape changes)."""
    convs, c = [(3, 64, 7, 2)], 64
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        co = 4 * width
        for block in range(blocks):
            s = 2 if stage > 0 and block == 0 else 1
            convs += [(c, width, 1, 1), (width, width, 3, s), (width, co, 1, 1)]
            convs += [(c, co, 1, s)] if s == 2 or c != co else []
            c = co
    return convs


def r50_forward(ops, x, params):
    """ResNet-50 on `x` through one framework's `ops`; `params` the (weight, bias) pairs of
    `r50_convs()`, then the dense layer's."""
    it = iter(params)

    def conv(v, stride):
        w, b = next(it)
        return ops.conv(v, w, b, stride)

    x, c = ops.maxpool(ops.relu(conv(x, 2))), 64
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for block in range(blocks):
            s = 2 if stage > 0 and block == 0 else 1
            a = ops.relu(conv(x, 1))
            b = ops.relu(conv(a, s))
            e = conv(b, 1)
            skip = conv(x, s) if s == 2 or c != 4 * width else x
            x, c = ops.relu(ops.add(e, skip)), 4 * width
    fc, fcb = next(it)
    return ops.dense(ops.gap(x), fc, fcb)


def r18_forward(ops, x, params):
    """ResNet-18 on `x` through one framework's `ops` (conv with bias, relu, add, max pool,
    global average pool, dense); `params` the (weight, bias) pairs of `r18_convs()`, then the
    dense layer's."""
    it = iter(params)

    def conv(v, stride):
        w, b = next(it)
        return ops.conv(v, w, b, stride)

    x = ops.maxpool(ops.relu(conv(x, 2)))
    for stage in range(4):
        for block in range(2):
            s = 2 if stage > 0 and block == 0 else 1
            a = ops.relu(conv(x, s))
            b = conv(a, 1)
            skip = conv(x, 2) if s == 2 else x
            x = ops.relu(ops.add(b, skip))
    fc, fcb = next(it)
    return ops.dense(ops.gap(x), fc, fcb)


def median_ms(f, runs):
    f()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def data():
    rng = np.random.default_rng(7)
    return {
        "x": rng.standard_normal(N, dtype=np.float32),
        "y": rng.standard_normal(N, dtype=np.float32),
        "s": rng.standard_normal(SOFTMAX, dtype=np.float32),
        "l": rng.standard_normal(LAYERNORM, dtype=np.float32),
        "g": rng.standard_normal(LAYERNORM[1], dtype=np.float32),
        "b": rng.standard_normal(LAYERNORM[1], dtype=np.float32),
        # W5: dense layers.
        "dx": rng.standard_normal(DENSE[:2], dtype=np.float32),
        "dw1": rng.standard_normal(DENSE[1:], dtype=np.float32) * 0.03,
        "db1": rng.standard_normal(DENSE[2], dtype=np.float32),
        "dw2": rng.standard_normal(DENSE[2:0:-1], dtype=np.float32) * 0.015,
        "db2": rng.standard_normal(DENSE[1], dtype=np.float32),
        # W6: depthwise-separable block and the standard convolution.
        "cx": rng.standard_normal(DSC[:4], dtype=np.float32),
        "wd": rng.standard_normal((DSC[1], 1, 3, 3), dtype=np.float32) * 0.3,
        "wp": rng.standard_normal((DSC[4], DSC[1], 1, 1), dtype=np.float32) * 0.1,
        "w6": rng.standard_normal((DSC[4], DSC[1], 3, 3), dtype=np.float32) * 0.05,
        # W7: conv + batchnorm + relu.
        "bx": rng.standard_normal(CBR, dtype=np.float32),
        "bw": rng.standard_normal((CBR[1], CBR[1], 3, 3), dtype=np.float32) * 0.05,
        "mean": rng.standard_normal(CBR[1], dtype=np.float32) * 0.1,
        "var": np.abs(rng.standard_normal(CBR[1], dtype=np.float32)) + 0.5,
        "gamma": rng.standard_normal(CBR[1], dtype=np.float32),
        "beta": rng.standard_normal(CBR[1], dtype=np.float32) * 0.1,
        # ResNet-18: He-scaled weights, small biases.
        "rx": rng.standard_normal((R18[0], 3, R18[1], R18[1]), dtype=np.float32),
        "r18": [((rng.standard_normal((co, c, k, k)) * np.sqrt(2 / (c * k * k))).astype(np.float32),
                 (rng.standard_normal(co) * 0.1).astype(np.float32)) for c, co, k, _ in r18_convs()]
               + [((rng.standard_normal((512, 1000)) / np.sqrt(512)).astype(np.float32),
                   (rng.standard_normal(1000) * 0.1).astype(np.float32))],
        "r50": [((rng.standard_normal((co, c, k, k)) * np.sqrt(2 / (c * k * k))).astype(np.float32),
                 (rng.standard_normal(co) * 0.1).astype(np.float32)) for c, co, k, _ in r50_convs()]
               + [((rng.standard_normal((2048, 1000)) / np.sqrt(2048)).astype(np.float32),
                   (rng.standard_normal(1000) * 0.1).astype(np.float32))],
    }


def gelu_tanh(np_or_jnp, x):
    return 0.5 * x * (1 + np_or_jnp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def numpy_suite(d):
    def softmax(s):
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layernorm(x, g, b):
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * g + b

    return {
        "W1": lambda: np.log(np.exp(d["x"]) + 1),
        "W2a": lambda: np.tanh(0.5 * d["x"] + 0.1),
        "W2b": lambda: np.maximum(np.tanh(d["x"] * 0.5 + 0.1) * d["x"] - 0.3, 0),
        "W3": lambda: (lambda t: (t + 0.25, t - 0.75))(d["x"] * d["y"]),
        "W4a": lambda: softmax(d["s"]),
        "W4b": lambda: layernorm(d["l"], d["g"], d["b"]),
        "W5a": lambda: np.maximum(d["dx"] @ d["dw1"] + d["db1"], 0),
        "W5b": lambda: gelu_tanh(np, d["dx"] @ d["dw1"] + d["db1"]) @ d["dw2"] + d["db2"],
    }


def jax_suite(d):
    import jax
    import jax.numpy as jnp

    x, y, s, l, g, b = (jnp.asarray(d[k]) for k in "xyslgb")
    w1 = jax.jit(lambda x: jnp.log(jnp.exp(x) + 1))
    w2a = jax.jit(lambda x: jnp.tanh(0.5 * x + 0.1))
    w2b = jax.jit(lambda x: jnp.maximum(jnp.tanh(x * 0.5 + 0.1) * x - 0.3, 0))
    w3 = jax.jit(lambda x, y: (lambda t: (t + 0.25, t - 0.75))(x * y))
    w4a = jax.jit(lambda s: jax.nn.softmax(s, axis=1))

    def ln(x, g, b):
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + b

    w4b = jax.jit(ln)
    ready = jax.block_until_ready
    dx, dw1, db1, dw2, db2 = (jnp.asarray(d[k]) for k in ["dx", "dw1", "db1", "dw2", "db2"])
    w5a = jax.jit(lambda x, w, b: jnp.maximum(x @ w + b, 0))
    w5b = jax.jit(lambda x, w1, b1, w2, b2: gelu_tanh(jnp, x @ w1 + b1) @ w2 + b2)
    conv = jax.lax.conv_general_dilated
    cx, wd, wp, w6 = (jnp.asarray(d[k]) for k in ["cx", "wd", "wp", "w6"])
    same = [(1, 1), (1, 1)]
    w6a = jax.jit(lambda x, wd, wp: conv(conv(x, wd, (1, 1), same, feature_group_count=DSC[1]), wp, (1, 1), "VALID"))
    w6b = jax.jit(lambda x, w: conv(x, w, (1, 1), same))
    bx, bw, mean, var, gamma, beta = (jnp.asarray(d[k]) for k in ["bx", "bw", "mean", "var", "gamma", "beta"])

    def cbr(x, w, mean, var, gamma, beta):
        c = conv(x, w, (1, 1), same)
        r = lambda v: v[None, :, None, None]
        return jnp.maximum((c - r(mean)) / jnp.sqrt(r(var) + 1e-5) * r(gamma) + r(beta), 0)

    w7 = jax.jit(cbr)

    class JaxOps:
        @staticmethod
        def conv(v, w, b, stride):
            p = w.shape[2] // 2
            return conv(v, w, (stride, stride), [(p, p), (p, p)]) + b[None, :, None, None]

        relu = staticmethod(lambda v: jnp.maximum(v, 0))
        add = staticmethod(lambda a, b: a + b)
        maxpool = staticmethod(lambda v: jax.lax.reduce_window(
            v, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)]))
        gap = staticmethod(lambda v: v.mean(axis=(2, 3)))
        dense = staticmethod(lambda v, w, b: v @ w + b)

    rx = jnp.asarray(d["rx"])
    r18_params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in d["r18"]]
    r18 = jax.jit(lambda x, params: r18_forward(JaxOps, x, params))
    r50_params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in d["r50"]]
    r50 = jax.jit(lambda x, params: r50_forward(JaxOps, x, params))
    return {
        "resnet18": lambda: ready(r18(rx, r18_params)),
        "resnet50": lambda: ready(r50(rx, r50_params)),
        "W1": lambda: ready(w1(x)),
        "W2a": lambda: ready(w2a(x)),
        "W2b": lambda: ready(w2b(x)),
        "W3": lambda: ready(w3(x, y)),
        "W4a": lambda: ready(w4a(s)),
        "W4b": lambda: ready(w4b(l, g, b)),
        "W5a": lambda: ready(w5a(dx, dw1, db1)),
        "W5b": lambda: ready(w5b(dx, dw1, db1, dw2, db2)),
        "W6a": lambda: ready(w6a(cx, wd, wp)),
        "W6b": lambda: ready(w6b(cx, w6)),
        "W7": lambda: ready(w7(bx, bw, mean, var, gamma, beta)),
    }


def onnx_ops():
    """A fresh class whose ops build an ONNX graph for `r18_forward` / `r50_forward` (the peer
    suite's, and `tools/resnet_layers.py`'s): the nodes go to `nodes`, the weights to `inits`."""
    from onnx import helper, numpy_helper

    def init(name, array):
        return numpy_helper.from_array(array, name)

    class OnnxOps:
        """Builds the graph: each op appends nodes and returns its output's name."""
        nodes, inits, count = [], [], [0]

        @classmethod
        def name(cls, what):
            cls.count[0] += 1
            return f"{what}{cls.count[0]}"

        @classmethod
        def node(cls, op, inputs, **attrs):
            out = cls.name(op.lower())
            cls.nodes.append(helper.make_node(op, inputs, [out], **attrs))
            return out

        @classmethod
        def conv(cls, v, w, b, stride):
            wn, bn = cls.name("w"), cls.name("b")
            cls.inits += [init(wn, w), init(bn, b)]
            p = w.shape[2] // 2
            return cls.node("Conv", [v, wn, bn], strides=[stride, stride], pads=[p] * 4)

        relu = classmethod(lambda cls, v: cls.node("Relu", [v]))
        add = classmethod(lambda cls, a, b: cls.node("Add", [a, b]))
        maxpool = classmethod(lambda cls, v: cls.node("MaxPool", [v], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        gap = classmethod(lambda cls, v: cls.node("Flatten", [cls.node("GlobalAveragePool", [v])]))

        @classmethod
        def dense(cls, v, w, b):
            wn, bn = cls.name("fc"), cls.name("fcb")
            cls.inits += [init(wn, w), init(bn, b)]
            return cls.node("Gemm", [v, wn, bn])

    return OnnxOps


def ort_suite(d):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(THREADS)
    options.inter_op_num_threads = 1

    def session(nodes, inputs, outputs, inits=()):
        graph = helper.make_graph(nodes, "w", inputs, outputs, initializer=list(inits))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def t(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    def c(name, v):
        return helper.make_tensor(name, TensorProto.FLOAT, [], [v])

    def init(name, array):
        return numpy_helper.from_array(array, name)

    flat = [N]
    w1 = session([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Log", ["p"], ["o"])],
                 [t("x", flat)], [t("o", flat)], [c("one", 1.0)])
    w2a = session([helper.make_node("Mul", ["x", "h"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]), helper.make_node("Tanh", ["b"], ["o"])],
                  [t("x", flat)], [t("o", flat)], [c("h", 0.5), c("c", 0.1)])
    w2b = session([helper.make_node("Mul", ["x", "h"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]), helper.make_node("Tanh", ["b"], ["tt"]),
                   helper.make_node("Mul", ["tt", "x"], ["m"]), helper.make_node("Sub", ["m", "d"], ["s"]), helper.make_node("Max", ["s", "z"], ["o"])],
                  [t("x", flat)], [t("o", flat)], [c("h", 0.5), c("c", 0.1), c("d", 0.3), c("z", 0.0)])
    w3 = session([helper.make_node("Mul", ["x", "y"], ["t"]), helper.make_node("Add", ["t", "a"], ["o1"]), helper.make_node("Sub", ["t", "b"], ["o2"])],
                 [t("x", flat), t("y", flat)], [t("o1", flat), t("o2", flat)], [c("a", 0.25), c("b", 0.75)])
    w4a = session([helper.make_node("Softmax", ["x"], ["o"], axis=1)], [t("x", list(SOFTMAX))], [t("o", list(SOFTMAX))])
    w4b = session([helper.make_node("LayerNormalization", ["x", "g", "b"], ["o"], axis=-1, epsilon=1e-5)],
                  [t("x", list(LAYERNORM)), t("g", [LAYERNORM[1]]), t("b", [LAYERNORM[1]])], [t("o", list(LAYERNORM))])
    m, k, n = DENSE
    w5a = session([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]), helper.make_node("Relu", ["hb"], ["o"])],
                  [t("x", [m, k])], [t("o", [m, n])], [init("w", d["dw1"]), init("b", d["db1"])])
    gelu = [helper.make_node("Mul", ["hb", "hb"], ["h2"]), helper.make_node("Mul", ["h2", "hb"], ["h3"]), helper.make_node("Mul", ["h3", "k1"], ["a1"]),
            helper.make_node("Add", ["hb", "a1"], ["a2"]), helper.make_node("Mul", ["a2", "k2"], ["a3"]), helper.make_node("Tanh", ["a3"], ["th"]),
            helper.make_node("Add", ["th", "one"], ["t1"]), helper.make_node("Mul", ["t1", "hb"], ["t2"]), helper.make_node("Mul", ["t2", "half"], ["g"])]
    w5b = session([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"])] + gelu
                  + [helper.make_node("MatMul", ["g", "w2"], ["o1"]), helper.make_node("Add", ["o1", "b2"], ["o"])],
                  [t("x", [m, k])], [t("o", [m, k])],
                  [init("w1", d["dw1"]), init("b1", d["db1"]), init("w2", d["dw2"]), init("b2", d["db2"]),
                   c("k1", 0.044715), c("k2", 0.7978845608028654), c("one", 1.0), c("half", 0.5)])
    nb, ch, hh, ww, cout = DSC
    w6a = session([helper.make_node("Conv", ["x", "wd"], ["dd"], group=ch, pads=[1, 1, 1, 1]), helper.make_node("Conv", ["dd", "wp"], ["o"])],
                  [t("x", [nb, ch, hh, ww])], [t("o", [nb, cout, hh, ww])], [init("wd", d["wd"]), init("wp", d["wp"])])
    w6b = session([helper.make_node("Conv", ["x", "w"], ["o"], pads=[1, 1, 1, 1])],
                  [t("x", [nb, ch, hh, ww])], [t("o", [nb, cout, hh, ww])], [init("w", d["w6"])])
    w7 = session([helper.make_node("Conv", ["x", "w"], ["cc"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", ["cc", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-5),
                  helper.make_node("Relu", ["bn"], ["o"])],
                 [t("x", list(CBR))], [t("o", list(CBR))],
                 [init("w", d["bw"]), init("gamma", d["gamma"]), init("beta", d["beta"]), init("mean", d["mean"]), init("var", d["var"])])
    OnnxOps = onnx_ops()
    logits = r18_forward(OnnxOps, "x", d["r18"])
    r18 = session(OnnxOps.nodes, [t("x", [R18[0], 3, R18[1], R18[1]])], [t(logits, [R18[0], 1000])], OnnxOps.inits)
    OnnxOps.nodes, OnnxOps.inits = [], []
    logits = r50_forward(OnnxOps, "x", d["r50"])
    r50 = session(OnnxOps.nodes, [t("x", [R18[0], 3, R18[1], R18[1]])], [t(logits, [R18[0], 1000])], OnnxOps.inits)
    return {
        "resnet18": lambda: r18.run(None, {"x": d["rx"]}),
        "resnet50": lambda: r50.run(None, {"x": d["rx"]}),
        "W5a": lambda: w5a.run(None, {"x": d["dx"]}),
        "W5b": lambda: w5b.run(None, {"x": d["dx"]}),
        "W6a": lambda: w6a.run(None, {"x": d["cx"]}),
        "W6b": lambda: w6b.run(None, {"x": d["cx"]}),
        "W7": lambda: w7.run(None, {"x": d["bx"]}),
        "W1": lambda: w1.run(None, {"x": d["x"]}),
        "W2a": lambda: w2a.run(None, {"x": d["x"]}),
        "W2b": lambda: w2b.run(None, {"x": d["x"]}),
        "W3": lambda: w3.run(None, {"x": d["x"], "y": d["y"]}),
        "W4a": lambda: w4a.run(None, {"x": d["s"]}),
        "W4b": lambda: w4b.run(None, {"x": d["l"], "g": d["g"], "b": d["b"]}),
    }


def torch_suites(d):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(int(THREADS))
    t = {k: torch.from_numpy(v) for k, v in d.items() if isinstance(v, np.ndarray)}

    def softmax(s):
        return torch.softmax(s, dim=1)

    def layernorm(x, g, b):
        return F.layer_norm(x, (LAYERNORM[1],), g, b, eps=1e-5)

    def cbr(x, w, mean, var, gamma, beta):
        return torch.relu(F.batch_norm(F.conv2d(x, w, padding=1), mean, var, gamma, beta, training=False, eps=1e-5))

    graphs = {
        "W1": (lambda x: torch.log(torch.exp(x) + 1), ["x"]),
        "W2a": (lambda x: torch.tanh(0.5 * x + 0.1), ["x"]),
        "W2b": (lambda x: torch.clamp_min(torch.tanh(x * 0.5 + 0.1) * x - 0.3, 0), ["x"]),
        "W3": (lambda x, y: (lambda p: (p + 0.25, p - 0.75))(x * y), ["x", "y"]),
        "W4a": (softmax, ["s"]),
        "W4b": (layernorm, ["l", "g", "b"]),
        "W5a": (lambda x, w, b: torch.relu(x @ w + b), ["dx", "dw1", "db1"]),
        "W5b": (lambda x, w1, b1, w2, b2: gelu_tanh(torch, x @ w1 + b1) @ w2 + b2, ["dx", "dw1", "db1", "dw2", "db2"]),
        "W6a": (lambda x, wd, wp: F.conv2d(F.conv2d(x, wd, padding=1, groups=DSC[1]), wp), ["cx", "wd", "wp"]),
        "W6b": (lambda x, w: F.conv2d(x, w, padding=1), ["cx", "w6"]),
        "W7": (cbr, ["bx", "bw", "mean", "var", "gamma", "beta"]),
    }

    class TorchOps:
        conv = staticmethod(lambda v, w, b, stride: F.conv2d(v, w, b, stride=stride, padding=w.shape[2] // 2))
        relu = staticmethod(torch.relu)
        add = staticmethod(lambda a, b: a + b)
        maxpool = staticmethod(lambda v: F.max_pool2d(v, 3, 2, 1))
        gap = staticmethod(lambda v: v.mean(dim=(2, 3)))
        dense = staticmethod(lambda v, w, b: v @ w + b)

    r18_params = [(torch.from_numpy(w), torch.from_numpy(b)) for w, b in d["r18"]]
    graphs["resnet18"] = (lambda x: r18_forward(TorchOps, x, r18_params), ["rx"])
    r50_params = [(torch.from_numpy(w), torch.from_numpy(b)) for w, b in d["r50"]]
    graphs["resnet50"] = (lambda x: r50_forward(TorchOps, x, r50_params), ["rx"])

    def run(f, args):
        def go():
            with torch.inference_mode():
                return f(*args)
        return go

    eager = {w: run(f, [t[k] for k in keys]) for w, (f, keys) in graphs.items()}
    compiled = {}
    for w, (f, keys) in graphs.items():
        go = run(torch.compile(f), [t[k] for k in keys])
        start = time.perf_counter()
        go()
        print(f"torch.compile {w}: compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        compiled[w] = go
    return {"torch": eager, "torch.compile": compiled}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kfuse", default="target/release/kfuse")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    d = data()
    suites = {}
    for name, suite in [("numpy", numpy_suite), ("jax.jit", jax_suite), ("onnxruntime", ort_suite), ("torch", torch_suites)]:
        try:
            made = suite(d)
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        suites.update(made if name == "torch" else {name: made})
    env = dict(os.environ, KFUSE_THREADS=THREADS)
    workloads = ["W1", "W2a", "W2b", "W3", "W4a", "W4b", "W5a", "W5b", "W6a", "W6b", "W7", "resnet18", "resnet50"]
    per_round = {name: {} for name in list(suites) + ["kfuse"]}
    reports = []
    for r in range(args.rounds):
        for name, fns in suites.items():
            for w, f in fns.items():
                per_round[name].setdefault(w, []).append(median_ms(f, args.runs))
        # Let the peers' worker threads go idle first: onnxruntime's spin-wait for work after
        # a run, and with two cores a spinning thread halves what kfuse gets (W0's two-thread
        # peak FMA measured 237 GFLOP/s right after the onnxruntime suite, 473 alone).
        time.sleep(2.0)
        # W0 (the bandwidth probe) only in the first round.
        ids = (["W0"] if r == 0 else []) + workloads
        out = subprocess.run([args.kfuse, "bench", "--json"] + ids, capture_output=True, text=True, env=env, check=True)
        report = json.loads(out.stdout)
        reports.append(report)
        for w in report["workloads"]:
            per_round["kfuse"].setdefault(w["id"], []).append(w["fused_ms"])
        for w in report.get("gemm_epilogues", []) + report.get("convolutions", []):
            per_round["kfuse"].setdefault(w["id"], []).append(w["ms"])
        print(f"round {r + 1} of {args.rounds}: done", file=sys.stderr)
    results = {name: {w: min(v) for w, v in ws.items()} for name, ws in per_round.items()}
    peers = [p for p in results if p != "kfuse"]
    print("| workload | kfuse | " + " | ".join(peers) + " | best peer | best peer time / kfuse time |")
    print("|---|---|" + "---|" * len(peers) + "---|---|")
    for w in workloads:
        have = [p for p in peers if w in results[p]]
        best = min(have, key=lambda p: results[p][w]) if have else None
        cells = [f"{results[p][w]:.2f}" if w in results[p] else "-" for p in peers]
        ratio = f"{results[best][w] / results['kfuse'][w]:.2f}" if best else "-"
        print(f"| {w} | {results['kfuse'][w]:.2f} | " + " | ".join(cells) + f" | {best} | {ratio} |")
    print(json.dumps({"median_ms": results, "per_round_ms": per_round, "kfuse_reports": reports}))


if __name__ == "__main__":
    main()
