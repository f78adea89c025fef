"""mxRec's module paths answer with mxRec's meaning: the rank queries and the
all-reduce of ``util.communication.hccl_ops`` / ``util.tf_version_adapter``,
the constants, ``version()``. A process started alone is rank 0 of 1 and an
all-reduce is the identity; under an MPI launch the ranks come from the
launch's world (here a stand-in for it; tests/py/test_mpi_launch.py and
test_sharded_training.py run the real one under mpirun), and what does not
work across ranks yet is refused by name (docs/mxrec-compatibility.md)."""
import importlib

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _state

LAUNCHER_VARIABLES = [v for v, _, _ in _state._LAUNCHER_VARIABLES]


@pytest.fixture
def single_process(monkeypatch):
    """No launcher variable set, whatever the environment of the test run."""
    for variable in LAUNCHER_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


RANK_FUNCTIONS = ["get_rank_id", "get_rank_size", "get_local_rank_size"]


# --- util.communication.hccl_ops: ranks -------------------------------------

def test_rank_queries_at_mxrec_paths_answer_one_process(single_process):
    from dynemb.util.communication.hccl_ops import (get_local_rank_size, get_rank_id,
                                                     get_rank_size)
    assert (get_rank_id(), get_rank_size(), get_local_rank_size()) == (0, 1, 1)
    from dynemb.util import initialize
    assert (initialize.get_rank_id(), initialize.get_rank_size()) == (0, 1)


def test_both_paths_are_one_function():
    from dynemb.util import initialize
    from dynemb.util.communication import hccl_ops
    assert hccl_ops.get_rank_id is initialize.get_rank_id is _state.get_rank_id
    assert hccl_ops.get_rank_size is initialize.get_rank_size is _state.get_rank_size
    assert dynemb.get_rank_size is _state.get_rank_size


class _StandInWorld:
    def __init__(self, rank, size, local_size):
        self.rank, self.size, self.local_size = rank, size, local_size

    def allgather(self, channel, payload):
        del channel
        return [payload] * self.size  # every rank asks for the same

    def label_once(self, labels):
        del labels


@pytest.fixture
def launched(single_process):
    """An MPI launch of 4 processes, this one rank 2: the launcher's variable
    and a stand-in for the world that dynemb._comm would join."""
    from dynemb import _comm
    single_process.setenv("OMPI_COMM_WORLD_SIZE", "4")
    single_process.setenv("OMPI_COMM_WORLD_RANK", "2")
    single_process.setattr(_comm, "world", lambda: _StandInWorld(2, 4, 4))
    return single_process


@pytest.mark.parametrize("variable,value", [("HOROVOD_SIZE", "8"), ("HOROVOD_RANK", "5")])
@pytest.mark.parametrize("function", RANK_FUNCTIONS)
def test_a_launcher_that_is_not_mpi_is_refused_naming_the_variable(single_process, variable,
                                                                   value, function):
    from dynemb.util.communication import hccl_ops
    single_process.setenv(variable, value)
    with pytest.raises(RuntimeError) as e:
        getattr(hccl_ops, function)()
    assert "%s=%s" % (variable, value) in str(e.value)
    assert "mpirun" in str(e.value)


def test_under_an_mpi_launch_the_ranks_come_from_the_world(launched):
    from dynemb.util import initialize
    from dynemb.util.communication import hccl_ops
    assert (hccl_ops.get_rank_id(), hccl_ops.get_rank_size(),
            hccl_ops.get_local_rank_size()) == (2, 4, 4)
    assert (initialize.get_rank_id(), initialize.get_rank_size()) == (2, 4)


def test_under_an_mpi_launch_what_is_not_sharded_yet_is_refused(launched):
    with tf.Graph().as_default():
        from dynemb.util.communication import hccl_ops
        dynemb.init()
        dynemb.create_table(tf.int64, 2, "ranked", tf.compat.v1.zeros_initializer())
        with pytest.raises(TypeError, match="mean of integers"):
            hccl_ops.allreduce(tf.ones([2], tf.int32), "mean")
        with pytest.raises(TypeError, match="tensor 0 is bool"):
            hccl_ops.allreduce(tf.ones([2], tf.bool), "max")
        with pytest.raises(ValueError, match="all2all_gradients_op must be one of"):
            dynemb.create_table(tf.int64, 2, "bad", tf.compat.v1.zeros_initializer(),
                                all2all_gradients_op="mean")
    dynemb.terminate_config_initializer()


