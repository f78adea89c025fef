"""The process's dynemb state: everything the other modules remember.

Kept below the modules that use it, so that none of them needs another
mechanism just to reach a registry:

  * the tables this process holds a reference to (``HANDLES``);
  * what dynemb built in each graph (``graph_state``): tables, anchors,
    lookups, eviction settings;
  * the per-graph records of the two prepared-lookup modes: automatic graph
    modification (``modification_state``: the rebuilt pipelines' initializers),
    FeatureSpec mode (``feature_spec_state``: the guarded ids tensors) and the
    apply ops either mode switched to its lookups (``switched_applies``);
  * which table each FeatureSpec feeds (``table_of_feature``);
  * the settings given to ``init()`` (``ConfigInitializer``: mxRec's
    ``mx_rec.util.initialize``), with its run-time knob ``set_threshold`` and
    mxRec's ``train_params_config`` (``TrainParamsConfig``), whose pipeline
    queries are answered by dynemb.graph.modification through
    ``PIPELINE_QUERIES`` (this module sits below it).

Ranks: a script started by an MPI launcher in several processes joins the
launch's world (dynemb._comm) and the rank functions answer from it; a
script started alone is rank 0 of 1 and needs no MPI. On several ranks the
graph's exchanges get channels from ``next_exchange_channel`` (the same on
every rank, which builds the same graph in the same order) and run in the
order each graph's ``exchange_tails`` chains them (dynemb.core.exchange).
"""
from __future__ import annotations

import atexit
import ctypes
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from dynemb import _lib
from dynemb.constants.constants import (ASCEND_GLOBAL_HASHTABLE_COLLECTION,
                                       DYNEMB_SPARSE_VARIABLES, EVAL_CHANNEL_ID,
                                       MAX_ACCESS_THRESHOLD, TRAIN_CHANNEL_ID)
from dynemb.util.log import logger

# --------------------------------------------------------------------------
# Tables and graphs
# --------------------------------------------------------------------------

# Tables this process holds a reference to: name -> engine handle.
HANDLES: dict[str, ctypes.c_void_p] = {}
# Tables of which this rank holds all rows on several ranks (is_dp=True):
# they are restored whole, not as this rank's shard.
REPLICATED_TABLES: set = set()
# The sparse directory of the latest Saver checkpoint written in this process
# (mxRec's saver.sparse.export reads "the checkpoint saved for the current step").
LAST_SAVED_SPARSE_DIR: list = []
# Tables saved incrementally in this process: their full saves go through the
# engine's incremental save too, so that the next delta builds on the latest.
INCREMENTAL_TABLES: set = set()
# Tables some lookup reads without a serving_default_value of its own (in
# any graph): their engine default must stay zeros (dynemb.core.lookup).
DEFAULT_READERS: set = set()


def release_handles() -> None:
    """Gives back this process's references to its tables."""
    for h in HANDLES.values():
        _lib.clib.dynemb_table_release(h)
    HANDLES.clear()


def drop_all_tables() -> None:
    """Removes every table from the process and forgets what dynemb built in
    every graph (graphs that still use a table fail with a clear error)."""
    release_handles()
    _lib.clib.dynemb_registry_clear()
    for states in (_GRAPHS, _MODIFICATIONS, _FEATURE_SPECS, _SWITCHED_APPLIES):
        states.clear()
    TABLE_OF_SPEC.clear()
    LAST_SAVED_SPARSE_DIR.clear()
    INCREMENTAL_TABLES.clear()
    DEFAULT_READERS.clear()


