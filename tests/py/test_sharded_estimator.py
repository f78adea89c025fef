"""Estimator train / evaluate / predict on several ranks with one model_dir
(tests/py/mpi/estimator.py, with feature admission): 2 and 3 ranks end
with the dense variable, the eval loss and every prediction (of ids that
other ranks own, and ids never trained) of one process, within 1e-5
relative; the checkpoints hold one part of the table per rank and the
Saver's files once. The same with automatic graph modification
(GraphModifierHook) on 2 ranks."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "mpi" / "estimator.py"
SHARDED_LIB = ROOT / "build" / "tf" / "_dynemb_sharded_ops.so"

pytestmark = pytest.mark.skipif(
    not shutil.which("mpirun") or not SHARDED_LIB.is_file(),
    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so "
           "(apt-get install openmpi-bin libopenmpi-dev; make ops)")


def _run(n, d, modify=False, export=None):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(d), DYNEMB_EXCHANGE_TIMEOUT="60",
               MODIFY="1" if modify else "0", EXPORT=str(export or ""))
    cmd = [sys.executable, str(SCRIPT), str(d / "model")]
    if n > 1:
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(n)] + cmd
    p = subprocess.run(["timeout", "-k", "5", "200"] + cmd, cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    if export:
        return []
    return [json.loads((d / ("est-%d.json" % r)).read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    return _run(1, tmp_path_factory.mktemp("one"))[0]


@pytest.mark.estimator
@pytest.mark.parametrize("n", [2, 3])
def test_estimator_on_n_ranks_equals_one_process(n, one, tmp_path):
    for r, got in enumerate(_run(n, tmp_path)):
        assert got["step"] == one["step"] == 6
        for what in ("loss", "w", "logits"):
            np.testing.assert_allclose(got[what], one[what], rtol=1e-5, atol=1e-7,
                                       err_msg="rank %d: %s" % (r, what))
        # the Saver's files, once (event files are named by their time)
        assert [f for f in got["checkpoints"] if "tfevents" not in f] == \
            [f for f in one["checkpoints"] if "tfevents" not in f]
    parts = sorted(os.listdir(tmp_path / "model" / "sparse-model.ckpt-6"))
    assert parts == ["rank-%d-of-%d" % (r, n) for r in range(n)]
    # one SavedModel from the N-rank checkpoint, exported by a one-process
    # run (N = 3) or by the N ranks together (N = 2: rank 0 writes it with
    # every rank's rows); it serves the N-rank run's predictions
    m = 1 if n == 3 else n
    _run(m, tmp_path, export=tmp_path / "export")
    (model,) = os.listdir(tmp_path / "export")
    served = _serve(str(tmp_path / "export" / model), np.random.default_rng(5))
    np.testing.assert_allclose(served, one["logits"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(served, got["logits"], rtol=1e-5, atol=1e-7)


def _serve(model, rng):
    """The exported model's logits for the script's eval ids (drawn as the
    script draws them), through TensorFlow's own loader."""
    import tensorflow as tf
    steps, b = 6, 12
    rng.integers(0, 50, size=(steps * b, 3))
    rng.integers(0, 2, size=(steps * b, 1))
    eval_ids = rng.integers(0, 60, size=(20, 3)).astype(np.int64)
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], model)
        assert not [n.op for n in mg.graph_def.node if n.op.startswith("Dynemb")]
        sig = mg.signature_def["serving_default"]
        return s.run(sig.outputs["logit"].name, {sig.inputs["ids"].name: eval_ids})


@pytest.mark.estimator
def test_estimator_with_graph_modifier_hook_on_two_ranks(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    alone = _run(1, tmp_path / "one", modify=True)[0]
    for r, got in enumerate(_run(2, tmp_path / "two", modify=True)):
        for what in ("loss", "w", "logits"):
            np.testing.assert_allclose(got[what], alone[what], rtol=1e-5, atol=1e-7,
                                       err_msg="rank %d: %s" % (r, what))