def test_init_ranks_must_be_the_launch(single_process):
    with pytest.raises(ValueError, match="started alone"):
        dynemb.init(rank_id=0, rank_size=2)


def test_init_ranks_under_a_launch(launched):
    dynemb.init(rank_id=2, rank_size=4)          # the launch's: accepted
    dynemb.terminate_config_initializer()
    with pytest.raises(ValueError, match="rank 2 of 4"):
        dynemb.init(rank_id=1, rank_size=4)


def test_a_world_of_another_size_than_the_launcher_says(single_process):
    """An exchange library of another MPI than the launcher's starts each
    process alone: that must not pass as N independent single workers."""
    from dynemb import _comm
    single_process.setenv("OMPI_COMM_WORLD_SIZE", "2")
    single_process.setattr(_comm, "world", lambda: _StandInWorld(0, 1, 1))
    with pytest.raises(RuntimeError, match="started 2 processes, but the MPI world has 1"):
        _state.get_rank_size()


def test_a_launch_of_one_process_is_rank_0_of_1(single_process):
    """mpirun -np 1 sets the variables to one process: that is dynemb's case."""
    from dynemb.util.communication import hccl_ops
    for variable, value in [("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_RANK", "0"),
                            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"), ("PMI_SIZE", "1"),
                            ("PMI_RANK", "0"), ("PMIX_RANK", "0"), ("HOROVOD_SIZE", "")]:
        single_process.setenv(variable, value)
    assert (hccl_ops.get_rank_id(), hccl_ops.get_rank_size(),
            hccl_ops.get_local_rank_size()) == (0, 1, 1)


def test_a_launcher_variable_that_is_no_number_is_named(single_process):
    from dynemb.util.communication import hccl_ops
    single_process.setenv("PMI_SIZE", "two")
    with pytest.raises(RuntimeError, match=r"PMI_SIZE='two' is not a number"):
        hccl_ops.get_rank_size()


# --- allreduce ---------------------------------------------------------------

def test_tf_version_adapter_hccl_ops_is_the_communication_module():
    from dynemb.util.tf_version_adapter import hccl_ops
    assert hccl_ops is importlib.import_module("dynemb.util.communication.hccl_ops")
    assert hccl_ops.allreduce is not None


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
def test_allreduce_over_one_rank_returns_the_tensor(single_process, reduction):
    from dynemb.util.tf_version_adapter import hccl_ops
    x = tf.constant([[1.5, -2.0], [3.0, 4.0]])
    y = hccl_ops.allreduce(x, reduction)
    assert y.shape == x.shape and y.dtype == x.dtype
    with tf.compat.v1.Session() as sess:
        np.testing.assert_array_equal(sess.run(y), [[1.5, -2.0], [3.0, 4.0]])


def test_allreduce_takes_hccl_keywords_and_dense_gradients(single_process):
    from dynemb.util.tf_version_adapter import hccl_ops
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
    loss = tf.reduce_sum(w * w)
    (grad, var), = tf.compat.v1.train.GradientDescentOptimizer(0.1).compute_gradients(loss)
    reduced = hccl_ops.allreduce(grad, reduction="sum", fusion=0, fusion_id=3,
                                 group="hccl_world_group")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_allclose(sess.run(reduced), [2.0, 4.0])


def test_allreduce_of_indexed_slices_is_unchanged(single_process):
    from dynemb.util.communication import hccl_ops
    s = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 5], tf.int64), tf.constant([9, 3]))
    assert hccl_ops.allreduce(s, "sum") is s


def test_allreduce_errors(single_process):
    from dynemb.util.communication import hccl_ops
    x = tf.constant([1.0])
    with pytest.raises(ValueError, match=r"reduction='average'.*sum, prod, max, min, mean"):
        hccl_ops.allreduce(x, "average")
    with pytest.raises(ValueError, match=r"fusion=3"):
        hccl_ops.allreduce(x, "sum", fusion=3)
    with pytest.raises(ValueError, match=r"fusion_id='a'"):
        hccl_ops.allreduce(x, "sum", fusion_id="a")
    with pytest.raises(ValueError, match=r"group='my_group'.*hccl_world_group"):
        hccl_ops.allreduce(x, "sum", group="my_group")


