"""Writes ResNet-18 for inference as a kfuse program, with its weights and an input batch:

    python tools/make_resnet18.py DIR [--batch 8] [--size 224]
    kfuse run DIR/resnet18.kf --inputs-npz DIR/x.npz --constants DIR/weights.npz \
        --runs 10 --profile DIR/trace.json --output-dir DIR/out

The network is `kfuse bench resnet18`'s and `tools/bench_peers.py`'s (batchnorms folded into
each convolution's weights and bias, as an inference export leaves them; 1000 logits), with
He-scaled random weights. The last command prints each step's median time over runs 2 to 10,
the per-layer figures of docs/benchmarks.md. Needs numpy only.
"""
import argparse
import os

import numpy as np

from bench_peers import r18_convs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    n, hw = args.batch, args.size
    rng = np.random.default_rng(0)
    lines = [f'%x = input() name="x" : f32[{n}, 3, {hw}, {hw}]']
    weights = {}
    convs = iter(r18_convs())
    count = 0

    def conv(x, stride):
        nonlocal count
        c, co, k, s = next(convs)
        assert s == stride
        count += 1
        w, b, y, p = f"w{count}", f"b{count}", f"c{count}", k // 2
        lines.append(f'%{w} = input() name="{w}" : f32[{co}, {c}, {k}, {k}]')
        lines.append(f'%{b} = input() name="{b}" : f32[{co}, 1, 1]')
        lines.append(f"%{y}r = conv2d(%{x}, %{w}) layout=nchw stride=[{s}, {s}] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups=1")
        lines.append(f"%{y} = add(%{y}r, %{b})")
        weights[w] = (rng.standard_normal((co, c, k, k)) * np.sqrt(2 / (c * k * k))).astype(np.float32)
        weights[b] = (rng.standard_normal((co, 1, 1)) * 0.1).astype(np.float32)
        return y

    lines.append(f"%stem = relu(%{conv('x', 2)})")
    lines.append("%pool = pool2d(%stem) kind=max layout=nchw window=[3, 3] stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] count_include_pad=false")
    x = "pool"
    for stage in range(4):
        for block in range(2):
            s = 2 if stage > 0 and block == 0 else 1
            a = conv(x, s)
            lines.append(f"%{a}a = relu(%{a})")
            b = conv(f"{a}a", 1)
            skip = conv(x, 2) if s == 2 else x
            y = f"s{stage}b{block}"
            lines.append(f"%{y}s = add(%{b}, %{skip})")
            lines.append(f"%{y} = relu(%{y}s)")
            x = y
    lines += [
        f"%gap = reduce_mean(%{x}) axes=[2, 3]",
        '%fc = input() name="fc" : f32[512, 1000]',
        '%fcb = input() name="fcb" : f32[1000]',
        "%l = matmul(%gap, %fc)",
        "%logits = add(%l, %fcb)",
        'output "logits" = %logits',
    ]
    weights["fc"] = (rng.standard_normal((512, 1000)) / np.sqrt(512)).astype(np.float32)
    weights["fcb"] = (rng.standard_normal(1000) * 0.1).astype(np.float32)
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "resnet18.kf"), "w") as f:
        f.write("\n".join(lines) + "\n")
    np.savez(os.path.join(args.dir, "weights.npz"), **weights)
    np.savez(os.path.join(args.dir, "x.npz"), x=rng.standard_normal((n, 3, hw, hw), dtype=np.float32))
    print(f"wrote {args.dir}/resnet18.kf, weights.npz ({len(weights)} arrays) and x.npz")


if __name__ == "__main__":
    main()
