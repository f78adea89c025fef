"""The bottom layer's table handles, and the checks Python leaves to the engine."""
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib
from dynemb.optimizers import adagrad, ftrl, lazy_adam


class _CountingLib:
    """The engine binding, counting the references given back."""

    def __init__(self, clib):
        self._clib = clib
        self.released = 0

    def __getattr__(self, name):
        return getattr(self._clib, name)

    def dynemb_table_release(self, h):
        self.released += 1
        self._clib.dynemb_table_release(h)


def _table(name="h", **kw):
    return dynemb.create_table(tf.int64, 2, name, tf.compat.v1.zeros_initializer(), **kw)


def test_table_handle_releases_on_exit_and_on_error(monkeypatch):
    _table()
    counting = _CountingLib(_lib.clib)
    monkeypatch.setattr(_lib, "clib", counting)
    with _lib.table_handle("h") as h:
        assert _lib.clib.dynemb_table_dim(h) == 2
    assert counting.released == 1
    with pytest.raises(KeyError):
        with _lib.table_handle("h"):
            raise KeyError("inside the block")
    assert counting.released == 2


def test_table_handle_of_a_missing_table(monkeypatch):
    counting = _CountingLib(_lib.clib)
    monkeypatch.setattr(_lib, "clib", counting)
    with pytest.raises(dynemb.DynembError, match="table 'nope' is not registered.*create_table"):
        with _lib.table_handle("nope"):
            pass
    with pytest.raises(ValueError, match="the caller's words"):
        with _lib.table_handle("nope", ValueError("the caller's words")):
            pass
    with _lib.table_handle("nope", missing=None) as h:
        assert h is None
    assert counting.released == 0


@pytest.mark.parametrize("opt, field", [
    (lambda: adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0),
     "initial_accumulator_value"),
    (lambda: lazy_adam.create_hash_optimizer(0.1, beta1=1.0), "beta1"),
    (lambda: lazy_adam.create_hash_optimizer(0.1, beta2=-0.5), "beta2"),
    (lambda: lazy_adam.create_hash_optimizer(0.1, epsilon=0.0), "epsilon"),
    (lambda: ftrl.create_hash_optimizer(0.1, learning_rate_power=0.5), "learning_rate_power"),
    (lambda: ftrl.create_hash_optimizer(0.1, initial_accumulator_value=-1.0),
     "initial_accumulator_value"),
    (lambda: ftrl.create_hash_optimizer(0.1, l1_regularization_strength=-1.0),
     "l1_regularization_strength"),
    (lambda: ftrl.create_hash_optimizer(0.1, l2_regularization_strength=-1.0),
     "l2_regularization_strength"),
    (lambda: ftrl.create_hash_optimizer(0.1, l2_shrinkage_regularization_strength=-1.0),
     "l2_shrinkage_regularization_strength"),
])
def test_engine_rejects_bad_hyper_parameters(opt, field):
    """Python does not re-check these ranges: create_table reports the engine's
    sentence, which names the table, the value and the rule."""
    with pytest.raises(dynemb.DynembError, match=rf"create_table\('h'\): table 'h': optimizer "
                                                 rf"{field} = .* is invalid; it must be"):
        _table(optimizer_list=[opt()])
    assert _lib.find_table("h") is None  # nothing half-built
    assert "h" not in dynemb.core.embedding.graph_state().tables
