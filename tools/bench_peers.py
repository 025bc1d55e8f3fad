"""W1-W4 in peer frameworks and in kfuse, measured in one run on one machine.

    python tools/bench_peers.py [--kfuse target/release/kfuse] [--runs 10]

Peers: numpy (eager), jax.jit, onnxruntime (the models use ORT's fused Softmax and
LayerNormalization ops where ONNX has them). Every framework is limited to two threads. Prints a
Markdown table of median milliseconds and writes the raw numbers as JSON to stdout's last line.
Needs `pip install numpy onnx onnxruntime "jax[cpu]"` in an environment of its own; kfuse's build
and tests never need any of this.
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
    }


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
    return {
        "W1": lambda: ready(w1(x)),
        "W2a": lambda: ready(w2a(x)),
        "W2b": lambda: ready(w2b(x)),
        "W3": lambda: ready(w3(x, y)),
        "W4a": lambda: ready(w4a(s)),
        "W4b": lambda: ready(w4b(l, g, b)),
    }


def ort_suite(d):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

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
    return {
        "W1": lambda: w1.run(None, {"x": d["x"]}),
        "W2a": lambda: w2a.run(None, {"x": d["x"]}),
        "W2b": lambda: w2b.run(None, {"x": d["x"]}),
        "W3": lambda: w3.run(None, {"x": d["x"], "y": d["y"]}),
        "W4a": lambda: w4a.run(None, {"x": d["s"]}),
        "W4b": lambda: w4b.run(None, {"x": d["l"], "g": d["g"], "b": d["b"]}),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kfuse", default="target/release/kfuse")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    d = data()
    results = {}
    for name, suite in [("numpy", numpy_suite), ("jax.jit", jax_suite), ("onnxruntime", ort_suite)]:
        try:
            fns = suite(d)
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        results[name] = {w: median_ms(f, args.runs) for w, f in fns.items()}
        print(f"{name}: done", file=sys.stderr)
    env = dict(os.environ, KFUSE_THREADS=THREADS)
    out = subprocess.run([args.kfuse, "bench", "--json", "W0", "W1", "W2a", "W2b", "W3", "W4a", "W4b"], capture_output=True, text=True, env=env, check=True)
    report = json.loads(out.stdout)
    results["kfuse"] = {w["id"]: w["fused_ms"] for w in report["workloads"]}
    workloads = ["W1", "W2a", "W2b", "W3", "W4a", "W4b"]
    peers = [p for p in results if p != "kfuse"]
    print("| workload | kfuse | " + " | ".join(peers) + " | best peer | best peer time / kfuse time |")
    print("|---|---|" + "---|" * len(peers) + "---|---|")
    for w in workloads:
        best = min(peers, key=lambda p: results[p][w]) if peers else None
        cells = [f"{results[p][w]:.2f}" for p in peers]
        ratio = f"{results[best][w] / results['kfuse'][w]:.2f}" if best else "-"
        print(f"| {w} | {results['kfuse'][w]:.2f} | " + " | ".join(cells) + f" | {best} | {ratio} |")
    print(json.dumps({"median_ms": results, "kfuse_report": report}))


if __name__ == "__main__":
    main()