class GraphState:
    """What dynemb built in one graph."""

    def __init__(self) -> None:
        self.tables: dict[str, Any] = {}   # table name -> EmbeddingTable
        self.anchors: dict[str, Any] = {}  # anchor tensor name -> EmbeddingTable
        self.lookups: list[dict[str, Any]] = []
        self.evict_configs: dict[str, dict[str, Any]] = {}
        # table name -> {figure: tensor} (dynemb.core.table_stats)
        self.stats: dict[str, dict[str, Any]] = {}
        # "address" tensor name (by-address training) -> (table, its rows)
        self.addresses: dict[str, Any] = {}
        # On several ranks: the latest exchange op of each chain
        # (dynemb.core.exchange), which the next one waits for.
        self.exchange_tails: dict[Any, Any] = {}
        self.exchange_chain_of: dict[str, Any] = {}  # exchange op name -> its chain
        # get_next op name -> the structure Iterator.get_next returned
        # (dynemb.graph.modification.patch_iterator), for get_target_batch.
        self.batch_structures: dict[str, Any] = {}


@dataclass
class ModificationState:
    """What automatic graph modification did to one graph."""
    done: set = field(default_factory=set)  # names of rewritten lookup ops
    initializers: Dict[bool, List[tf.Operation]] = field(
        default_factory=lambda: {True: [], False: []})
    one_shot: Dict[bool, bool] = field(default_factory=lambda: {True: False, False: False})
    # reinitializable iterators with several datasets (get_initializer is ambiguous)
    several_datasets: List[str] = field(default_factory=list)
    # the batch each rewritten iterator now yields (get_target_batch): the
    # get_next outputs of a rebuilt pipeline (train) or of an unchanged one
    # (eval), in the original get_next order
    target_batches: Dict[bool, List[List[tf.Tensor]]] = field(
        default_factory=lambda: {True: [], False: []})


@dataclass
class FeatureSpecLookup:
    """One ``sparse_lookup(table, spec, batch=batch)`` waiting for start_asc_pipeline."""
    spec: Any            # the FeatureSpec
    ids: tf.Tensor       # the guarded ids tensor given to sparse_lookup
    tickets: Optional[tf.Tensor]  # admission tickets (training pipelines) or None
    training: bool       # the insert function was made with is_training=True
    stamp: Optional[tf.Tensor] = None  # the clock its batch was prepared with


@dataclass
class FeatureSpecState:
    """The FeatureSpec lookups of one graph: by guarded ids tensor name, and
    the names of the lookup ops already started."""
    by_ids: Dict[str, FeatureSpecLookup] = field(default_factory=dict)
    done: set = field(default_factory=set)


_GRAPHS: "weakref.WeakKeyDictionary[tf.Graph, GraphState]" = weakref.WeakKeyDictionary()
_MODIFICATIONS: "weakref.WeakKeyDictionary[tf.Graph, ModificationState]" = \
    weakref.WeakKeyDictionary()
_FEATURE_SPECS: "weakref.WeakKeyDictionary[tf.Graph, FeatureSpecState]" = \
    weakref.WeakKeyDictionary()
_SWITCHED_APPLIES: "weakref.WeakKeyDictionary[tf.Graph, set]" = weakref.WeakKeyDictionary()


def _of_graph(states: weakref.WeakKeyDictionary, graph: Optional[tf.Graph],
              make: Callable[[], Any]) -> Any:
    g = graph or tf.compat.v1.get_default_graph()
    st = states.get(g)
    if st is None:
        st = states[g] = make()
    return st


def graph_state(graph: Optional[tf.Graph] = None) -> GraphState:
    """What dynemb built in `graph` (default: the default graph); created empty."""
    return _of_graph(_GRAPHS, graph, GraphState)


def existing_graph_state(graph: Optional[tf.Graph]) -> Optional[GraphState]:
    """graph_state(graph) if dynemb built anything in `graph`, else None (no
    state is made for other graphs)."""
    return _GRAPHS.get(graph) if graph is not None else None


def graphs_with_state() -> List[tf.Graph]:
    """The live graphs dynemb built something in."""
    return list(_GRAPHS.keys())


def modification_state(graph: tf.Graph) -> ModificationState:
    return _of_graph(_MODIFICATIONS, graph, ModificationState)


