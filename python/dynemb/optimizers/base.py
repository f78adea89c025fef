"""Sparse optimizers: tf.compat.v1.train.Optimizer subclasses whose math runs
in the engine.

The engine applies TensorFlow's exact update rules to a table's rows and keeps
their slots (Adam's m and v, ...) with the rows; the optimizer object holds the
hyper-parameters and turns ``(IndexedSlices gradient, sparse variable)`` pairs
into DynembApply ops. compute_gradients / apply_gradients / minimize keep
TensorFlow's contract (wrappers such as loss scaling take these optimizers);
TensorFlow's per-variable update hooks (_apply_dense, _resource_apply_sparse,
...) are never used and refuse whatever reaches them. The optimizer applied to
a table decides its row layout (the optimizer's slots): a table created
without ``optimizer_list`` (as newer mxRec creates them), or with another
optimizer, takes the applied one as long as it holds no rows yet.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Callable, Iterable, Optional, Union

import tensorflow as tf

from dynemb import _lib
from dynemb.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                        ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
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


def _pairs(who: str, grads_and_vars: Iterable) -> tuple:
    """grads_and_vars as a tuple of pairs (TensorFlow's first checks)."""
    pairs = tuple(grads_and_vars)
    if not pairs:
        raise ValueError("%s.apply_gradients: grads_and_vars is empty; pass the "
                         "(gradient, variable) pairs of compute_gradients(loss)" % who)
    return pairs


class ByAddressMixin:
    """mxRec's ByAddr optimizers (dynamic expansion): apply_gradients takes
    (gradient of the looked-up rows, their address) pairs, the rows and
    addresses of ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET, and trains the
    tables as the plain optimizer does with the tables' sparse variables. A
    pair may name the rows instead of their address, as compute_gradients
    gives them (its var_list defaults to the rows of ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    so minimize(loss) trains every by-address lookup).
    weight_decay (SGD): as for the plain optimizer, from the looked-up rows."""

    _NO_DEFAULT_VARIABLES = (
        "the graph has no rows of by-address training: make the train lookups after "
        "init(use_dynamic_expansion=True), or pass var_list (the tensors of "
        "ASCEND_SPARSE_LOOKUP_LOCAL_EMB)")

    def _default_var_list(self) -> list:
        return tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)

    @staticmethod
    def _address_of(var: Any) -> Any:
        """The address of a row tensor of ASCEND_SPARSE_LOOKUP_LOCAL_EMB (the
        collections are filled together, one entry per lookup); `var` itself
        otherwise."""
        graph = getattr(var, "graph", None)
        if graph is None or isinstance(var, tf.Variable):
            return var
        for rows, address in zip(graph.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB),
                                 graph.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)):
            if rows.name == getattr(var, "name", None):
                return address
        return var

    def apply_gradients(self, grads_and_vars: Iterable, global_step: Optional[Any] = None,
                        name: Optional[str] = None,
                        skip_gradients_aggregation: bool = False) -> tf.Operation:
        pairs = []
        for grad, var in _pairs(self._name, grads_and_vars):
            address = self._address_of(var)
            table, rows = address_table(address)
            if grad is None:
                pairs.append((None, table.anchor))
                continue
            if isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            grad = tf.reshape(tf.cast(grad, tf.float32), [-1, table.dim])
            if self.weight_decay:
                grad = _decayed(grad, address, rows, self.weight_decay)
            pairs.append((tf.IndexedSlices(grad, address), table.anchor))
        self._decayed_here = True
        try:
            return super().apply_gradients(  # type: ignore[misc]
                pairs, global_step, name, skip_gradients_aggregation)
        finally:
            self._decayed_here = False


