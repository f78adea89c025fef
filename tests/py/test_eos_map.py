"""mxRec's Dataset.eos_map (dynemb.core.eos): a step limit on one process,
and on several ranks every rank's data ends at the same step."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import dynemb  # noqa: F401  (gives datasets eos_map)
from dynemb.constants.constants import LIBREC_EOS_OPS_SO
from dynemb.util.ops import import_host_pipeline_ops

ROOT = Path(__file__).resolve().parents[2]
SHARDED_LIB = ROOT / "build" / "tf" / "_dynemb_sharded_ops.so"


def _count(ds):
    it = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    out = []
    with tf.compat.v1.Session() as s:
        while True:
            try:
                out.append(s.run(it))
            except tf.errors.OutOfRangeError:
                return out


def test_one_process_limits_the_channels_steps():
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    ds = tf.data.Dataset.range(10)
    assert [int(x) for x in _count(ds.eos_map(librec, 0, 4, 2))] == [0, 1, 2, 3]
    assert [int(x) for x in _count(ds.eos_map(librec, 1, 4, 2))] == [0, 1]
    assert len(_count(ds.eos_map(librec, 0, -1, -1))) == 10
    d = tf.data.Dataset.from_tensor_slices({"a": np.arange(6), "b": np.arange(6) * 2.0})
    got = _count(d.batch(4).eos_map(librec, 0, 0, 0))       # structure kept
    assert [list(g["a"]) for g in got] == [[0, 1, 2, 3], [4, 5]]


def test_bad_arguments_name_themselves():
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    ds = tf.data.Dataset.range(3)
    with pytest.raises(TypeError, match="import_host_pipeline_ops"):
        ds.eos_map("librec_eos_ops.so", 0, 1, 1)
    with pytest.raises(ValueError, match="channel_id must be 0"):
        ds.eos_map(librec, 2, 1, 1)
    with pytest.raises(TypeError, match="max_eval_steps must be an int"):
        ds.eos_map(librec, 1, 3, 2.5)


@pytest.mark.pinned_only
@pytest.mark.skipif(not shutil.which("mpirun") or not SHARDED_LIB.is_file(),
                    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so")
@pytest.mark.parametrize("limit, want", [(-1, 4), (3, 3)])
def test_ranks_end_together(tmp_path, limit, want):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(tmp_path), EOS_LIMIT=str(limit),
               DYNEMB_EXCHANGE_TIMEOUT="20")
    p = subprocess.run(["timeout", "-k", "5", "150", "mpirun", "--oversubscribe",
                        "--allow-run-as-root", "-np", "3", sys.executable,
                        str(ROOT / "tests" / "py" / "mpi" / "eos.py")],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    # rank r has 4 + 2r batches: every rank stops at the shortest (or the limit)
    assert [r["steps"] for r in results] == [[want, want]] * 3
    assert sum(r["rows"] for r in results) == 3 * 3 * want     # each rank's own ids


def test_several_ranks_keep_the_element_structure(monkeypatch):
    """The pipeline built for several ranks (here with the all-reduce
    standing in: the structure is what is checked) gives dicts, tuples and
    namedtuples back as they were."""
    import collections
    from dynemb.core import eos
    monkeypatch.setattr(eos._state, "get_rank_size", lambda: 2)

    class _Ops:
        @staticmethod
        def dynemb_allreduce(tensors, reduction, channel, ranks):
            return [t * 2 for t in tensors]     # both ranks have the element

    monkeypatch.setattr(eos._state, "sharded_ops", lambda: _Ops())
    librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
    P = collections.namedtuple("P", "ids y")
    for ds in (tf.data.Dataset.from_tensor_slices({"a": np.arange(3)}),
               tf.data.Dataset.from_tensor_slices((np.arange(3), np.arange(3.0))),
               tf.data.Dataset.from_tensor_slices(P(np.arange(3), np.arange(3.0))),
               tf.data.Dataset.range(3)):
        out = ds.eos_map(librec, 0, -1, -1)
        assert out.element_spec == ds.element_spec
        assert len(_count(out)) == 3
