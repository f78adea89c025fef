"""EvictHook (mxRec: ``mx_rec.core.feature_process.EvictHook``).

Every evict_step_interval global steps and/or every evict_time_interval
seconds, removes the rows (and admission candidates) of every table of the
graph whose last access is older than its eviction_threshold.
"""
from __future__ import annotations

import time
from typing import Optional

import tensorflow as tf

from dynemb.core import embedding


class EvictHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, evict_enable: bool = False, evict_time_interval: Optional[float] = 60 * 60 * 24,
                 evict_step_interval: Optional[int] = None):
        for k, v in (("evict_time_interval", evict_time_interval),
                     ("evict_step_interval", evict_step_interval)):
            if v is not None and not v > 0:
                raise ValueError("EvictHook: %s must be > 0 or None, got %r" % (k, v))
        self.evict_enable = bool(evict_enable)
        self.evict_time_interval = evict_time_interval
        self.evict_step_interval = evict_step_interval
        self._evict = None
        self._global_step = None

    def begin(self) -> None:
        if not self.evict_enable:
            return
        graph = tf.compat.v1.get_default_graph()
        st = embedding.graph_state(graph)
        self._global_step = tf.compat.v1.train.get_global_step()
        ops = []
        for name, cfg in sorted(st.evict_configs.items()):
            if not cfg["eviction_threshold"]:
                continue
            table = st.tables[name]
            if tf.compat.v1.get_collection(embedding.ASCEND_TIMESTAMP):
                raise NotImplementedError(
                    "EvictHook: table '%s' counts data time (ASCEND_TIMESTAMP); "
                    "data-time eviction needs the FeatureSpec pipeline" % name)
            if cfg["eviction_clock"] == "wall":
                now = tf.cast(tf.timestamp(), tf.int64)
            else:
                if self._global_step is None:
                    raise ValueError("EvictHook: table '%s' evicts by global step but the "
                                     "graph has no global step; create one with "
                                     "tf.compat.v1.train.get_or_create_global_step()" % name)
                now = tf.cast(self._global_step, tf.int64)
            ops.append(table.evict_op(now))
        self._evict = tf.group(*ops, name="dynemb_evict") if ops else None

    def after_create_session(self, session, coord) -> None:
        self._last_time = time.time()
        self._last_step = None

    def before_run(self, run_context):
        if self._evict is None or self._global_step is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values) -> None:
        if self._evict is None:
            return
        due = False
        if self.evict_step_interval and run_values.results is not None:
            step = int(run_values.results) + 1  # the step just finished
            if self._last_step is None:
                self._last_step = step - 1
            if step - self._last_step >= self.evict_step_interval:
                self._last_step = step
                due = True
        if self.evict_time_interval and time.time() - self._last_time >= self.evict_time_interval:
            due = True
        if due:
            self._last_time = time.time()
            run_context.session.run(self._evict)
