#!/usr/bin/env python3
"""Fit the rational tanh of `kernels::tanh_f32`: tanh(x) ~ x P(x^2) / Q(x^2) on [0, 9], P and Q of degree 4
in x^2 with Q(0) = 1. Weighted least squares on the linearised relative error (x P - tanh(x) (Q - 1) = tanh(x),
divided by tanh(x)), the weights reweighted towards equal ripple; then the f32-rounded coefficients are checked
in f32 arithmetic over [-12, 12]. Needs numpy. Prints the coefficients and the f32 maximum relative error."""
import numpy as np

C = 9.0
DEG = 4


def fit(iters=60):
    x = np.concatenate([np.linspace(1e-4, 1, 4000), np.linspace(1, C, 8000)])
    z, t = x * x, np.tanh(x)
    w = np.ones_like(x)
    for _ in range(iters):
        cols = [x * z**k for k in range(DEG + 1)] + [-t * z**k for k in range(1, DEG + 1)]
        a = np.stack(cols, 1) / t[:, None]
        sol, *_ = np.linalg.lstsq(a * w[:, None], w, rcond=None)
        p, q = sol[: DEG + 1], np.concatenate([[1.0], sol[DEG + 1 :]])
        err = np.abs(x * np.polyval(p[::-1], z) / np.polyval(q[::-1], z) - t) / t
        w = w * np.sqrt(err / err.max()) + 1e-12
        w /= w.max()
    return p, q


def eval_f32(p, q, xs):
    p, q = p.astype(np.float32), q.astype(np.float32)
    x = np.clip(xs.astype(np.float32), np.float32(-C), np.float32(C))
    z = x * x
    num, den = np.full_like(z, p[-1]), np.full_like(z, q[-1])
    for c in p[-2::-1]:
        num = num * z + c
    for c in q[-2::-1]:
        den = den * z + c
    return np.clip(x * num / den, -1, 1)


if __name__ == "__main__":
    p, q = fit()
    xs = np.linspace(-12, 12, 2_000_001)
    xs = xs[xs != 0]
    rel = np.abs(eval_f32(p, q, xs).astype(np.float64) - np.tanh(xs)) / np.abs(np.tanh(xs))
    print("P", [float(np.float32(c)) for c in p])
    print("Q", [float(np.float32(c)) for c in q])
    print("f32 max relative error", rel.max())
