"""Process-wide settings (mxRec: ``mx_rec.util.initialize``).

``init(**kwargs)`` must be called before tables are created, as in mxRec.
One worker per process: ``get_rank_id()`` is 0 and ``get_rank_size()`` 1.

This module is mxRec's import path only; the settings live in dynemb._state
and get_initializer in dynemb.graph.modification.
"""
from dynemb._state import (ConfigInitializer, clear_channel, get_if_load, get_rank_id,
                           get_rank_size, get_use_dynamic_expansion, init, is_initialized,
                           require_init, set_if_load, terminate, terminate_config_initializer)
from dynemb.graph.modification import get_initializer

__all__ = [
    "ConfigInitializer", "clear_channel", "get_if_load", "get_initializer", "get_rank_id",
    "get_rank_size", "get_use_dynamic_expansion", "init", "is_initialized", "require_init",
    "set_if_load", "terminate", "terminate_config_initializer",
]
