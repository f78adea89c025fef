"""Sparse optimizers: hyper-parameters for the engine + apply_gradients.

The math runs inside the engine (TensorFlow's exact update rules); the
optimizer object only describes the hyper-parameters and turns
``zip(sparse_grads, sparse_variables)`` into DynembApply ops. The optimizer
applied to a table decides its row layout (the optimizer's slots): a table
created without ``optimizer_list`` (as newer mxRec creates them), or with
another optimizer, takes the applied one as long as it holds no rows yet.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Callable, Iterable, Optional, Union

import tensorflow as tf

from dynemb import _lib
from dynemb.core import exchange
from dynemb.core.lookup import unused_input
from dynemb.core.tables import address_table, sparse_variables, table_for_variable

LearningRate = Union[float, tf.Tensor, tf.Variable, Callable[[], Any]]


def _decayed(values: tf.Tensor, keys: tf.Tensor, rows: tf.Tensor, decay: float) -> tf.Tensor:
    """Gradient rows plus weight decay: each id's rows get decay * row in all,
    spread over its occurrences (the engine sums an id's rows)."""
    _, at, count = tf.unique_with_counts(keys)
    share = tf.cast(tf.gather(count, at), tf.float32)[:, None]
    return values + decay * tf.stop_gradient(rows) / share


class ByAddressMixin:
    """mxRec's ByAddr optimizers (dynamic expansion): apply_gradients takes
    (gradient of the looked-up rows, their address) pairs, the rows and
    addresses of ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET, and trains the
    tables as the plain optimizer does with the tables' sparse variables.
    weight_decay (SGD): as for the plain optimizer, from the looked-up rows."""

    def apply_gradients(self, grads_and_vars: Iterable, global_step: Optional[Any] = None,
                        name: Optional[str] = None) -> tf.Operation:
        pairs = []
        for grad, address in grads_and_vars:
            table, rows = address_table(address)
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            grad = tf.reshape(tf.cast(grad, tf.float32), [-1, table.dim])
            if self.weight_decay:
                grad = _decayed(grad, address, rows, self.weight_decay)
            pairs.append((tf.IndexedSlices(grad, address), table.anchor))
        self._decayed_here = True
        try:
            return super().apply_gradients(pairs, global_step, name)  # type: ignore[misc]
        finally:
            self._decayed_here = False


class SparseOptimizer:
    """Base class; subclasses set KIND and fill the engine struct.
    weight_decay (SGD's): each row moves by -lr * (gradient + weight_decay *
    row), once per step however often its id occurs in the batch."""
    KIND = _lib.OPT_SGD
    optimizer_type = "sgd"
    weight_decay = 0.0
    _decayed_here = False  # ByAddressMixin added the decay already

    def __init__(self, learning_rate: LearningRate, use_locking: bool = False,
                 name: str = "SparseOptimizer"):
        del use_locking  # the engine locks rows itself
        # Checked here, not left to the engine: apply ops pass this rate at
        # each step, and the engine reads a negative one as "the configured
        # rate" (a table made without this optimizer never saw it).
        if isinstance(learning_rate, (int, float)) and not (
                math.isfinite(learning_rate) and learning_rate >= 0):
            raise ValueError("%s: learning_rate must be a finite number >= 0, got %r"
                             % (name, learning_rate))
        self._learning_rate = learning_rate
        self._name = name

    # -- hyper-parameters -------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def learning_rate(self) -> LearningRate:
        return self._learning_rate

    def _hyper(self) -> dict[str, float]:
        return {}

    def _engine_optimizer(self, o: _lib.Optimizer) -> None:
        """Fills a dynemb_optimizer struct."""
        o.kind = self.KIND
        lr = self._learning_rate
        # The configured rate is only a fallback; apply ops always pass
        # the (possibly scheduled) rate of this step.
        o.learning_rate = float(lr) if isinstance(lr, (int, float)) else 0.01
        for k, v in self._hyper().items():
            setattr(o, k, float(v))

    def _lr_tensor(self) -> tf.Tensor:
        lr = self._learning_rate
        if callable(lr) and not isinstance(lr, (tf.Tensor, tf.Variable)):
            lr = lr()
        return tf.cast(tf.convert_to_tensor(lr), tf.float32)

    # -- training ---------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Iterable, global_step: Optional[Any] = None,
                        name: Optional[str] = None) -> tf.Operation:
        """Applies IndexedSlices gradients of sparse variables (tables).

        Gradients of repeated ids are summed and each row is updated once,
        as TensorFlow does. With global_step, it is incremented after all
        updates.
        """
        applies = []
        with tf.name_scope(name or self._name):
            lr = self._lr_tensor()
            for grad, var in grads_and_vars:
                table = table_for_variable(var)
                if grad is None:
                    continue
                self._bind_table(table)
                if not isinstance(grad, tf.IndexedSlices):
                    raise TypeError(
                        "%s.apply_gradients: the gradient of table '%s' is a dense %s, "
                        "not IndexedSlices; take it with tf.gradients(loss, "
                        "sparse_variables) where sparse_variables come from "
                        "get_dense_and_sparse_variable()"
                        % (self._name, table.table_name, type(grad).__name__))
                keys = grad.indices
                if keys.dtype != tf.int64:
                    keys = tf.cast(keys, tf.int64)
                values = tf.reshape(tf.cast(grad.values, tf.float32), [-1, table.dim])
                if self.weight_decay and not self._decayed_here:
                    rows = self._current_rows(table, keys)
                    values = _decayed(values, keys, rows, self.weight_decay)
                if table.padding_keys:  # their rows are never updated
                    pads = tf.constant(table.padding_keys, tf.int64)
                    keep = tf.logical_not(tf.reduce_any(
                        tf.equal(keys[:, None], pads[None, :]), axis=1))
                    keys, values = tf.boolean_mask(keys, keep), tf.boolean_mask(values, keep)
                if exchange.several_ranks():
                    # every rank's rows of a key meet at its owner
                    applies.append(exchange.sharded_apply(
                        table.table_name, keys, values, lr, table.average_gradients,
                        table.is_dp))
                    continue
                # `trainable` and `tickets` are used only when a pipeline
                # mode sets use_trainable / use_tickets (dynemb.graph.rewrite).
                applies.append(_lib.ops.dynemb_apply(
                    keys=keys, grads=values, learning_rate=lr,
                    trainable=unused_input(tf.int64), tickets=unused_input(tf.int64),
                    table_name=table.table_name))
            if global_step is None:
                return tf.group(*applies)
            with tf.control_dependencies(applies):
                return tf.compat.v1.assign_add(global_step, 1).op

    @staticmethod
    def _current_rows(table: Any, keys: tf.Tensor) -> tf.Tensor:
        """The rows of `keys` as they are before this step's update."""
        now = tf.constant(0, tf.int64)
        if exchange.several_ranks():
            return exchange.sharded_lookup(table.table_name, keys, now, table.anchor,
                                           False, exchange.TRAIN_CHAIN,
                                           replicated=table.is_dp)
        return _lib.ops.dynemb_lookup(ids=keys, now=now, anchor=table.anchor,
                                      tickets=unused_input(tf.int64),
                                      table_name=table.table_name, is_train=False)[0]

    def _bind_table(self, table: Any) -> None:
        """Makes this optimizer the table's: the engine takes its kind and
        hyper-parameters (a new kind only while the table holds no rows; the
        engine's error names both kinds otherwise). One optimizer trains a
        table: a second one applied in the same graph is refused."""
        applied = table.applied_by
        if applied is self:
            return
        if applied is not None:
            raise ValueError(
                "%s.apply_gradients: table '%s' is already trained by sparse optimizer %s "
                "(%s) in this graph; apply each table's gradients with one optimizer"
                % (self._name, table.table_name, applied.name, applied.optimizer_type))
        o = _lib.Optimizer()
        self._engine_optimizer(o)
        with _lib.table_handle(table.table_name) as h:
            _lib.check(_lib.clib.dynemb_table_set_optimizer(h, ctypes.byref(o)),
                       "%s.apply_gradients" % self._name)
        table.optimizer = self
        table.optimizer_list = [self]
        table.applied_by = self

    def compute_gradients(self, loss: tf.Tensor, var_list: Optional[list] = None,
                          **kwargs: Any) -> list:
        """[(gradient, variable)] as tf.compat.v1.train.Optimizer gives them:
        for dynemb's sparse variables (default: all) an IndexedSlices each; for
        the rows of by-address training (ASCEND_SPARSE_LOOKUP_LOCAL_EMB) a
        dense gradient each. TensorFlow's keywords are accepted."""
        del kwargs
        var_list = list(var_list) if var_list is not None else sparse_variables()
        return list(zip(tf.gradients(loss, var_list), var_list))

    def minimize(self, loss: tf.Tensor, global_step: Optional[Any] = None,
                 var_list: Optional[list] = None, name: Optional[str] = None) -> tf.Operation:
        """apply_gradients(zip(tf.gradients(loss, tables), tables))."""
        var_list = list(var_list) if var_list is not None else sparse_variables()
        grads = tf.gradients(loss, var_list)
        return self.apply_gradients(zip(grads, var_list), global_step, name)


class CustomizedOptimizer(SparseOptimizer):
    """mxRec's base class of user-defined sparse optimizers. dynemb applies the
    sparse update inside its engine, with TensorFlow's math for SGD, Adagrad,
    lazy Adam and FTRL, so an update rule written in TensorFlow ops by a
    subclass could not run there: defining a subclass raises TypeError naming
    the optimizers there are."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(
            "dynemb: %s subclasses CustomizedOptimizer to bring its own sparse update "
            "rule; dynemb applies sparse updates inside its engine and has these: "
            "dynemb.optimizers.gradient_descent, adagrad, lazy_adam, ftrl (and their "
            "*_by_addr forms). Use one of them (their hyper-parameters are keywords of "
            "create_hash_optimizer)" % cls.__name__)
