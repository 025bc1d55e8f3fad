"""Generates the numpy fixtures used by kfuse's tests (committed; numpy is not needed to test).

    python tools/make_fixtures.py

* crates/kfuse-cli/tests/programs/<case>/: program.kf, inputs as <name>.npy, and the numpy
  reference for every output as expected/<name>.npy (computed in float64 from the same inputs).
* crates/kfuse-npy/tests/files/: .npy/.npz variants numpy writes (C and Fortran order,
  big-endian, header version 2, every supported dtype, compressed archives) and some it can
  but kfuse does not read.
"""
import io
import os
import shutil

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rng = np.random.default_rng(2026)


def case(name, program, inputs, expected):
    d = os.path.join(ROOT, "crates/kfuse-cli/tests/programs", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "expected"))
    with open(os.path.join(d, "program.kf"), "w") as f:
        f.write(program)
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v)
    for k, v in expected.items():
        np.save(os.path.join(d, "expected", k + ".npy"), v)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def softmax(z, axis):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# 1. A dense layer with the tanh GELU and a softmax.
x, w, b = f32(4, 8), f32(8, 5), f32(5)
case("mlp", """%x = input() name="x" : f32[4, 8]
%w = input() name="w" : f32[8, 5]
%b = input() name="b" : f32[5]
%h = matmul(%x, %w)
%hb = add(%h, %b)
%g = gelu_tanh(%hb)
%m = reduce_max(%g) axes=[1] keepdims=true
%z = sub(%g, %m)
%e = exp(%z)
%s = reduce_sum(%e) axes=[1] keepdims=true
%y = div(%e, %s)
output "y" = %y
output "g" = %g
""", {"x": x, "w": w, "b": b},
     {"g": gelu_tanh(x.astype(np.float64) @ w + b), "y": softmax(gelu_tanh(x.astype(np.float64) @ w + b), 1)})


def conv2d_nchw(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    co, cig, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    oh = (h + pad[0] + pad[1] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[2] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, co, oh, ow))
    cog = co // groups
    for o in range(co):
        g = o // cog
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cig:(g + 1) * cig,
                           i * dil[0]: i * dil[0] + stride[0] * (oh - 1) + 1: stride[0],
                           j * dil[1]: j * dil[1] + stride[1] * (ow - 1) + 1: stride[1]]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return out


# 2. Grouped, strided, dilated, padded convolution in both layouts.
xc, wc = f32(2, 4, 7, 6), f32(6, 2, 3, 3)
ref = conv2d_nchw(xc.astype(np.float64), wc.astype(np.float64), (2, 1), (1, 1, 0, 2), (1, 2), 2)
attrs = "stride=[2, 1] padding=[1, 1, 0, 2] dilation=[1, 2] groups=2"
case("conv_nchw", f"""%x = input() name="x" : f32[2, 4, 7, 6]
%w = input() name="w" : f32[6, 2, 3, 3]
%y = conv2d(%x, %w) layout=nchw {attrs}
output "y" = %y
""", {"x": xc, "w": wc}, {"y": ref})
case("conv_nhwc", f"""%x = input() name="x" : f32[2, 7, 6, 4]
%w = input() name="w" : f32[6, 2, 3, 3]
%y = conv2d(%x, %w) layout=nhwc {attrs}
output "y" = %y
""", {"x": np.ascontiguousarray(xc.transpose(0, 2, 3, 1)), "w": wc}, {"y": ref.transpose(0, 2, 3, 1)})

