"""dynemb: dynamic embedding tables for TensorFlow, with mxRec's API.

Migrate an mxRec script by replacing the import prefix ``mx_rec`` with
``dynemb``; the common names are also available here directly.
"""
from dynemb import _lib
from dynemb._lib import DynembError
from dynemb.core.embedding import (EmbeddingTable, clear_tables, create_table, drop_table,
                                   sparse_lookup)
from dynemb.core.checkpoint import (export_tables, patch_saver as _patch_saver, restore_tables,
                                    save_tables)
from dynemb.core.data_parallel import (BroadcastGlobalVariablesHook, DistributedOptimizer,
                                       allgather_object, allreduce_gradients,
                                       broadcast_global_variables)
from dynemb.core.asc.feature_spec import FeatureSpec
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline
from dynemb.core.eos import patch_dataset as _patch_dataset
from dynemb.core.feature_process import EvictHook
from dynemb.core.serving import export_saved_model, patch_builders as _patch_builders
from dynemb.core.table_stats import TableStatsHook, add_table_summaries
from dynemb.core.warm_start import WarmStartError, patch_tensorflow as _patch_tensorflow, warm_start
from dynemb.graph.modification import patch_iterator as _patch_iterator
from dynemb.graph.modifier import GraphModifierHook, modify_graph_and_start_emb_cache
from dynemb.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from dynemb.util.initialize import (ConfigInitializer, clear_channel, get_initializer,
                                    get_rank_id, get_rank_size, get_use_dynamic_expansion, init,
                                    set_if_load, terminate, terminate_config_initializer)
from dynemb.util.variable import get_dense_and_sparse_variable

__version__ = "0.1.0"


def version() -> str:
    """dynemb's version string, the same as ``dynemb.__version__`` (mxRec's
    ``mx_rec.version()``)."""
    return __version__


# tf.compat.v1.train.warm_start (which Estimator calls for warm_start_from)
# learns dynemb tables and mxRec's multi-path settings (docs/warm-start.md).
_patch_tensorflow()
# Saver checkpoints hold the tables in sparse-<prefix> directories (mxRec's layout)
# (streamed; docs/ssd-tier.md).
_patch_saver()
# SavedModel builders (Estimator.export_saved_model, simple_save, ...) turn the
# tables into stock TensorFlow ops (docs/serving.md).
_patch_builders()
# Datasets get mxRec's eos_map (ranks end their data together; dynemb.core.eos).
_patch_dataset()
# Iterators remember their batch's structure (get_target_batch returns it).
_patch_iterator()

__all__ = [
    "DynembError", "EmbeddingTable", "EvictHook", "TableStatsHook", "add_table_summaries", "ConfigInitializer", "FeatureSpec",
    "GraphModifierHook", "get_asc_insert_func", "modify_graph_and_start_emb_cache",
    "start_asc_pipeline", "adagrad", "clear_channel",
    "clear_tables", "create_table", "drop_table", "ftrl", "get_dense_and_sparse_variable",
    "get_initializer", "get_rank_id", "get_rank_size", "get_use_dynamic_expansion", "gradient_descent",
    "init", "lazy_adam", "restore_tables", "save_tables", "export_tables", "export_saved_model", "set_if_load", "sparse_lookup",
    "terminate", "BroadcastGlobalVariablesHook", "DistributedOptimizer",
    "broadcast_global_variables", "allgather_object", "allreduce_gradients",
    "terminate_config_initializer", "version", "warm_start", "WarmStartError",
]
