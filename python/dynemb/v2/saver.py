"""EmbeddingTableSaver: saving and loading the second generation's tables.

mxRec's quick start saves a model in two halves, side by side: a plain
tf.compat.v1.train.Saver writes the dense variables to
``<saved_path>/model-<step>``, and ``EmbeddingTableSaver.save(sess,
saved_path, step)`` writes the tables. Here the tables go to
``<saved_path>/embedding-tables-<step>``, one engine checkpoint directory
(dynemb.core.checkpoint.save_tables: atomic and checksummed, with every
row's embedding, its AdamW slots, the admission candidates' counts and
the table's step count, one part per rank on several ranks), so a crash
during a save leaves the previous one whole.

Tables created with max_cold_secs are evicted first: the rows whose last
lookup is more than max_cold_secs seconds old are removed from the table,
then the table is saved (mxRec documents eviction "during saving" and
forbids saving with eviction on; dynemb does both).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

import tensorflow as tf

from dynemb.core.checkpoint import restore_tables, save_tables
from dynemb.core.embedding import EmbeddingTable

DIR_PREFIX = "embedding-tables-"
_MAX_STEP = 2**32 - 1


def tables_dir(save_path: str, global_step: int) -> str:
    """Where EmbeddingTableSaver keeps the tables of `global_step`."""
    return os.path.join(save_path, "%s%d" % (DIR_PREFIX, global_step))


class EmbeddingTableSaver:
    """Saves and loads `emb_tables` (tables of get_embedding_table, usually
    get_existing_tables()) with a session."""

    def __init__(self, emb_tables: Iterable[EmbeddingTable]):
        tables = list(emb_tables) if emb_tables is not None else None
        if not tables:
            raise ValueError("EmbeddingTableSaver(emb_tables): pass the tables to save, "
                             "e.g. mxrec.get_existing_tables() (got %r)" % (emb_tables,))
        for t in tables:
            if not isinstance(t, EmbeddingTable) or not hasattr(t, "v2_args"):
                raise TypeError("EmbeddingTableSaver(emb_tables): %r is not a table of "
                                "get_embedding_table()" % (t,))
        self._tables = tables
        # The eviction ops of tables with max_cold_secs, built now (the graph
        # may be finalized by the time save runs), fed the wall clock.
        self._now = None
        self._evict: list = []
        cold = [t for t in tables if t.v2_args["max_cold_secs"] is not None]
        if cold:
            graph = cold[0].graph
            with graph.as_default(), tf.name_scope("dynemb_v2_evict"):
                self._now = tf.compat.v1.placeholder(tf.int64, [], name="now")
                self._evict = [t.evict_op(self._now, threshold=min(
                    t.v2_args["max_cold_secs"], 2**63 - 1)) for t in cold]
        self.clock: Callable[[], float] = time.time  # (tests pass their own)

    def _check(self, what: str, sess: Any, save_path: Any, global_step: Any) -> str:
        if not hasattr(sess, "run"):
            raise TypeError("EmbeddingTableSaver.%s: sess must be a tf.compat.v1.Session, "
                            "got %s" % (what, type(sess).__name__))
        if not isinstance(save_path, (str, os.PathLike)) or not os.fspath(save_path):
            raise ValueError("EmbeddingTableSaver.%s: save_path must be a directory path, "
                             "got %r" % (what, save_path))
        if isinstance(global_step, bool) or not isinstance(global_step, int) or \
                not 0 <= global_step <= _MAX_STEP:
            raise ValueError("EmbeddingTableSaver.%s: global_step = %r is invalid; it must "
                             "be an int in [0, 2^32-1]" % (what, global_step))
        return tables_dir(os.fspath(save_path), global_step)

    def save(self, sess: Any, save_path: str, global_step: int) -> None:
        """Writes the tables to <save_path>/embedding-tables-<global_step>
        (evicting cold rows first). On several ranks every rank calls it."""
        path = self._check("save", sess, save_path, global_step)
        if self._evict:
            sess.run(self._evict, feed_dict={self._now: int(self.clock())})
        save_tables(path, self._tables)

    def load(self, sess: Any, save_path: str, global_step: int) -> None:
        """Replaces the tables' contents with those saved at `global_step`
        (rows, optimizer slots, admission counts). A table that an optimizer
        of this graph trains must have been saved by the same kind of
        optimizer (the error says how to start from the embeddings only)."""
        path = self._check("load", sess, save_path, global_step)
        if "://" not in path and not os.path.isdir(path):  # (remote: restore_tables says)
            raise ValueError("EmbeddingTableSaver.load: no tables were saved at step %d "
                             "under '%s' (no directory %s)"
                             % (global_step, os.fspath(save_path), path))
        restore_tables(path, self._tables)