# --- constants ---------------------------------------------------------------

def test_constants_at_mxrec_path():
    from dynemb.constants.constants import (ASCEND_TIMESTAMP, LIBASC_OPS_SO, LIBREC_EOS_OPS_SO,
                                            All2allGradientsOp, BaseEnum, CacheModeEnum)
    assert ASCEND_TIMESTAMP == "ASCEND_TIMESTAMP"
    assert (LIBASC_OPS_SO, LIBREC_EOS_OPS_SO) == ("libasc_ops.so", "librec_eos_ops.so")
    assert [(m.name, m.value) for m in CacheModeEnum] == [("HBM", "HBM"), ("DDR", "DDR"),
                                                         ("SSD", "SSD")]
    assert [(m.name, m.value) for m in All2allGradientsOp] == [
        ("SUM_GRADIENTS", "sum_gradients"),
        ("SUM_GRADIENTS_AND_DIV_BY_RANKSIZE", "sum_gradients_and_div_by_ranksize")]
    assert issubclass(CacheModeEnum, BaseEnum) and issubclass(All2allGradientsOp, BaseEnum)


def test_base_enum_mapping_has_mxrecs_meaning():
    from dynemb.constants.constants import (All2allGradientsOp, ApplyGradientsStrategy,
                                            BaseEnum, CacheModeEnum)

    class Mode(BaseEnum):
        TRAIN = "train"
        PREDICT = "predict"

    class OtherMode(BaseEnum):
        TRAIN = "train"

    assert Mode.mapping("train") is Mode.TRAIN
    assert Mode.mapping(Mode.PREDICT) is Mode.PREDICT
    # a member stands for its value, whichever enum it belongs to
    assert Mode.mapping(OtherMode.TRAIN) is Mode.TRAIN
    assert CacheModeEnum.mapping("SSD") is CacheModeEnum.SSD
    assert (All2allGradientsOp.mapping("sum_gradients_and_div_by_ranksize")
            is All2allGradientsOp.SUM_GRADIENTS_AND_DIV_BY_RANKSIZE)
    # by value only: the member's name is no key, and a miss is a KeyError
    for bad in ["TRAIN", None, "evaluate"]:
        with pytest.raises(KeyError, match=r"not a value of Mode.*'train', 'predict'"):
            Mode.mapping(bad)
    with pytest.raises(KeyError):
        ApplyGradientsStrategy.mapping("DIRECT_APPLY")


# --- version -----------------------------------------------------------------

def test_version_is_the_package_version():
    assert dynemb.version() == dynemb.__version__
    assert isinstance(dynemb.version(), str) and dynemb.version().count(".") >= 1
    import importlib.metadata
    try:
        installed = importlib.metadata.version("dynemb")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None:
        assert dynemb.version() == installed


# --- docs/mxrec-compatibility.md ---------------------------------------------

