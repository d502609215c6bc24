"""The compiled ridge kernels work on a read-only install run by a user whose home is not writable
(issue 38, item 8: ``cannot cache function 'standardize': no locator available``).

The kernels' module is copied into a directory nobody may write (no ``__pycache__`` can be made
beside it) and imported in a subprocess whose ``HOME`` is not writable either, with no
``NUMBA_CACHE_DIR``: numba then has no place for its cache. Run as root, the subprocess gives up
the capabilities that let root write anywhere (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``), so
the permissions bind it as they bind a user. The subprocess first shows that numba's own
``cache=True`` fails there (the test's premise), then runs every kernel; the parent checks the
results against closed forms computed here in numpy: the standardised vector, each arm's mean,
variance and UCB score, and the Sherman-Morrison update against a fresh inverse of
``A + phi phi^T`` and ``theta = A^-1 b``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np

from adaptspec.policies import ridge_kernels

KERNELS = Path(ridge_kernels.__file__)

CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
try:
    import probe  # noqa: F401  - numba.njit(cache=True) on a function of this read-only directory
    premise = "numba cached"
except RuntimeError as e:
    premise = str(e)
import ridge_kernels as rk
assert rk.AVAILABLE
inp = json.loads(sys.stdin.read())
k, d = inp["k"], inp["d"]
x, mean, inv = (np.array(inp[n]) for n in ("x", "mean", "inv"))
phi = np.empty(d)
rk.standardize(x, mean, inv, phi)
buf = rk.cache_aligned_rows(k * d + k, d)
buf[:k * d, :d] = np.array(inp["ainv"]).reshape(k * d, d)
buf[k * d:, :d] = np.array(inp["theta"])
out = np.empty((3, k))
u = rk.cache_aligned_rows(k + 1, d)
best, ties = rk.mean_var_score(buf, k, d, phi, inp["width"], out, u)
err = rk.sherman_morrison(buf, k, d, inp["arm"], phi, inp["r"], u[inp["arm"]], True)
print(json.dumps({"premise": premise, "phi": phi.tolist(), "out": out.tolist(), "best": int(best),
                  "err": float(err), "ainv": buf[:k * d, :d].tolist(), "theta": buf[k * d:, :d].tolist()}))
"""

PROBE = "import numba\n\n\n@numba.njit(cache=True)\ndef one(x):\n    return x + 1\n"


def _as_a_user() -> None:
    """In the child, before exec: root gives up overriding file permissions (PR_CAPBSET_DROP)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_the_kernels_compile_without_a_cache_locator_and_compute_the_closed_forms(tmp_path):
    ro, home = tmp_path / "install", tmp_path / "home"
    ro.mkdir()
    home.mkdir()
    shutil.copy(KERNELS, ro / "ridge_kernels.py")
    (ro / "probe.py").write_text(PROBE)
    read_only = stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    for p in (ro, home):
        p.chmod(read_only)

    rng = np.random.default_rng(7)
    k, d = 3, 5
    x, mean, inv = rng.normal(size=d - 1), rng.normal(size=d - 1), rng.uniform(0.5, 2.0, size=d - 1)
    a = [np.eye(d) * 0.7 + (m := rng.normal(size=(d, 2))) @ m.T for _ in range(k)]
    b = [rng.normal(size=d) for _ in range(k)]
    ainv = np.concatenate([np.linalg.inv(ai) for ai in a])
    theta = np.stack([np.linalg.inv(ai) @ bi for ai, bi in zip(a, b)])
    arm, r, width = 1, 0.9, 0.8
    inp = {
        "k": k,
        "d": d,
        "x": x.tolist(),
        "mean": mean.tolist(),
        "inv": inv.tolist(),
        "ainv": ainv.tolist(),
        "theta": theta.tolist(),
        "width": width,
        "arm": arm,
        "r": r,
    }
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(ro)],
        input=json.dumps(inp),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=home,
        preexec_fn=_as_a_user,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    assert "no locator available" in got["premise"], got["premise"]  # numba alone would fail here
    assert not list(ro.rglob("*.nbi")) and not list(home.rglob("*.nbi"))  # and nothing was cached

    phi = np.append((x - mean) * inv, 1.0)
    np.testing.assert_allclose(got["phi"], phi, rtol=1e-12)
    mu = theta @ phi
    var = np.array([phi @ np.linalg.inv(ai) @ phi for ai in a])
    score = mu + width * np.sqrt(var)
    np.testing.assert_allclose(got["out"], [mu, var, score], rtol=1e-9)
    assert got["best"] == int(np.argmax(score))
    assert abs(got["err"] - (r - mu[arm])) < 1e-9
    a_new = a[arm] + np.outer(phi, phi)
    np.testing.assert_allclose(
        np.array(got["ainv"])[arm * d : (arm + 1) * d], np.linalg.inv(a_new), rtol=1e-8, atol=1e-12
    )
    np.testing.assert_allclose(
        got["theta"][arm], np.linalg.inv(a_new) @ (b[arm] + r * phi), rtol=1e-8, atol=1e-12
    )
    others = [j for j in range(k) if j != arm]
    np.testing.assert_allclose(np.array(got["theta"])[others], theta[others], rtol=0, atol=0)
