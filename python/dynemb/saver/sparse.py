"""mxRec's ``mx_rec.saver.sparse``: ``export(table_list=None)`` reads the sparse
tables of the checkpoint saved for the current step (the latest
``Saver.save`` of this process, its ``sparse-<prefix>`` directory) and writes
each as NumPy key/value files, ``<that directory>/npy/<table>/keys.npy`` (the
ids) and ``embeddings.npy`` (their rows, no optimizer state).
``dynemb.export_tables(path, tables)`` does the same from the live tables."""
import os
from typing import List, Optional

from dynemb import _state
from dynemb.core.checkpoint import export_checkpoint

__all__ = ["export"]


def export(table_list: Optional[List[str]] = None) -> List[str]:
    if table_list is not None and (not isinstance(table_list, (list, tuple)) or not table_list
                                   or not all(isinstance(t, str) for t in table_list)):
        raise ValueError("export: table_list must be a non-empty list of table names, got %r"
                         % (table_list,))
    if not _state.LAST_SAVED_SPARSE_DIR:
        raise ValueError("export: no checkpoint was saved in this process yet; save one with "
                         "tf.compat.v1.train.Saver().save(...) first (export reads the tables "
                         "of the checkpoint saved for the current step)")
    sparse = _state.LAST_SAVED_SPARSE_DIR[0]
    return export_checkpoint(sparse, os.path.join(sparse, "npy"), table_list)