def existing_modification_state(graph: tf.Graph) -> Optional[ModificationState]:
    return _MODIFICATIONS.get(graph)


def feature_spec_state(graph: tf.Graph) -> FeatureSpecState:
    return _of_graph(_FEATURE_SPECS, graph, FeatureSpecState)


def switched_applies(graph: tf.Graph) -> set:
    """Names of the DynembApply ops of `graph` already switched to prepared
    lookups (a trainable-keys filter or admission tickets; dynemb.graph.rewrite)."""
    return _of_graph(_SWITCHED_APPLIES, graph, set)


# Feature name -> table name of the latest FeatureSpec of that name, so that
# set_threshold(ids_name=...) can find the table of a feature.
TABLE_OF_SPEC: Dict[str, str] = {}


def check_faae(owner: str, value: Any) -> int:
    """faae_coefficient as an int in [1, 2^31-1] (mxRec's range), or ValueError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ValueError("%s: faae_coefficient must be an int in [1, 2^31-1] (the weight of "
                         "one sighting in admission counting), got %r" % (owner, value))
    return value


def table_of_feature(ids_name: str) -> Optional[str]:
    """The table that FeatureSpec `ids_name` feeds, or None if no such spec."""
    return TABLE_OF_SPEC.get(ids_name)


def set_access_threshold(threshold: int, emb_name: Optional[str] = None,
                         ids_name: Optional[str] = None) -> None:
    """Changes the admission threshold of a table at run time (of every table
    of this process when neither name is given)."""
    if ids_name is not None:
        table = table_of_feature(ids_name)
        if table is None:
            raise ValueError("set_threshold(ids_name=%r): no FeatureSpec of that name; pass "
                             "the name of a FeatureSpec(..., table_name=...) or emb_name"
                             % ids_name)
        if emb_name is not None and emb_name != table:
            raise ValueError("set_threshold(emb_name=%r, ids_name=%r): FeatureSpec %r feeds "
                             "table %r, not %r" % (emb_name, ids_name, ids_name, table,
                                                  emb_name))
        emb_name = table
    value = None if isinstance(threshold, bool) else getattr(threshold, "__index__", None)
    if value is None or not 0 <= value() <= MAX_ACCESS_THRESHOLD:
        raise ValueError("set_threshold: threshold must be an int in [0, 2^31-1] (0 stops "
                         "the counting), got %r" % (threshold,))
    names = [emb_name] if emb_name else sorted(HANDLES)
    for n in names:
        with _lib.table_handle(n, ValueError("set_threshold: no table named '%s'" % n)) as h:
            # (mxRec's set_threshold(0): counting stops, the threshold stays)
            set_table_threshold(h, int(threshold), "set_threshold('%s')" % n,
                                counting=int(threshold) != 0)


def set_table_threshold(handle: Any, threshold: int, what: str,
                        counting: bool = True) -> None:
    """An admission setting on an engine table: the weighed sightings that
    admit a key (0 or 1: at once; each lookup's occurrences weigh its
    faae_coefficient), counting on; or, with counting=False (mxRec's
    threshold 0), the counting of sightings stopped and the threshold left
    as it is."""
    if not counting:
        _lib.check(_lib.clib.dynemb_table_set_admission_counting(handle, 0), what)
        return
    _lib.check(_lib.clib.dynemb_table_set_access_threshold(handle, threshold), what)
    _lib.check(_lib.clib.dynemb_table_set_admission_counting(handle, 1), what)


# --------------------------------------------------------------------------
# init() settings (mxRec: mx_rec.util.initialize)
# --------------------------------------------------------------------------

# mxRec's init() keywords. Keywords outside this set are accepted with a
# warning (so an mxRec script still runs) and stored.
_KNOWN = {
    "use_mpi": False, "train_steps": -1, "eval_steps": -1, "save_steps": -1,
    "max_steps": -1, "prefetch_batch_number": 1, "use_dynamic": True,
    "use_hot": True, "use_dynamic_expansion": False, "if_load": False,
    "rank_id": 0, "rank_size": 1, "seed": None, "bind_cpu": True,
    "use_lccl": False, "is_incremental_checkpoint": False,
    "save_checkpoint_due_time": None, "save_delta_checkpoints_secs": None,
    "restore_model_version": None, "recent_key_count_threshold": 0,
}


def _check_incremental(cfg: dict) -> None:
    """init's incremental-checkpoint switches: with is_incremental_checkpoint,
    both intervals (seconds, 1 .. 2^31-1) are needed."""
    for key in ("save_checkpoint_due_time", "save_delta_checkpoints_secs"):
        v = cfg[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or
                              not 1 <= v <= 2**31 - 1):
            raise ValueError("init(%s=%r): pass a number of seconds in [1, 2^31-1]"
                             % (key, v))
    if not isinstance(cfg["is_incremental_checkpoint"], bool):
        raise TypeError("init(is_incremental_checkpoint=%r): pass True or False"
                        % (cfg["is_incremental_checkpoint"],))
    v = cfg["restore_model_version"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ValueError("init(restore_model_version=%r): pass the global step of the "
                         "checkpoint to load (an int >= 0), or leave it out to load the "
                         "latest" % (v,))
    if v is not None and not cfg["is_incremental_checkpoint"]:
        logger.warning("init(restore_model_version=%d) has an effect only with "
                       "is_incremental_checkpoint=True (as in mxRec); Saver.restore loads "
                       "the path it is given", v)
    r = cfg["recent_key_count_threshold"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError("init(recent_key_count_threshold=%r): pass an int >= 0" % (r,))
    if r:
        logger.warning("init(recent_key_count_threshold=%d) has no effect: dynemb's "
                       "incremental saves hold every row that changed since the last "
                       "save, however often its key was seen", r)
    if cfg["is_incremental_checkpoint"] and (cfg["save_checkpoint_due_time"] is None or
                                             cfg["save_delta_checkpoints_secs"] is None):
        raise ValueError("init(is_incremental_checkpoint=True) needs "
                         "save_checkpoint_due_time (seconds between full saves) and "
                         "save_delta_checkpoints_secs (seconds between incremental saves)")


# mxRec's host-pipeline op object (dynemb.util.ops.import_host_pipeline_ops()),
# registered by that module when it is imported: ConfigInitializer's
# host_pipeline_ops attribute is that same object, as in mxRec.
HOST_PIPELINE_OPS: Dict[str, Any] = {}


# Answers to TrainParamsConfig's pipeline questions, filled in by a higher
# layer when it is imported (dynemb.util.initialize): "initializer" and
# "target_batch", each called with is_training.
PIPELINE_QUERIES: Dict[str, Callable[[bool], Any]] = {}

# The graph collections create_table fills with the tables' sparse variables:
# dynemb's own and mxRec's default name of ascend_global_hashtable_collection.
_SPARSE_VARIABLES = ASCEND_GLOBAL_HASHTABLE_COLLECTION
_FILLED = (DYNEMB_SPARSE_VARIABLES, ASCEND_GLOBAL_HASHTABLE_COLLECTION)


def hashtable_collection() -> str:
    """The collection name ascend_global_hashtable_collection holds now (the
    default before init()); create_table adds each table to it too."""
    cfg = ConfigInitializer._instance  # pylint: disable=protected-access
    return cfg.train_params_config._collection if cfg is not None else _SPARSE_VARIABLES


def _is_training(is_training: Any, what: str) -> bool:
    if not isinstance(is_training, bool):
        raise TypeError("train_params_config.%s(is_training): is_training must be True "
                        "(training) or False (evaluation), got %r" % (what, is_training))
    return is_training


class TrainParamsConfig:
    """mxRec's training-parameter holder (``ConfigInitializer.get_instance()
    .train_params_config``): the rebuilt pipelines of automatic graph
    modification, the data channels' ids and the tables' collection name."""

    def __init__(self, owner: "ConfigInitializer"):
        self._owner = owner
        self._collection = _SPARSE_VARIABLES

    def _query(self, what: str, is_training: bool) -> Any:
        fn = PIPELINE_QUERIES.get(what)
        if fn is None:
            raise RuntimeError("train_params_config.get_%s: dynemb.graph.modification is "
                               "not loaded; import dynemb" % what)
        return fn(is_training)

    def get_initializer(self, is_training: bool) -> tf.Operation:
        """The op that initializes the train (True) or eval (False) pipeline
        graph modification rebuilt (dynemb.graph.modifier.get_initializer)."""
        return self._query("initializer", _is_training(is_training, "get_initializer"))

    def get_target_batch(self, is_training: bool) -> List[tf.Tensor]:
        """The batch the train (True) or eval (False) lookups read after graph
        modification: the get_next outputs of the rebuilt pipeline, in the
        order of tf.nest.flatten of the original batch."""
        return self._query("target_batch", _is_training(is_training, "get_target_batch"))

    def get_training_mode_channel_id(self, is_training: bool) -> int:
        """The data channel of the train (0) or eval (1) pipeline, the ids
        clear_channel takes."""
        return TRAIN_CHANNEL_ID if _is_training(is_training, "get_training_mode_channel_id") \
            else EVAL_CHANNEL_ID

    @property
    def ascend_global_hashtable_collection(self) -> str:
        """Name of the graph collection holding the tables' sparse variables
        (get_dense_and_sparse_variable's second list). Reading it after a
        rename adds the default graph's tables to the renamed collection."""
        if self._collection not in _FILLED:
            _copy_sparse_variables(self._collection)
        return self._collection

    @ascend_global_hashtable_collection.setter
    def ascend_global_hashtable_collection(self, name: str) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            raise ValueError("ascend_global_hashtable_collection must be a string of 1 to "
                             "255 characters, got %r" % (name,))
        self._collection = name
        if name not in _FILLED:
            _copy_sparse_variables(name)

    @property
    def use_dynamic_expansion(self) -> bool:
        return self._owner.use_dynamic_expansion

    @property
    def use_dynamic(self) -> bool:
        return self._owner.use_dynamic

    @property
    def use_static(self) -> bool:
        return self._owner.use_static


def _copy_sparse_variables(collection: str) -> None:
    """Adds the default graph's table variables missing from `collection`."""
    graph = tf.compat.v1.get_default_graph()
    present = graph.get_collection(collection)
    for var in graph.get_collection(_SPARSE_VARIABLES):
        if all(v is not var for v in present):
            graph.add_to_collection(collection, var)


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
        _check_given_ranks(self.config["rank_id"], self.config["rank_size"])
        _check_incremental(self.config)
        self.train_params_config = TrainParamsConfig(self)
        self.terminate_hooks: list[Callable[[], None]] = []

    @property
    def host_pipeline_ops(self) -> Any:
        """mxRec's host-pipeline op object: import_host_pipeline_ops() (its
        set_threshold returns the op that changes the threshold when run)."""
        ops = HOST_PIPELINE_OPS.get("default")
        if ops is None:
            raise RuntimeError("host_pipeline_ops: dynemb.util.ops is not loaded; import "
                               "dynemb")
        return ops

    @classmethod
    def get_instance(cls) -> "ConfigInitializer":
        if cls._instance is None:
            raise RuntimeError("dynemb: init() has not been called; call "
                               "dynemb.init(...) before creating tables")
        return cls._instance

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    @property
    def if_load(self) -> bool:
        """Whether the script is going to load a trained model (init's
        if_load, or set_if_load)."""
        return bool(self.config["if_load"])

    @if_load.setter
    def if_load(self, value: bool) -> None:
        self.config["if_load"] = bool(value)

    @property
    def use_dynamic_expansion(self) -> bool:
        """init(use_dynamic_expansion=...): tables given only a device size grow."""
        return bool(self.config["use_dynamic_expansion"])

    @property
    def use_dynamic(self) -> bool:
        """init(use_dynamic=...): dynamic shapes (True, mxRec's default)."""
        return bool(self.config["use_dynamic"])

    @property
    def use_static(self) -> bool:
        """Static-shape mode: not use_dynamic (send_count is then a capacity)."""
        return not self.use_dynamic

    @property
    def is_incremental_checkpoint(self) -> bool:
        """init(is_incremental_checkpoint=...): CheckpointSaverHook saves the
        tables incrementally (dynemb.core.checkpoint)."""
        return bool(self.config["is_incremental_checkpoint"])

    @property
    def save_checkpoint_due_time(self) -> Optional[int]:
        return self.config["save_checkpoint_due_time"]

    @property
    def save_delta_checkpoints_secs(self) -> Optional[int]:
        return self.config["save_delta_checkpoints_secs"]

    @property
    def restore_model_version(self) -> Optional[int]:
        """init(restore_model_version=...): with incremental checkpoints, the
        global step Saver.restore loads instead of the one in its path."""
        return self.config["restore_model_version"]


def init(**kwargs: Any) -> None:
    """Starts dynemb in this process (mxRec's init). Calling it again
    replaces the settings; tables already created are kept (Estimator's
    rebuilds of a graph find them again). terminate_config_initializer()
    ends it all."""
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
    """Ends what init() began: stops dynemb's background work, forgets the
    settings and removes the tables (save them first). Afterwards init() and
    create_table() start afresh in the same process: a table may come back
    under the same name with another configuration (notebooks, test suites,
    sweeps)."""
    inst = ConfigInitializer._instance
    ConfigInitializer._instance = None
    if inst is not None:
        for hook in reversed(inst.terminate_hooks):
            try:
                hook()
            except Exception as e:  # shutdown must not raise
                logger.warning("terminate: %s", e)
        drop_all_tables()


terminate = terminate_config_initializer
atexit.register(terminate_config_initializer)


# Environment variables by which process launchers tell each process its
# place: (variable, what it counts, whether the launcher is MPI's). A "size"
# above 1 or a "rank" above 0 means the launcher started several processes.
_LAUNCHER_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "size", True), ("OMPI_COMM_WORLD_LOCAL_SIZE", "size", True),
    ("OMPI_COMM_WORLD_RANK", "rank", True),                      # Open MPI mpirun
    ("PMI_SIZE", "size", True), ("PMI_RANK", "rank", True),      # MPICH, Intel MPI (Hydra)
    ("PMIX_RANK", "rank", True),                                 # PMIx launchers
    ("MV2_COMM_WORLD_SIZE", "size", True), ("MV2_COMM_WORLD_RANK", "rank", True),  # MVAPICH2
    ("HOROVOD_SIZE", "size", False), ("HOROVOD_RANK", "rank", False),  # horovodrun (Gloo)
)


