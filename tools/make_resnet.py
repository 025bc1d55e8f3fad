"""Writes ResNet-18 or ResNet-50 for inference as a kfuse program, with its weights and an input
batch:

    python tools/make_resnet.py DIR [--depth 18|50] [--batch 8] [--size 224] [--layout nchw|nhwc]
    kfuse run DIR/resnet18.kf --inputs-npz DIR/x.npz --constants DIR/weights.npz \
        --runs 10 --profile DIR/trace.json --output-dir DIR/out

The network is `kfuse bench resnet18`'s (or `resnet50`'s) and `tools/bench_peers.py`'s, built
from the peer script's own definition (`r18_forward`, `r50_forward`) through ops that write
kfuse's text IR: batchnorms folded into each convolution's weights and bias, as an inference
export leaves them; 1000 logits; He-scaled random weights. The `kfuse run` command prints each
step's median time over runs 2 to 10, the per-layer figures of docs/benchmarks.md. With
`--layout nhwc` the activations (and the input batch, the same values transposed) are NHWC, as
a TensorFlow export writes them: `kfuse run` runs it in NCHW (the layout assignment), and
`kfuse run --keep-layouts` as written. Needs numpy only.
"""
import argparse
import os

import numpy as np

from bench_peers import r18_convs, r18_forward, r50_convs, r50_forward


class TextOps:
    """Each op appends lines of kfuse's text IR and returns its result's name."""

    def __init__(self, layout="nchw"):
        self.lines, self.weights, self.count = [], {}, 0
        self.layout = layout

    def name(self, what):
        self.count += 1
        return f"{what}{self.count}"

    def conv(self, v, w, b, stride):
        co, c, k, _ = w.shape
        wn, bn, y, p = self.name("w"), self.name("b"), self.name("c"), k // 2
        # The bias broadcasts along the channel axis: [C, 1, 1] in NCHW, [C] in NHWC.
        bias = [co, 1, 1] if self.layout == "nchw" else [co]
        self.weights[wn], self.weights[bn] = w, b.reshape(bias)
        self.lines += [
            f'%{wn} = input() name="{wn}" : f32[{co}, {c}, {k}, {k}]',
            f'%{bn} = input() name="{bn}" : f32{bias}',
            f"%{y}r = conv2d(%{v}, %{wn}) layout={self.layout} stride=[{stride}, {stride}] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups=1",
            f"%{y} = add(%{y}r, %{bn})",
        ]
        return y

    def op(self, line):
        y = self.name("v")
        self.lines.append(f"%{y} = {line}")
        return y

    def relu(self, v):
        return self.op(f"relu(%{v})")

    def add(self, a, b):
        return self.op(f"add(%{a}, %{b})")

    def maxpool(self, v):
        return self.op(f"pool2d(%{v}) kind=max layout={self.layout} window=[3, 3] stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] count_include_pad=false")

    def gap(self, v):
        axes = [2, 3] if self.layout == "nchw" else [1, 2]
        return self.op(f"reduce_mean(%{v}) axes={axes}")

    def dense(self, v, w, b):
        self.weights["fc"], self.weights["fcb"] = w, b
        self.lines += [
            f'%fc = input() name="fc" : f32[{w.shape[0]}, {w.shape[1]}]',
            f'%fcb = input() name="fcb" : f32[{b.shape[0]}]',
        ]
        return self.add(self.op(f"matmul(%{v}, %fc)"), "fcb")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--depth", type=int, choices=[18, 50], default=18)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--layout", choices=["nchw", "nhwc"], default="nchw")
    args = parser.parse_args()
    n, hw = args.batch, args.size
    convs, forward = (r18_convs(), r18_forward) if args.depth == 18 else (r50_convs(), r50_forward)
    rng = np.random.default_rng(0)
    params = [((rng.standard_normal((co, c, k, k)) * np.sqrt(2 / (c * k * k))).astype(np.float32),
               (rng.standard_normal(co) * 0.1).astype(np.float32)) for c, co, k, _ in convs]
    width = convs[-1][1]
    params.append(((rng.standard_normal((width, 1000)) / np.sqrt(width)).astype(np.float32),
                   (rng.standard_normal(1000) * 0.1).astype(np.float32)))
    ops = TextOps(args.layout)
    dims = [n, 3, hw, hw] if args.layout == "nchw" else [n, hw, hw, 3]
    ops.lines.append(f'%x = input() name="x" : f32{dims}')
    logits = forward(ops, "x", params)
    ops.lines.append(f'output "logits" = %{logits}')
    name = f"resnet{args.depth}"
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, f"{name}.kf"), "w") as f:
        f.write("\n".join(ops.lines) + "\n")
    np.savez(os.path.join(args.dir, "weights.npz"), **ops.weights)
    x = rng.standard_normal((n, 3, hw, hw), dtype=np.float32)
    if args.layout == "nhwc":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    np.savez(os.path.join(args.dir, "x.npz"), x=x)
    print(f"wrote {args.dir}/{name}.kf, weights.npz ({len(ops.weights)} arrays) and x.npz")


if __name__ == "__main__":
    main()
