"""Fits the polynomial coefficients of kfuse's f32 erf/erfc (crates/kfuse-math/src/erf.rs).

Run with numpy and mpmath installed (not needed to build or test kfuse):

    python tools/fit_erf.py

Two pieces, both least-squares fits at Chebyshev nodes against 50-digit mpmath references:
  * small |x| < 1:  erf(x) = x * P(x^2), fitted for relative error;
  * y >= 1, t = 1/y: log(erfc(y)) + y^2 + log(y) = Q(t), fitted for absolute error, so that
    erfc(y) = exp(-y^2) * exp(Q(1/y)) / y has that much relative error.
The coefficients are printed as f64 together with the fit error of f64 evaluation; kfuse
evaluates these pieces in f64 and rounds the final result to f32 once.
"""
import mpmath
import numpy as np

mpmath.mp.dps = 50


def fit(fun, lo, hi, degree, weight):
    n = 400
    nodes = [(lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n) for k in range(n)]
    rows = []
    rhs = []
    for u in nodes:
        w = weight(u)
        rows.append([mpmath.mpf(u) ** j * w for j in range(degree + 1)])
        rhs.append(fun(mpmath.mpf(u)) * w)
    a = mpmath.matrix(rows)
    b = mpmath.matrix(rhs)
    coeffs = mpmath.lu_solve(a.T * a, a.T * b)
    return [float(c) for c in coeffs]


def horner(coeffs, u):
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * u + c
    return acc


def report(name, coeffs, fun, lo, hi, relative):
    worst = 0.0
    for u in np.linspace(lo, hi, 20001):
        got = horner(coeffs, float(u))
        want = float(fun(mpmath.mpf(float(u))))
        err = abs(got - want) / (abs(want) if relative else 1.0)
        worst = max(worst, err)
    print(f"// {name}: degree {len(coeffs) - 1}, max {'relative' if relative else 'absolute'} error in f64 {worst:.3e}")
    print("[" + ", ".join(repr(float(c)) for c in coeffs) + "]")


def erf_over_x(z):
    x = mpmath.sqrt(z)
    return mpmath.erf(x) / x if x != 0 else 2 / mpmath.sqrt(mpmath.pi)


def erfc_tail(t):
    y = 1 / t
    return mpmath.log(mpmath.erfc(y)) + y * y + mpmath.log(y)


small = fit(erf_over_x, 0.0, 1.0, 9, lambda z: 1 / erf_over_x(mpmath.mpf(z)))
report("erf small P(z), z = x^2 in [0, 1]", small, erf_over_x, 0.0, 1.0, True)
tail = fit(erfc_tail, 1 / 10.1, 1.0, 16, lambda t: 1)
report("erfc tail Q(t), t = 1/y in [1/10.1, 1]", tail, erfc_tail, 1 / 10.1, 1.0, False)