def _multi_process_launch() -> Optional[str]:
    """The launcher variable that says several processes of this script were
    started ("NAME=VALUE"), or None for a process started alone. A launcher
    that is not MPI's raises: dynemb's ranks talk over MPI."""
    import os
    for variable, counts, is_mpi in _LAUNCHER_VARIABLES:
        text = os.environ.get(variable)
        if text is None or not text.strip():
            continue
        try:
            value = int(text)
        except ValueError:
            raise RuntimeError("dynemb: environment variable %s=%r is not a number; it is "
                               "set by a process launcher (mpirun, horovodrun, ...)"
                               % (variable, text)) from None
        if value > (1 if counts == "size" else 0):
            if not is_mpi:
                raise RuntimeError(
                    "dynemb: this process was started by a launcher that is not MPI's "
                    "(%s=%s); dynemb's workers talk over MPI: launch with "
                    "`mpirun -np N python script.py` (Open MPI)" % (variable, text))
            return "%s=%s" % (variable, text)
    return None


def _world() -> Any:
    """The MPI world when a launcher started several processes, else None."""
    launch = _multi_process_launch()
    if launch is None:
        return None
    from dynemb import _comm
    w = _comm.world()
    w.label_once(PYTHON_CHANNEL_LABELS)
    import os
    expected = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
    if expected and expected.strip().isdigit() and int(expected) != w.size:
        raise RuntimeError(
            "dynemb: the launcher started %s processes, but the MPI world has %d: "
            "dynemb's exchange library was built with another MPI than the launcher's; "
            "launch with the mpirun of the MPI that `mpicc` belongs to (Open MPI)"
            % (expected, w.size))
    return w