def test_compatibility_table_counts_match_its_rows():
    """Every row of the documented-API sections has one of the status words,
    and the Counts line says how many rows have each."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "mxrec-compatibility.md").read_text()
    documented = text.split("\n## 1.", 1)[1].split("\n## 10.", 1)[0]
    counts = {"same": 0, "no effect": 0, "different": 0, "missing (planned)": 0}
    rows = [l for l in documented.splitlines()
            if l.startswith("| ") and not l.startswith("| Item")]
    for row in rows:
        status = row.rstrip(" |").rsplit(" | ", 1)[-1]
        m = re.match(r"\*\*(same \(no effect\)|same|different|missing \(planned\))\*\*", status)
        assert m, "row without a status word: " + row
        word = m.group(1)
        counts["same" if word.startswith("same") else word] += 1
        counts["no effect"] += word == "same (no effect)"
    said = re.search(r"Documented items \(§1-§9\): (\d+) — \*\*(\d+) same\*\* \((\d+) of them "
                     r"\"same \(no effect\)\"\), \*\*(\d+) different\*\*,\s+\*\*(\d+) missing "
                     r"\(planned\)\*\*", text)
    assert said, "the Counts line is missing or has another form"
    assert [int(x) for x in said.groups()] == [len(rows), counts["same"], counts["no effect"],
                                                counts["different"],
                                                counts["missing (planned)"]]


@pytest.mark.parametrize("env, level", [({"MXREC_LOG_LEVEL": "debug"}, "DEBUG"),
                                        ({"MXREC_LOG_LEVEL": "debug",
                                          "DYNEMB_LOG_LEVEL": "warning"}, "WARNING"),
                                        ({}, "INFO")])
def test_log_level_from_mxrecs_variable(env, level):
    # A fresh interpreter: the logger reads the environment when dynemb loads.
    import os
    import subprocess
    import sys
    run_env = {k: v for k, v in os.environ.items()
               if k not in ("MXREC_LOG_LEVEL", "DYNEMB_LOG_LEVEL")}
    run_env.update(env)
    out = subprocess.run([sys.executable, "-c", "import logging; from dynemb.util.log import "
                          "logger; print(logging.getLevelName(logger.level))"],
                         env=run_env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == level, out.stderr


def test_user_defined_sparse_optimizers_are_refused_by_name():
    from dynemb.optimizers.base import CustomizedOptimizer
    with pytest.raises(TypeError, match="MyRule subclasses CustomizedOptimizer.*lazy_adam"):
        class MyRule(CustomizedOptimizer):  # noqa: F841
            pass


def test_merge_lookup_leaves_one_gradient_per_table():
    # Two lookups of a table: dynemb's sparse variable already gives one
    # gradient over both, before and after do_merge_lookup.
    from dynemb.graph.merge_lookup import do_merge_lookup
    t = dynemb.create_table(tf.int64, 2, "merged", tf.compat.v1.ones_initializer())
    a = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
    b = dynemb.sparse_lookup(t, tf.constant([2, 3], tf.int64))
    do_merge_lookup(is_train=True)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    (g,) = tf.gradients(tf.reduce_sum(a) + tf.reduce_sum(b), sparse)
    with tf.compat.v1.Session() as s:
        idx = s.run(g.indices)
    assert sorted(idx.tolist()) == [1, 2, 2, 3]
    with pytest.raises(TypeError, match="is_train"):
        do_merge_lookup(is_train="yes")


# --- what mxRec's example scripts import (issue 14's audit of examples/) ---------

def test_example_import_paths(single_process):
    """The names mxRec's examples (DCNv2, WideDeep, dlrm, mmoe, the demos)
    reach, at their paths after the prefix edit."""
    import subprocess
    import sys
    # `import mx_rec.util as mxrec_util; mxrec_util.communication.hccl_ops...`
    # in a fresh interpreter, where nothing imported the subpackage before.
    code = ("import dynemb.util as mxrec_util; "
            "print(mxrec_util.communication.hccl_ops.get_rank_id(), "
            "mxrec_util.communication.hccl_ops.get_rank_size())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                           if k not in LAUNCHER_VARIABLES})
    assert out.returncode == 0 and out.stdout.split() == ["0", "1"], out.stderr[-2000:]
    from dynemb.core.asc import feature_spec, helper
    assert helper.FeatureSpec is feature_spec.FeatureSpec
    from dynemb.constants.constants import LIBREC_TF_REC_V1_CPU_SO
    from dynemb.util.ops import import_host_pipeline_ops
    assert import_host_pipeline_ops(LIBREC_TF_REC_V1_CPU_SO).return_timestamp
    dynemb.init()
    from dynemb.util.initialize import ConfigInitializer
    assert ConfigInitializer.get_instance().host_pipeline_ops is import_host_pipeline_ops()
    from dynemb.util.tf_version_adapter import npu_ops
    x = npu_ops.dropout(tf.ones([4000]), keep_prob=0.75, seed=1)
    with tf.compat.v1.Session() as s:
        v = s.run(x)
    assert set(np.unique(v).tolist()) <= {0.0, np.float32(1 / 0.75)}
    assert 0.2 < (v == 0).mean() < 0.3
    with pytest.raises(ValueError, match="keep_prob"):
        npu_ops.dropout(tf.ones([2]))
