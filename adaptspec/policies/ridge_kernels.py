"""Compiled kernels for the hot path of :class:`~adaptspec.policies.ridge.RidgeArms`.

A LinUCB decision plus update is a handful of tiny array operations (K * D^2 multiply-adds,
with K = 9 and D = 65 about 38 k). In numpy each is a separate call of ~0.5 us, so Python
overhead, not arithmetic, sets the cost. These kernels do the feature map, a decision (means, variances and UCB
scores of every arm, with the best arm) and a Sherman-Morrison update in one compiled call
each. They are compiled with numba when it is installed (``pip install 'adaptspec[fast]'``);
without it :data:`AVAILABLE` is False and ``RidgeArms`` runs the same arithmetic in numpy.
Set ``ADAPTSPEC_NUMBA=0`` (before import) or ``AVAILABLE = False`` to force the numpy path. ``tests/test_ridge_kernels.py`` checks that both
paths compute the same statistics and make the same choices. Compiled code is cached on disk where
numba can write (see ``_jit``); where it cannot (a read-only install, an unwritable home), the
kernels are compiled in memory instead.

The buffer layout is ``RidgeArms._buf``: ``A^-1`` of every arm stacked as ``K * D`` rows,
then the ``K`` rows of ``theta``; each row starts on a 64-byte cache line and is padded to a
multiple of 8 doubles (:func:`cache_aligned_rows`). The kernels read the first ``D`` values of a
row. Aligned rows make the decision faster with AVX-512: no load straddles two lines.
"""

from __future__ import annotations

import math
import os

import numpy as np

__all__ = ["AVAILABLE", "warm_up", "cache_aligned_rows", "standardize", "mean_var_score", "sherman_morrison"]

try:
    import numba
except ImportError:  # the optional extra is not installed: numpy path
    numba = None

#: whether the kernels below exist (numba installed and not switched off)
AVAILABLE = numba is not None and os.environ.get("ADAPTSPEC_NUMBA", "1") != "0"

if AVAILABLE:
    # reassociation lets the compiler vectorise the dot products (numpy's BLAS reorders too)
    _OPTIONS = dict(nogil=True, fastmath={"reassoc", "contract", "nsz"})

    def _jit(f):
        """``numba.njit`` with the on-disk cache where numba finds a place for it: the
        ``__pycache__`` beside this file, else the user's cache directory (``NUMBA_CACHE_DIR``,
        else under ``HOME``). A read-only install run by a user whose home is not writable has
        neither, and ``cache=True`` raises there ("no locator available"): the kernels are then
        compiled in memory, once per process (~0.7 s, paid by :func:`warm_up`)."""
        try:
            return numba.njit(cache=True, **_OPTIONS)(f)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return numba.njit(cache=False, **_OPTIONS)(f)

    @_jit
    def standardize(x, mean, inv, z):  # pragma: no cover - compiled
        """``z = (x - mean) * inv``, with a trailing 1 when ``z`` is one longer than ``x``
        (the intercept). Writes into ``z``: returning a new array costs more than the arithmetic."""
        d = x.shape[0]
        for i in range(d):
            z[i] = (x[i] - mean[i]) * inv[i]
        if z.shape[0] > d:
            z[d] = 1.0

    @_jit
    def _dot(x, y, d):  # pragma: no cover - compiled
        s = 0.0
        for j in range(d):
            s += x[j] * y[j]
        return s

    @_jit
    def _arm_times(buf, arm, d, phi, out):  # pragma: no cover - compiled
        """``out = A_arm^-1 phi``."""
        base = arm * d
        for i in range(d):
            out[i] = _dot(buf[base + i], phi, d)

    @_jit
    def mean_var_score(buf, k, d, phi, width, out, u):  # pragma: no cover - compiled
        """Rows of ``out`` (3, K): ``theta_a . phi``, ``max(phi^T A_a^-1 phi, 0)`` and the UCB
        score ``mu + width * sqrt(var)``; the first K rows of ``u`` (K + 1, D): ``A_a^-1 phi``
        (for the update); its last row, a copy of ``phi`` on a cache line (``phi`` may not be).
        Returns the best arm and how many arms tie with it."""
        x = u[k]
        for j in range(d):
            x[j] = phi[j]
        phi = x
        best, ties = 0, 0
        for a in range(k):
            _arm_times(buf, a, d, phi, u[a])
            m = _dot(buf[k * d + a], phi, d)
            var = max(_dot(u[a], phi, d), 0.0)  # rounding can take it just below 0
            score = m + width * math.sqrt(var)
            out[0, a], out[1, a], out[2, a] = m, var, score
            if a == 0 or score > out[2, best]:
                best, ties = a, 1
            elif score == out[2, best]:
                ties += 1
        return best, ties

    @_jit
    def sherman_morrison(buf, k, d, arm, phi, r, u, fresh):  # pragma: no cover - compiled
        """Add ``(phi, r)`` to ``arm``: ``A^-1 -= u u^T / h``, ``theta += u (r - theta.phi) / h``,
        with ``u = A^-1 phi`` (computed into ``u`` unless ``fresh``), ``h = 1 + phi.u``.
        Returns the error ``r - theta.phi`` before the update."""
        if not fresh:
            _arm_times(buf, arm, d, phi, u)
        th = buf[k * d + arm]
        h = 1.0 + _dot(phi, u, d)
        m = _dot(th, phi, d)
        c = (r - m) / h
        g = -1.0 / h
        base = arm * d
        for i in range(d):
            row = buf[base + i]
            ui = g * u[i]
            for j in range(d):
                row[j] += ui * u[j]
            th[i] += c * u[i]
        return r - m
else:
    standardize = mean_var_score = sherman_morrison = None

_LINE = 64  # bytes in a cache line


def cache_aligned_rows(n: int, d: int) -> np.ndarray:
    """Zeros of shape ``(n, stride)``, ``stride`` = ``d`` rounded up to a cache line of doubles,
    with every row starting on a cache line. Use the first ``d`` columns.

    >>> a = cache_aligned_rows(3, 5)
    >>> a.shape, a.ctypes.data % 64, a[1:].ctypes.data % 64
    ((3, 8), 0, 0)
    """
    per_line = _LINE // 8
    stride = -(-d // per_line) * per_line
    raw = np.zeros(n * stride + per_line)
    start = (-raw.ctypes.data % _LINE) // 8
    return raw[start : start + n * stride].reshape(n, stride)


_warm = False


def warm_up() -> None:
    """Compile the kernels now (or load them from numba's on-disk cache: ~0.1 s; compiling takes
    ~0.7 s the first time), so that no decision pays for it. Policies call it when
    they are built; later calls return at once."""
    global _warm
    if _warm or not AVAILABLE:
        return
    buf = np.vstack([np.eye(2), np.zeros((1, 2))])  # one arm, two features
    phi = np.empty(2)
    standardize(np.ones(2), np.zeros(2), np.ones(2), phi)
    u = cache_aligned_rows(2, 2)
    mean_var_score(buf, 1, 2, phi, 1.0, np.empty((3, 1)), u)
    sherman_morrison(buf, 1, 2, 0, phi, 1.0, u[0], True)
    sherman_morrison(buf, 1, 2, 0, phi, 1.0, u[0], False)
    _warm = True
