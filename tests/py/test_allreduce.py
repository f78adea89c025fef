"""hccl_ops.allreduce on 3 ranks: sum, mean, prod, max and min of float32,
float64, int32 and int64 tensors equal numpy's reduction of the three ranks'
values, bit for bit on every rank (integers wrap as numpy's do)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARDED_LIB = ROOT / "build" / "tf" / "_dynemb_sharded_ops.so"
RANKS = 3


def _values(rank, dtype):
    base = np.array([3, -2, 7, 1, 40000, -5], np.int64) * (rank + 1) + rank
    if dtype in ("float32", "float64"):
        return (base / 3.0).astype(dtype)
    if dtype == "int64":
        return base * (1 << 40)
    return base.astype(np.int32) * 50000


def _reference(dtype, red):
    parts = [_values(r, dtype) for r in range(RANKS)]
    acc = parts[0].copy()
    with np.errstate(over="ignore"):
        for p in parts[1:]:       # in rank order, as the op reduces
            acc = {"sum": acc + p, "mean": acc + p, "prod": acc * p,
                   "max": np.maximum(acc, p), "min": np.minimum(acc, p)}[red]
    if red == "mean":
        acc = acc / np.array(RANKS, dtype)
    return acc.astype(dtype).reshape([2, 3])


@pytest.mark.pinned_only
@pytest.mark.skipif(not shutil.which("mpirun") or not SHARDED_LIB.is_file(),
                    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so")
def test_every_reduction_and_dtype_on_three_ranks(tmp_path):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(tmp_path))
    p = subprocess.run(["timeout", "-k", "5", "120", "mpirun", "--oversubscribe",
                        "--allow-run-as-root", "-np", str(RANKS), sys.executable,
                        str(ROOT / "tests" / "py" / "mpi" / "reduce.py")],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [np.load(tmp_path / f"{r}.npz") for r in range(RANKS)]
    names = sorted(results[0].files)
    assert len(names) == 18
    for name in names:
        dtype, red = name.rsplit("_", 1)
        want = _reference(dtype, red)
        for r in range(RANKS):
            got = results[r][name]
            assert got.dtype == want.dtype, name
            if dtype.startswith("int") or red in ("max", "min"):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} rank {r}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} rank {r}")
            np.testing.assert_array_equal(got, results[0][name])   # same bits everywhere