class SparseOptimizer(tf.compat.v1.train.Optimizer):
    """Base class; subclasses set KIND, SLOT_NAMES and fill the engine struct.
    weight_decay (SGD's): each row moves by -lr * (gradient + weight_decay *
    row), once per step however often its id occurs in the batch."""
    KIND = _lib.OPT_SGD
    optimizer_type = "sgd"
    SLOT_NAMES: tuple = ()  # TensorFlow's names of the slots the engine keeps per row
    weight_decay = 0.0
    _decayed_here = False  # ByAddressMixin added the decay already
    _NO_DEFAULT_VARIABLES = (
        "the graph has no dynemb tables: look up a table (sparse_lookup) before "
        "computing gradients, or pass var_list (the sparse variables of "
        "get_dense_and_sparse_variable())")

    def __init__(self, learning_rate: LearningRate, use_locking: bool = False,
                 name: str = "SparseOptimizer"):
        # Checked here, not left to the engine: apply ops pass this rate at
        # each step, and the engine reads a negative one as "the configured
        # rate" (a table made without this optimizer never saw it).
        if isinstance(learning_rate, (int, float)) and not (
                math.isfinite(learning_rate) and learning_rate >= 0):
            raise ValueError("%s: learning_rate must be a finite number >= 0, got %r"
                             % (name, learning_rate))
        if not isinstance(name, str):
            raise TypeError("sparse optimizer: name must be a string, got %r" % (name,))
        if not name:
            raise ValueError("sparse optimizer: name must not be empty (it names the "
                             "optimizer's ops)")
        # use_locking is kept for TensorFlow's wrappers; the engine locks rows itself.
        super().__init__(use_locking, name)
        self._learning_rate = learning_rate

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

    # -- tf.compat.v1.train.Optimizer's contract ---------------------------
    def get_slot_names(self) -> list:
        """The names of the slots this optimizer keeps for each row (TensorFlow's
        names: "m", "v" for Adam, "accumulator" for Adagrad, "accum", "linear"
        for FTRL). The engine stores them with the rows; the Saver saves them
        with the table."""
        return sorted(self.SLOT_NAMES)

    def get_slot(self, var: Any, name: str) -> None:
        """None, as TensorFlow answers for a slot it has no variable for: a
        table's slots are in the engine, next to its rows, not TF variables."""
        del var, name
        return None

    def compute_gradients(self, loss: Any, var_list: Optional[Any] = None,
                          gate_gradients: int = tf.compat.v1.train.Optimizer.GATE_OP,
                          aggregation_method: Any = None,
                          colocate_gradients_with_ops: bool = False,
                          grad_loss: Optional[tf.Tensor] = None) -> list:
        """[(gradient, variable)] as tf.compat.v1.train.Optimizer gives them.
        var_list defaults to the tables' sparse variables (dense variables are a
        TensorFlow optimizer's); the gradient of each is an IndexedSlices (ids,
        rows' gradients). The rows of by-address training
        (ASCEND_SPARSE_LOOKUP_LOCAL_EMB) get a dense gradient each."""
        if var_list is None:
            var_list = self._default_var_list()
            if not var_list:
                raise ValueError("%s.compute_gradients: var_list is None and %s"
                                 % (self._name, self._NO_DEFAULT_VARIABLES))
        return super().compute_gradients(
            loss, var_list=var_list, gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops, grad_loss=grad_loss)

    def _default_var_list(self) -> list:
        return sparse_variables()

    def apply_gradients(self, grads_and_vars: Iterable, global_step: Optional[Any] = None,
                        name: Optional[str] = None,
                        skip_gradients_aggregation: bool = False) -> tf.Operation:
        """Applies IndexedSlices gradients of sparse variables (tables).

        Gradients of repeated ids are summed and each row is updated once,
        as TensorFlow does. With global_step, it is incremented once, after
        all updates. skip_gradients_aggregation (tf.distribute's) changes
        nothing: on several ranks a table's gradients meet at each row's owner.
        """
        del skip_gradients_aggregation
        pairs = _pairs(self._name, grads_and_vars)
        # every variable is checked before anything is built or bound
        tables = [(grad, table_for_variable(var)) for grad, var in pairs]
        if all(grad is None for grad, _ in tables):
            raise ValueError(
                "%s.apply_gradients: no gradient for any of the tables %s: the loss does "
                "not depend on their lookups" % (self._name, sorted(
                    {t.table_name for _, t in tables})))
        applies = []
        with tf.name_scope(name or self._name) as scope:
            lr = self._lr_tensor()
            for grad, table in tables:
                if grad is None:
                    continue
                self._bind_table(table)
                applies.append(self._apply_table(table, grad, lr))
            if global_step is None:
                train_op = self._finish(applies, scope)
            else:
                with tf.control_dependencies([self._finish(applies, "update")]):
                    train_op = tf.compat.v1.assign_add(global_step, 1, name=scope).op
        collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        if train_op not in collection:
            collection.append(train_op)
        return train_op

    def _apply_table(self, table: Any, grad: Any, lr: tf.Tensor) -> tf.Operation:
        """The DynembApply op (on several ranks the sharded one) of one table."""
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
            # after the step's lookups (the gradient's values wait for them):
            # a row they create this step is read as created, not as missing
            with tf.control_dependencies([values]):
                rows = self._current_rows(table, keys)
            values = _decayed(values, keys, rows, self.weight_decay)
        if table.padding_keys:  # their rows are never updated
            pads = tf.constant(table.padding_keys, tf.int64)
            keep = tf.logical_not(tf.reduce_any(
                tf.equal(keys[:, None], pads[None, :]), axis=1))
            keys, values = tf.boolean_mask(keys, keep), tf.boolean_mask(values, keep)
        if exchange.several_ranks():
            # every rank's rows of a key meet at its owner
            return exchange.sharded_apply(table.table_name, keys, values, lr,
                                          table.average_gradients, table.is_dp)
        # `trainable` and `tickets` are used only when a pipeline
        # mode sets use_trainable / use_tickets (dynemb.graph.rewrite).
        return _lib.ops.dynemb_apply(
            keys=keys, grads=values, learning_rate=lr,
            trainable=unused_input(tf.int64), tickets=unused_input(tf.int64),
            table_name=table.table_name)

    # TensorFlow's per-variable update hooks: apply_gradients above never
    # calls them (the engine updates the tables); whatever routes a variable
    # here (Optimizer.apply_gradients called on this object, tf.distribute)
    # is told where each kind of variable goes.
    def _not_here(self, hook: str, var: Any) -> None:
        try:
            what = "table '%s'" % table_for_variable(var).table_name
        except ValueError:
            what = "variable %r" % (getattr(var, "name", None) or var,)
        raise RuntimeError(
            "%s: TensorFlow's per-variable update %s was reached for %s; dynemb's sparse "
            "optimizers update tables only inside the engine, through their own "
            "apply_gradients(grads_and_vars) (minimize, compute_gradients then "
            "apply_gradients): call it on this optimizer (or on a wrapper that delegates "
            "to it), and train dense tf.Variables with a TensorFlow optimizer"
            % (self._name, hook, what))

    def _apply_dense(self, grad: Any, var: Any) -> None:
        self._not_here("_apply_dense", var)

    def _resource_apply_dense(self, grad: Any, handle: Any) -> None:
        self._not_here("_resource_apply_dense", handle)

    def _apply_sparse(self, grad: Any, var: Any) -> None:
        self._not_here("_apply_sparse", var)

    def _apply_sparse_duplicate_indices(self, grad: Any, var: Any) -> None:
        self._not_here("_apply_sparse_duplicate_indices", var)

    def _resource_apply_sparse(self, grad: Any, handle: Any, indices: Any) -> None:
        self._not_here("_resource_apply_sparse", handle)

    def _resource_apply_sparse_duplicate_indices(self, grad: Any, handle: Any,
                                                 indices: Any) -> None:
        self._not_here("_resource_apply_sparse_duplicate_indices", handle)

    # -- the engine ---------------------------------------------------------
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
