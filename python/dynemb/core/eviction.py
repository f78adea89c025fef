"""EvictHook: removing rows that were not accessed for a while.

Every evict_step_interval global steps and/or every evict_time_interval
seconds, removes the rows (and admission candidates) of every table trained in
the graph whose last access is older than its eviction_threshold, in the
table's own clock:

* global steps (the default): ``now`` is the step that just ran (the global
  step after it, less one: what its lookups stamped; with graph modification
  or FeatureSpec input, the latest step its batches were prepared at), so a
  row survives ``eviction_threshold`` steps that do not see it, and 0 keeps
  only the last step's rows (and those of batches prepared since);
* wall seconds (``access_and_evict_config={"eviction_clock": "wall"}``): ``now``
  is the hook's clock;
* data time (a timestamp tensor in the ``ASCEND_TIMESTAMP`` collection, or a
  ``FeatureSpec(..., is_timestamp=True)``): ``now`` is the latest data time the
  table's train lookups have stamped (``begin()`` adds a local variable holding
  it, updated by the first train lookup of the table in each step).

``clock`` (default ``time.time``) is what the hook reads for the time interval
and for wall-clock tables; tests and simulations pass their own.
Works with ``MonitoredTrainingSession`` / ``SingularMonitoredSession`` and in
``estimator.train(hooks=[...])``; eviction also works without admission.

mxRec's path for it is ``dynemb.core.feature_process.EvictHook``.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import tensorflow as tf

from dynemb import _state
from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.core.tables import op_name
from dynemb.graph.rewrite import input_of
from dynemb.util.log import logger


class EvictHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, evict_enable: bool = False,
                 evict_time_interval: Optional[float] = 60 * 60 * 24,
                 evict_step_interval: Optional[int] = None,
                 clock: Optional[Callable[[], float]] = None):
        for k, v in (("evict_time_interval", evict_time_interval),
                     ("evict_step_interval", evict_step_interval)):
            if v is not None and not v > 0:
                raise ValueError("EvictHook: %s must be > 0 or None, got %r" % (k, v))
        self.evict_enable = bool(evict_enable)
        self.evict_time_interval = evict_time_interval
        self.evict_step_interval = evict_step_interval
        self._clock = clock or time.time
        self._evict: Optional[tf.Operation] = None
        self._evicted: List[tf.Tensor] = []
        self._global_step: Optional[tf.Tensor] = None
        self._wall_now: Optional[tf.Tensor] = None
        self.evicted_total = 0

    def begin(self) -> None:
        self._evict, self._wall_now = None, None
        if not self.evict_enable:
            return
        graph = tf.compat.v1.get_default_graph()
        st = _state.graph_state(graph)
        self._global_step = tf.compat.v1.train.get_global_step()
        data_time = bool(graph.get_collection(ASCEND_TIMESTAMP))
        trained = {}
        for r in st.lookups:
            if r["is_train"]:
                trained.setdefault(r["table"].table_name, r)
        ops, self._evicted = [], []
        for name, cfg in sorted(st.evict_configs.items()):
            if cfg["eviction_threshold"] is None or name not in trained:
                continue  # no eviction, or not trained in this graph (eval)
            table = st.tables[name]
            with graph.name_scope(None), tf.name_scope("dynemb_evict"):
                if data_time:
                    now = _latest_data_time(trained[name]["op"], name)
                elif cfg["eviction_clock"] == "wall":
                    if self._wall_now is None:  # the hook's clock, fed at eviction
                        self._wall_now = tf.compat.v1.placeholder(tf.int64, [], name="wall_now")
                    now = self._wall_now
                else:
                    if self._global_step is None:
                        raise ValueError(
                            "EvictHook: table '%s' evicts by global step but the graph has no "
                            "global step; create one with "
                            "tf.compat.v1.train.get_or_create_global_step()" % name)
                    op = trained[name]["op"]
                    if _prepared(op):  # rows stamped in the pipeline, ahead
                        now = _latest_data_time(op, name)
                    else:  # (stamped with the step before apply_gradients counts it)
                        if trained[name].get("modify_graph"):
                            logger.warning(
                                "EvictHook: table '%s' has modify_graph=True lookups that "
                                "are not rewritten yet; put GraphModifierHook before "
                                "EvictHook in the hooks, or eviction counts from the "
                                "step instead of the batches the pipeline prepared "
                                "ahead" % name)
                        now = tf.maximum(tf.cast(self._global_step, tf.int64) - 1, 0)
                out = table.evict_op(now, cfg["eviction_threshold"])
            self._evicted.append(out)
            ops.append(out.op)
        if ops:
            with graph.name_scope(None):
                self._evict = tf.group(*ops, name="dynemb_evict")

    def after_create_session(self, session, coord) -> None:
        self._last_time = self._clock()
        self._last_step: Optional[int] = None
        if self._evict is not None and self._global_step is not None:
            self._last_step = int(session.run(self._global_step))

    def before_run(self, run_context):
        if self._evict is None or self._global_step is None:
            return None
        return tf.compat.v1.train.SessionRunArgs({"step": self._global_step})

    def after_run(self, run_context, run_values) -> None:
        if self._evict is None:
            return
        res = run_values.results or {}
        due = False
        if self.evict_step_interval and res.get("step") is not None \
                and self._last_step is not None:
            # The fetched value was read before or after the step's increment
            # (no order between them): read the exact one when it may be due.
            if int(res["step"]) + 1 - self._last_step >= self.evict_step_interval:
                step = int(run_context.session.run(self._global_step))
                if step - self._last_step >= self.evict_step_interval:
                    self._last_step = step
                    due = True
        now = self._clock()
        if self.evict_time_interval and now - self._last_time >= self.evict_time_interval:
            due = True
        if due:
            self._last_time = now
            self.evict(run_context.session, now)

    def evict(self, session, now: Optional[float] = None) -> int:
        """Runs the eviction now; returns the number of rows removed."""
        if self._evict is None:
            return 0
        feed = {}
        if self._wall_now is not None:
            feed[self._wall_now] = int(self._clock() if now is None else now)
        counts = session.run(self._evicted, feed_dict=feed)
        n = int(sum(int(c) for c in counts))
        self.evicted_total += n
        logger.debug("EvictHook: %d rows evicted", n)
        return n


def _prepared(lookup_op: tf.Operation) -> bool:
    """Whether a lookup reads its rows through a pipeline's tickets (graph
    modification, FeatureSpec mode): its `now` is then the clock its batch
    was prepared with."""
    try:
        return bool(lookup_op.get_attr("use_tickets"))
    except ValueError:
        return False


def _latest_data_time(lookup_op: tf.Operation, table_name: str) -> tf.Tensor:
    """A local variable holding the largest clock value `lookup_op` has stamped
    (its `now` input), updated whenever the lookup runs; returns its value."""
    now = input_of(lookup_op, "now")
    scope = op_name(table_name) + "_data_time"
    with tf.compat.v1.variable_scope(None, default_name=scope):
        latest = tf.compat.v1.get_variable(
            "latest", [], tf.int64, initializer=tf.compat.v1.zeros_initializer(),
            trainable=False, use_resource=True,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
        update = latest.assign(tf.maximum(latest.read_value(), now), read_value=False)
    lookup_op._add_control_input(update)  # pylint: disable=protected-access
    return latest.read_value()
