"""Process-wide settings (mxRec: ``mx_rec.util.initialize``).

``init(**kwargs)`` must be called before tables are created, as in mxRec.
One worker per process: ``get_rank_id()`` is 0 and ``get_rank_size()`` 1.
"""
from __future__ import annotations

import atexit
from typing import Any, Callable, Optional

import tensorflow as tf

from dynemb.util.log import logger

# mxRec's init() keywords. Keywords outside this set are accepted with a
# warning (so an mxRec script still runs) and stored.
_KNOWN = {
    "use_mpi": False, "train_steps": -1, "eval_steps": -1, "save_steps": -1,
    "max_steps": -1, "prefetch_batch_number": 1, "use_dynamic": True,
    "use_hot": True, "use_dynamic_expansion": False, "if_load": False,
    "rank_id": 0, "rank_size": 1, "seed": None, "bind_cpu": True,
    "use_lccl": False,
}


class _HostPipelineOps:
    """Run-time knobs of the host pipeline (mxRec's host_pipeline_ops)."""

    def set_threshold(self, threshold: int, emb_name: Optional[str] = None,
                      ids_name: Optional[str] = None) -> None:
        """Changes the admission threshold of table `emb_name` (or of every
        table fed by FeatureSpec `ids_name`) for later lookups."""
        from dynemb.core import embedding  # late import: avoid a cycle
        embedding.set_access_threshold(threshold, emb_name=emb_name, ids_name=ids_name)


class ConfigInitializer:
    """The settings given to init(); a process singleton."""
    _instance: Optional["ConfigInitializer"] = None

    def __init__(self, **kwargs: Any):
        self.config = dict(_KNOWN)
        unknown = sorted(set(kwargs) - set(_KNOWN))
        if unknown:
            logger.warning("init(): keywords %s are not used by dynemb (accepted "
                           "for mxRec compatibility)", unknown)
        self.config.update(kwargs)
        size = int(self.config["rank_size"] or 1)
        if size != 1 or int(self.config["rank_id"] or 0) != 0:
            raise ValueError(
                "dynemb.init: rank_id=%r rank_size=%r: this version trains on one "
                "worker per process group; use rank_id=0, rank_size=1"
                % (self.config["rank_id"], self.config["rank_size"]))
        self.host_pipeline_ops = _HostPipelineOps()
        self.terminate_hooks: list[Callable[[], None]] = []

    @classmethod
    def get_instance(cls) -> "ConfigInitializer":
        if cls._instance is None:
            raise RuntimeError("dynemb: init() has not been called; call "
                               "dynemb.init(...) before creating tables")
        return cls._instance

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)


def init(**kwargs: Any) -> None:
    """Starts dynemb in this process (mxRec's init). Calling it again
    replaces the settings; tables already created are kept."""
    ConfigInitializer._instance = ConfigInitializer(**kwargs)
    logger.debug("init(%s)", kwargs)


def is_initialized() -> bool:
    return ConfigInitializer._instance is not None


def require_init(what: str) -> ConfigInitializer:
    if ConfigInitializer._instance is None:
        raise RuntimeError(
            "dynemb: %s before init(): call dynemb.init(...) (mxRec: "
            "mx_rec.util.initialize.init) at the start of the script" % what)
    return ConfigInitializer._instance


def terminate_config_initializer() -> None:
    """Stops dynemb's background work and forgets the settings. Tables stay
    registered until the process exits (or dynemb.clear_tables())."""
    inst = ConfigInitializer._instance
    ConfigInitializer._instance = None
    if inst is not None:
        for hook in reversed(inst.terminate_hooks):
            try:
                hook()
            except Exception as e:  # shutdown must not raise
                logger.warning("terminate: %s", e)


terminate = terminate_config_initializer
atexit.register(terminate_config_initializer)


def get_rank_id() -> int:
    return 0


def get_rank_size() -> int:
    return 1


def get_use_dynamic_expansion() -> bool:
    inst = ConfigInitializer._instance
    return bool(inst and inst.get("use_dynamic_expansion"))


def set_if_load(if_load: bool) -> None:
    require_init("set_if_load()").config["if_load"] = bool(if_load)


def get_if_load() -> bool:
    inst = ConfigInitializer._instance
    return bool(inst and inst.get("if_load"))


def clear_channel(is_train_channel: bool = False) -> None:
    """mxRec drains a host->device data channel here; plain-mode lookups
    have no channel, so there is nothing to drain."""
    del is_train_channel


def get_initializer(is_training: bool = True) -> tf.Operation:
    """The op that (re)starts the embedding input pipeline for training
    (True) or evaluation (False). Run it after initializing the dataset
    iterator. With plain lookups there is no pipeline: a no-op group."""
    from dynemb.core import embedding
    return embedding.pipeline_initializer(bool(is_training))
