"""pytest setup for the TensorFlow tests: graph mode (tf.compat.v1, as in
mxRec scripts), a fresh default graph, a fresh dynemb init and no tables
left over from the previous test."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

import dynemb  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynemb():
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init(use_dynamic_expansion=True)
    yield
    dynemb.terminate_config_initializer()
    dynemb.clear_tables()
    tf.compat.v1.reset_default_graph()