def _check_given_ranks(rank_id: Any, rank_size: Any) -> None:
    """init()'s rank_id / rank_size, when given, must be the launch's."""
    size = int(rank_size or 1)
    rank = int(rank_id or 0)
    w = _world()
    have_rank, have_size = (w.rank, w.size) if w is not None else (0, 1)
    if (size, rank) == (1, 0) and w is None:
        return
    if rank_size in (None, 1) and rank_id in (None, 0) and w is not None:
        return  # mxRec's defaults: the launch decides
    if (rank, size) != (have_rank, have_size):
        how = ("this process is rank %d of %d in its MPI launch" % (have_rank, have_size)
               if w is not None else
               "this process was started alone; start N workers with "
               "`mpirun -np N python script.py`")
        raise ValueError("dynemb.init: rank_id=%r rank_size=%r, but %s; leave rank_id and "
                         "rank_size out (the launch decides them)" % (rank_id, rank_size, how))


def get_rank_id() -> int:
    """This process's rank among the training processes (mxRec's meaning):
    its rank in the MPI launch, 0 for a process started alone."""
    w = _world()
    return w.rank if w is not None else 0


def get_rank_size() -> int:
    """The number of training processes (mxRec's meaning): the MPI launch's
    size, 1 for a process started alone."""
    w = _world()
    return w.size if w is not None else 1