# 3. Pooling: max with padding, average excluding padding.
xp_ = f32(1, 3, 6, 5)
neg = np.pad(xp_.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
mx = np.stack([[[[neg[0, c, i * 2:i * 2 + 3, j * 2:j * 2 + 3].max() for j in range(3)] for i in range(3)] for c in range(3)]])
zp = np.pad(xp_.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
cnt = np.pad(np.ones((6, 5)), 1)
av = np.stack([[[[zp[0, c, i * 2:i * 2 + 3, j * 2:j * 2 + 3].sum() / cnt[i * 2:i * 2 + 3, j * 2:j * 2 + 3].sum() for j in range(3)] for i in range(3)] for c in range(3)]])
case("pool", """%x = input() name="x" : f32[1, 3, 6, 5]
%mx = pool2d(%x) kind=max layout=nchw window=[3, 3] stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] count_include_pad=false
%av = pool2d(%x) kind=avg layout=nchw window=[3, 3] stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] count_include_pad=false
output "mx" = %mx
output "av" = %av
""", {"x": xp_}, {"mx": mx, "av": av})

# 4. Layer norm in f64, reductions over several axes, batched matmul with broadcast batch dims.
xl, gl, bl = rng.standard_normal((3, 4, 16)), rng.standard_normal(16), rng.standard_normal(16)
mu = xl.mean(-1, keepdims=True)
var = ((xl - mu) ** 2).mean(-1, keepdims=True)
ma, mb = f32(3, 1, 4, 5), f32(2, 5, 6)
case("norm_and_batched", """%x = input() name="x" : f64[3, 4, 16]
%g = input() name="g" : f64[16]
%b = input() name="b" : f64[16]
%mu = reduce_mean(%x) axes=[2] keepdims=true
%d = sub(%x, %mu)
%d2 = mul(%d, %d)
%var = reduce_mean(%d2) axes=[2] keepdims=true
%eps = constant() value=1e-5 : f64[]
%ve = add(%var, %eps)
%r = rsqrt(%ve)
%n = mul(%d, %r)
%ng = mul(%n, %g)
%ln = add(%ng, %b)
%s02 = reduce_sum(%x) axes=[0, 2]
%p = reduce_prod(%x) axes=[2] keepdims=true
%am = argmax(%x) axes=[1, 2]
%ma = input() name="ma" : f32[3, 1, 4, 5]
%mb = input() name="mb" : f32[2, 5, 6]
%mm = matmul(%ma, %mb)
output "ln" = %ln
output "s02" = %s02
output "p" = %p
output "am" = %am
output "mm" = %mm
""", {"x": xl, "g": gl, "b": bl, "ma": ma, "mb": mb},
     {"ln": (xl - mu) / np.sqrt(var + 1e-5) * gl + bl, "s02": xl.sum((0, 2)), "p": xl.prod(2, keepdims=True),
      "am": xl.reshape(3, 64).argmax(1), "mm": ma.astype(np.float64) @ mb.astype(np.float64)})

# 5. Integer arithmetic against numpy's // and %, and comparisons with broadcasting.
ia = rng.integers(-50, 50, (3, 4)).astype(np.int32)
ib = rng.integers(-7, 8, (4,)).astype(np.int32)
ib[ib == 0] = 3
case("integers", """%a = input() name="a" : i32[3, 4]
%b = input() name="b" : i32[4]
%q = div(%a, %b)
%r = rem(%a, %b)
%c = lt(%a, %b)
%m = max(%a, %b)
output "q" = %q
output "r" = %r
output "c" = %c
output "m" = %m
""", {"a": ia, "b": ib}, {"q": ia // ib, "r": ia % ib, "c": ia < ib, "m": np.maximum(ia, ib)})

# 6. Sort, top-k, gather, scatter-add and padding modes against numpy.
xs = f32(3, 7)
xs[0, 2] = xs[0, 5]
idx = rng.integers(-7, 7, (3, 4)).astype(np.int64)
src = f32(3, 4)
sc = np.zeros((3, 7))
for i in range(3):
    for j in range(4):
        sc[i, idx[i, j] % 7] += src[i, j]
order = np.argsort(xs, axis=1, kind="stable")
top = np.argsort(-xs, axis=0, kind="stable")[:2]
xv = f32(4, 5)
case("indexing", """%x = input() name="x" : f32[3, 7]
%i = input() name="i" : i64[3, 4]
%src = input() name="src" : f32[3, 4]
%s = sort(%x) axis=1 descending=false
%t = topk(%x) axis=0 k=2 largest=true
%g = gather(%x, %i) axis=1
%z = constant() value=0.0 : f32[3, 7]
%sa = scatter_add(%z, %i, %src) axis=1
%v = input() name="v" : f32[4, 5]
%pr = pad(%v) low=[2, 1] high=[3, 4] mode=reflect
%pe = pad(%v) low=[0, 2] high=[1, 0] mode=edge
%pc = pad(%v) low=[1, 0] high=[0, 3] mode=constant value=-2.5
output "sorted" = %s
output "order" = %s#1
output "topv" = %t
output "topi" = %t#1
output "g" = %g
output "sa" = %sa
output "pr" = %pr
output "pe" = %pe
output "pc" = %pc
""", {"x": xs, "i": idx, "src": src, "v": xv},
     {"sorted": np.sort(xs, axis=1, kind="stable"), "order": order, "topv": np.take_along_axis(xs, top, 0), "topi": top,
      "g": np.take_along_axis(xs, idx % 7, 1), "sa": sc,
      "pr": np.pad(xv, ((2, 3), (1, 4)), mode="reflect"), "pe": np.pad(xv, ((0, 1), (2, 0)), mode="edge"),
      "pc": np.pad(xv, ((1, 0), (0, 3)), constant_values=-2.5)})

# File-format variants for the .npy reader.
files = os.path.join(ROOT, "crates/kfuse-npy/tests/files")
shutil.rmtree(files, ignore_errors=True)
os.makedirs(files)
base = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
np.save(os.path.join(files, "f32_c.npy"), base)
np.save(os.path.join(files, "f32_fortran.npy"), np.asfortranarray(base))
np.save(os.path.join(files, "f32_big_endian.npy"), base.astype(">f4"))
np.save(os.path.join(files, "f64_big_endian_fortran.npy"), np.asfortranarray(base.astype(">f8")))
with open(os.path.join(files, "f32_v2.npy"), "wb") as f:
    np.lib.format.write_array(f, base, version=(2, 0))
np.save(os.path.join(files, "f16.npy"), np.array([1.0, -0.0, np.inf, 6e-8, 65504], dtype=np.float16))
np.save(os.path.join(files, "i32.npy"), np.array([[-2**31, 2**31 - 1]], dtype=np.int32))
np.save(os.path.join(files, "i64.npy"), np.array([-2**63, 2**63 - 1, 0], dtype=np.int64))
np.save(os.path.join(files, "u8.npy"), np.array([0, 255, 7], dtype=np.uint8))
np.save(os.path.join(files, "bool.npy"), np.array([[True, False], [False, True]]))
np.save(os.path.join(files, "scalar.npy"), np.float64(2.5))
np.save(os.path.join(files, "empty.npy"), np.zeros((0, 3), dtype=np.float32))
np.save(os.path.join(files, "unsupported_i8.npy"), np.array([1, 2], dtype=np.int8))
np.save(os.path.join(files, "unsupported_complex.npy"), np.array([1 + 2j]))
np.save(os.path.join(files, "unsupported_object.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
np.savez(os.path.join(files, "stored.npz"), a=base, b=np.array([1, 2, 3], dtype=np.int64))
np.savez_compressed(os.path.join(files, "compressed.npz"), a=base, flag=np.array([True]))
print("fixtures written")
