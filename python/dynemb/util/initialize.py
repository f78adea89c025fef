"""Process-wide settings (mxRec: ``mx_rec.util.initialize``).

``init(**kwargs)`` must be called before tables are created, as in mxRec.
One worker per process: ``get_rank_id()`` is 0 and ``get_rank_size()`` 1.

This module is mxRec's import path only; the settings live in dynemb._state,
get_initializer in dynemb.graph.modification and the host-pipeline ops in
dynemb.util.ops. Importing it lets ``ConfigInitializer.get_instance()
.train_params_config`` answer from graph modification's records.
"""
from dynemb import _state
from dynemb._state import (ConfigInitializer, TrainParamsConfig, clear_channel, get_if_load,
                           get_rank_id, get_rank_size, get_use_dynamic_expansion, init,
                           is_initialized, require_init, set_if_load, terminate,
                           terminate_config_initializer)
from dynemb.graph.modification import get_initializer, get_target_batch
from dynemb.util.ops import HostPipelineOps, import_host_pipeline_ops

_state.PIPELINE_QUERIES.update(initializer=get_initializer, target_batch=get_target_batch)


def get_host_pipeline_ops() -> HostPipelineOps:
    """mxRec's host-pipeline ops (return_timestamp, set_threshold,
    clear_channel): the object import_host_pipeline_ops() returns."""
    return import_host_pipeline_ops()


__all__ = [
    "ConfigInitializer", "TrainParamsConfig", "clear_channel", "get_host_pipeline_ops",
    "get_if_load", "get_initializer", "get_rank_id", "get_rank_size",
    "get_use_dynamic_expansion", "init", "is_initialized", "require_init", "set_if_load",
    "terminate", "terminate_config_initializer",
]