def get_local_rank_size() -> int:
    """The number of training processes on this machine (mxRec's meaning)."""
    w = _world()
    return w.local_size if w is not None else 1


# Exchange channels: those below FIRST_GRAPH_CHANNEL are Python's own
# exchanges (graph construction time), the rest belong to graph ops.
CONFIG_CHANNEL = 1  # create_table's check that every rank asks for the same table
CHECKPOINT_CHANNEL = 2  # save_tables / Saver.save: every rank's part is written
OBJECT_CHANNEL = 3  # allgather_object
EXPORT_CHANNEL = 4  # export for serving: every rank's rows to rank 0
FIRST_GRAPH_CHANNEL = 16
_next_channel = [FIRST_GRAPH_CHANNEL]
# What an exchange error calls them, here and on the other ranks (the graph
# ops name theirs in tf/sharded_ops.c).
PYTHON_CHANNEL_LABELS = {
    CONFIG_CHANNEL: "create_table's check across ranks",
    CHECKPOINT_CHANNEL: "checkpoint save across ranks",
    OBJECT_CHANNEL: "allgather_object",
    EXPORT_CHANNEL: "export for serving across ranks",
}


def next_exchange_channel() -> int:
    """A channel for one more exchange op: the same number on every rank,
    since every rank builds the same graphs in the same order."""
    c = _next_channel[0]
    _next_channel[0] += 1
    return c


def sharded_ops() -> Any:
    """The op library of several ranks (after joining the world, which it
    needs)."""
    if _world() is None:
        raise RuntimeError("dynemb: the ops of several ranks are used in a process "
                           "started alone")
    return _lib.sharded_ops()


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
