"""pytest setup for the TensorFlow tests: graph mode (tf.compat.v1, as in
mxRec scripts), a fresh default graph, a fresh dynemb init and no tables
left over from the previous test.

The suite runs on the pinned TensorFlow 2.15.1 and, from `make test`, once
more on TensorFlow 2.19.1 with the same op library binary
(docs/tensorflow-versions.md). TensorFlow >= 2.16 has no tf.estimator, so
tests that need it are skipped there: mark them `@pytest.mark.estimator`
(a test whose own source mentions `tf.estimator` is marked automatically;
one that reaches Estimator only through a helper needs the marker)."""
import hashlib
import importlib.util
import inspect
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF >= 2.16: tf.compat.v1.layers / tf.keras need Keras 2 (tf-keras), chosen
# by this variable before TensorFlow is imported. Only where tf-keras is
# installed: TF 2.15 honours the variable too and then fails without it.
if importlib.util.find_spec("tf_keras") is not None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import dynemb  # noqa: E402
from dynemb import _lib  # noqa: E402

TF_VERSION = tuple(int(x) for x in tf.__version__.split(".")[:2])
ESTIMATOR_REMOVED = TF_VERSION >= (2, 16)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "estimator: needs tf.estimator (TensorFlow <= 2.15); "
        "skipped on TensorFlow >= 2.16, where it was removed")
    config.addinivalue_line(
        "markers", "pinned_only(reason=...): a test run on the pinned TensorFlow only "
        "(suite time), where what it checks does not depend on the TensorFlow version; "
        "default reason: a multi-rank test (on the compatibility run the 2-rank parity "
        "test checks the same op libraries; the rest tests Python and the engine)")


def _runtime_line() -> str:
    with open(_lib.LIB_PATH, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    built = _lib.LIB_PATH + ".tf-version"
    built_with = open(built).read().strip() if os.path.isfile(built) else "?"
    return ("tensorflow %s; dynemb op library %s (sha256 %s..., built with "
            "TensorFlow %s headers)" % (tf.__version__, _lib.LIB_PATH, digest, built_with))


def pytest_report_header(config):
    return [_runtime_line()]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.get_verbosity() < 0:  # -q hides the header: say it here
        terminalreporter.write_line(_runtime_line())


def _uses_estimator(item) -> bool:
    if item.get_closest_marker("estimator") is not None:
        return True
    fn = getattr(item, "function", None)
    try:
        src = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return False
    return "tf.estimator" in src or "tensorflow_estimator" in src


# Modules whose every test runs under mpirun.
_MPI_MODULES = {"test_sharded_training", "test_sharded_estimator", "test_sharded_faults",
                "test_mpi_launch"}


def pytest_collection_modifyitems(config, items):
    # Multi-rank tests (pinned_only without a reason of their own) run one
    # after the other on one pytest-xdist worker (--dist loadgroup): Open MPI's
    # ranks poll while they wait, and two mpirun jobs at once on a small
    # machine slow each other down far more than they gain.
    for item in items:
        mark = item.get_closest_marker("pinned_only")
        module = item.module.__name__ if item.module is not None else ""
        if (mark is not None and not mark.kwargs.get("reason")) or \
                module in _MPI_MODULES or "two_ranks" in item.name:
            item.add_marker(pytest.mark.xdist_group("mpi"))
    if ESTIMATOR_REMOVED:  # (the compatibility run: TensorFlow >= 2.16)
        for item in items:
            mark = item.get_closest_marker("pinned_only")
            if mark is not None:
                item.add_marker(pytest.mark.skip(reason=mark.kwargs.get("reason") or (
                    "multi-rank test: runs on the pinned TensorFlow (the compatibility "
                    "run keeps the 2-rank parity test)")))
    # Only where TensorFlow itself no longer has Estimator: on 2.15 a missing
    # tf.estimator must fail, not be skipped.
    if not ESTIMATOR_REMOVED:
        return
    skip = pytest.mark.skip(reason=(
        "tf.estimator does not exist in TensorFlow %s (removed in 2.16; the last "
        "tensorflow-estimator is 2.15.0): Estimator tests run on the pinned 2.15.1"
        % tf.__version__))
    for item in items:
        if _uses_estimator(item):
            item.add_marker(skip)


class _EstimatorAwareModule(pytest.Module):
    """A test module that reads tf.estimator at import time (``WS =
    tf.estimator.WarmStartSettings``) cannot even be imported on TensorFlow >=
    2.16: report it as skipped with the reason instead of a collection error.
    Its sess.run tests are then skipped too: keep module level free of
    tf.estimator so that they run on the newer TensorFlow."""

    def collect(self):
        try:
            return super().collect()
        except AttributeError as e:
            if "has no attribute 'estimator'" not in str(e):
                raise
            pytest.skip("%s uses tf.estimator at import time and TensorFlow %s has "
                        "none (removed in 2.16): all its tests skipped here"
                        % (self.path.name, tf.__version__), allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if ESTIMATOR_REMOVED:
        return _EstimatorAwareModule.from_parent(parent, path=module_path)
    return None


@pytest.fixture(autouse=True)
def fresh_dynemb():
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init(use_dynamic_expansion=True)
    yield
    dynemb.terminate_config_initializer()
    dynemb.clear_tables()
    tf.compat.v1.reset_default_graph()
