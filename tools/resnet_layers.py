"""ResNet layer by layer: kfuse against onnxruntime, on the same network, weights and input.

    python tools/make_resnet.py DIR --depth 50
    kfuse run DIR/resnet50.kf --inputs-npz DIR/x.npz --constants DIR/weights.npz \\
        --runs 8 --profile DIR/trace.json --output-dir DIR/out
    python tools/resnet_layers.py DIR --depth 50

Runs the network in onnxruntime (two threads, as `tools/bench_peers.py`) with its profiler on,
and prints one table row per kind of convolution (channels in and out, kernel, stride, input
size): how many there are, and their summed median time per run in kfuse (from the trace of
`kfuse run --profile`) and in onnxruntime (its kernels' median over runs 2 to N), the rows
where kfuse loses most first. Each side's fused epilogue (bias, residual, ReLU, the stem's
max pool in kfuse) counts with its convolution. Run the two right after each other: the
figures drift with the machine. Needs numpy, onnx and onnxruntime.
"""
import argparse
import collections
import glob
import json
import os
import re
import statistics
import tempfile

import numpy as np

from bench_peers import THREADS, onnx_ops, r18_forward, r50_forward


def kfuse_layers(program, trace):
    """Milliseconds per convolution signature from a `kfuse run --profile` trace: a step is
    named by the index of its first node in the program, whose line gives the signature."""
    lines = [line for line in open(program) if line.startswith("%")]
    shapes, signature = {}, {}
    for index, line in enumerate(lines):
        name, op, args, rest = re.match(r"%(\w+) = (\w+)\(([^)]*)\)(.*)", line).groups()
        args = [a.strip().lstrip("%") for a in args.split(",") if a.strip()]
        if op == "input":
            shapes[name] = [int(d) for d in re.search(r"\[([\d, ]+)\]", rest).group(1).split(",")]
        elif op == "conv2d":
            x, w = shapes[args[0]], shapes[args[1]]
            stride = int(re.search(r"stride=\[(\d+)", rest).group(1))
            pad = int(re.search(r"padding=\[(\d+)", rest).group(1))
            side = (x[2] + 2 * pad - w[2]) // stride + 1
            shapes[name] = [x[0], w[0], side, side]
            signature[index] = (w[1], w[0], w[2], stride, x[2])
        elif op == "pool2d":
            x = shapes[args[0]]
            shapes[name] = [x[0], x[1], (x[2] - 1) // 2 + 1, (x[3] - 1) // 2 + 1]
        else:
            shapes[name] = shapes.get(args[0], []) if args else []
    times, counts = collections.defaultdict(float), collections.Counter()
    for event in json.load(open(trace))["traceEvents"]:
        step = re.match(r"%(\d+)", event["name"])
        key = signature.get(int(step.group(1)), "other") if step else "other"
        times[key] += event["dur"] / 1e3
        counts[key] += 1
    return times, counts


def onnxruntime_layers(depth, weights, x, runs):
    """Milliseconds per convolution signature (or op name) in onnxruntime's profile."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    arrays = np.load(weights)
    names = list(arrays.files)
    params = [(arrays[w], arrays[b].reshape(-1)) for w, b in zip(names[0::2], names[1::2])]
    ops = onnx_ops()
    logits = (r18_forward if depth == 18 else r50_forward)(ops, "x", params)
    t = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    graph = helper.make_graph(ops.nodes, "resnet", [t("x", list(x.shape))], [t(logits, [x.shape[0], 1000])],
                              initializer=ops.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(THREADS)
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, {"x": x})
    per_node, args = collections.defaultdict(list), {}
    for event in json.load(open(session.end_profiling())):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_node[event["name"]].append(event["dur"] / 1e3)
            args[event["name"]] = event["args"]
    times, counts = collections.defaultdict(float), collections.Counter()
    for node, durations in per_node.items():
        a = args[node]
        if a["op_name"] in ("Conv", "FusedConv"):
            xs, ws = a["input_type_shape"][0]["float"], a["input_type_shape"][1]["float"]
            ys = a["output_type_shape"][0]["float"]
            key = (ws[1], ws[0], ws[2], round(xs[2] / ys[2]), xs[2])
        else:
            key = a["op_name"]
        times[key] += statistics.median(durations[1:] or durations)
        counts[key] += 1
    return times, counts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--depth", type=int, choices=[18, 50], default=18)
    parser.add_argument("--trace", help="kfuse's profile (default DIR/trace.json)")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    program = os.path.join(args.dir, f"resnet{args.depth}.kf")
    kf, kf_counts = kfuse_layers(program, args.trace or os.path.join(args.dir, "trace.json"))
    x = np.load(os.path.join(args.dir, "x.npz"))["x"]
    ort_times, ort_counts = onnxruntime_layers(args.depth, os.path.join(args.dir, "weights.npz"), x, args.runs)
    print(f"kfuse {sum(kf.values()):.1f} ms, onnxruntime {sum(ort_times.values()):.1f} ms (per run, summed steps)\n")
    print("| convolution (in → out, k×k, stride, input side) or op | count | kfuse ms | onnxruntime ms | kfuse − onnxruntime |")
    print("|---|---|---|---|---|")
    for key in sorted(set(kf) | set(ort_times), key=lambda k: ort_times.get(k, 0) - kf.get(k, 0)):
        a, b = kf.get(key, 0.0), ort_times.get(key, 0.0)
        what = f"{key[0]} → {key[1]}, {key[2]}×{key[2]}, /{key[3]}, {key[4]}" if isinstance(key, tuple) else key
        count = kf_counts.get(key) or ort_counts.get(key)
        print(f"| {what} | {count} | {a:.1f} | {b:.1f} | {a - b:+.1f} |")


if __name__ == "__main__":
    main()
