"""What users watch: the tables' statistics in TensorBoard and in the log.

``add_table_summaries()`` adds, for every table of the graph, scalar summaries
to the graph's summary collection (so Estimator's and MonitoredTrainingSession's
summary savers, and ``tf.compat.v1.summary.merge_all()``, write them with the
training summaries) under ``dynemb/<table>/``:

  size                rows now
  capacity            rows allocated now (memory and SSD tier)
  admitted            rows created so far (admissions included)
  below_threshold     keys counted for admission that have no row yet
  evicted             rows removed by eviction so far
  ssd_rows            rows on the SSD tier now
  memory_hit_rate     share of the looked-up rows found in memory (1 without
                      an SSD tier)

``TableStatsHook`` adds them in ``begin()`` and logs one line per table at INFO
every ``every_n_steps`` steps (or ``every_n_secs`` seconds); with
``summary_dir`` it also writes them itself (sess.run scripts without a summary
saver). The numbers are the engine's counters (``DynembStats``), read when the
summaries or the hook run.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

from dynemb import _lib, _state
from dynemb.core.tables import op_name
from dynemb.util.log import logger

_FIELD = {name: i for i, name in enumerate(_lib.STATS_FIELDS)}
SCOPE = "dynemb_table_stats"


def _scalars(stats: tf.Tensor) -> Dict[str, tf.Tensor]:
    """The watched figures of one table from its DynembStats vector."""
    def f(name: str) -> tf.Tensor:
        return tf.cast(stats[_FIELD[name]], tf.float64)
    hits = f("hits")
    return {
        "size": f("size"),
        "capacity": f("capacity"),
        "admitted": f("inserted"),
        "below_threshold": f("candidates"),
        "evicted": f("evicted"),
        "ssd_rows": f("ssd_rows"),
        "memory_hit_rate": tf.where(hits > 0, 1.0 - f("ssd_lookups") / tf.maximum(hits, 1.0),
                                    tf.constant(1.0, tf.float64)),
    }


def table_stats_tensors(graph: Optional[tf.Graph] = None) -> Dict[str, Dict[str, tf.Tensor]]:
    """{table: {figure: float64 scalar}} for the tables of `graph` (default
    graph), built once per graph."""
    graph = graph or tf.compat.v1.get_default_graph()
    st = _state.graph_state(graph)
    names = [n for n in sorted(st.tables) if n not in st.stats]
    if names:
        with graph.as_default(), graph.name_scope(None), tf.name_scope(SCOPE):
            for name in names:
                stats = _lib.ops.dynemb_stats(table_name=name, name=op_name(name))
                st.stats[name] = _scalars(stats)
    return dict(st.stats)


def add_table_summaries(graph: Optional[tf.Graph] = None) -> List[tf.Tensor]:
    """Adds every table's figures to the graph's summaries (once per table);
    returns the summary tensors added."""
    graph = graph or tf.compat.v1.get_default_graph()
    done = {s.op.name for s in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)}
    added = []
    with graph.as_default(), graph.name_scope(None):
        for table, figures in table_stats_tensors(graph).items():
            for fig, value in figures.items():
                tag = "dynemb/%s/%s" % (op_name(table), fig)
                if any(n.endswith(tag) for n in done):
                    continue
                added.append(tf.compat.v1.summary.scalar(tag, value))
    return added


def format_line(table: str, v: Dict[str, float]) -> str:
    line = ("table '%s': %d rows (capacity %d), %d admitted, %d below the threshold, "
            "%d evicted" % (table, v["size"], v["capacity"], v["admitted"],
                            v["below_threshold"], v["evicted"]))
    if v["ssd_rows"]:
        line += ", %d on SSD, memory hit rate %.1f%%" % (v["ssd_rows"],
                                                         100.0 * v["memory_hit_rate"])
    return line


class TableStatsHook(tf.compat.v1.train.SessionRunHook):
    """Table statistics in TensorBoard and a periodic line per table in the log.

    every_n_steps / every_n_secs: how often the hook reads the figures (logs
    them at INFO, and writes them to `summary_dir` if given). The summaries
    added to the graph are also written by the session's own summary saver.
    """

    def __init__(self, every_n_steps: Optional[int] = 100, every_n_secs: Optional[float] = None,
                 summary_dir: Optional[str] = None) -> None:
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("TableStatsHook: give exactly one of every_n_steps and "
                             "every_n_secs")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError("TableStatsHook: every_n_steps must be >= 1")
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=every_n_secs,
                                                           every_steps=every_n_steps)
        self._summary_dir = summary_dir
        self._writer = None
        self._figures: Dict[str, Dict[str, tf.Tensor]] = {}
        self._steps = 0

    def begin(self) -> None:
        add_table_summaries()
        self._figures = table_stats_tensors()
        self._gs = tf.compat.v1.train.get_global_step()
        if self._summary_dir:
            self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)

    def before_run(self, run_context):
        self._due = self._figures and self._timer.should_trigger_for_step(self._steps)
        if not self._due:
            return None
        return tf.compat.v1.train.SessionRunArgs(
            {"figures": self._figures, "step": self._gs if self._gs is not None else
             tf.constant(self._steps, tf.int64)})

    def after_run(self, run_context, run_values):
        if self._due:
            self._report(run_values.results["figures"], int(run_values.results["step"]))
            self._timer.update_last_triggered_step(self._steps)
        self._steps += 1

    def end(self, session) -> None:
        if self._figures:
            step = session.run(self._gs) if self._gs is not None else self._steps
            self._report(session.run(self._figures), int(step))

    def _report(self, values: Dict[str, Dict[str, float]], step: int) -> None:
        for table, v in sorted(values.items()):
            logger.info("step %d: %s", step, format_line(table, v))
        if self._writer is not None:
            summary = tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag="dynemb/%s/%s" % (op_name(t), f),
                                           simple_value=float(x))
                for t, v in sorted(values.items()) for f, x in v.items()])
            self._writer.add_summary(summary, step)
            self._writer.flush()
