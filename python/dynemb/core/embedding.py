"""Dynamic embedding tables and lookups (mxRec: ``mx_rec.core.embedding``).

This module is mxRec's import path only; the code lives in
dynemb.core.tables (create_table, EmbeddingTable, checkpoints through the
Saver) and dynemb.core.lookup (sparse_lookup and its gradient).
"""
from dynemb._state import graph_state, set_access_threshold
from dynemb.constants.constants import ASCEND_TIMESTAMP, DYNEMB_SPARSE_VARIABLES
from dynemb.core.lookup import sparse_lookup, unused_input, wall_time
from dynemb.core.tables import (EXPORT_FIELDS, EmbeddingTable, TableSaveable,
                                TieredTableSaveable, clear_tables, create_table, drop_table,
                                sparse_variables, table_for_variable)
from dynemb.graph.modification import get_initializer as pipeline_initializer

__all__ = [
    "ASCEND_TIMESTAMP", "DYNEMB_SPARSE_VARIABLES", "EXPORT_FIELDS", "EmbeddingTable",
    "TableSaveable", "TieredTableSaveable", "clear_tables", "create_table", "drop_table",
    "graph_state", "pipeline_initializer", "set_access_threshold", "sparse_lookup",
    "sparse_variables", "table_for_variable", "unused_input", "wall_time",
]
