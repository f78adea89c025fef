"""Dynamic embedding tables: creating, reusing, dropping, saving them.

A table lives in the C engine's process registry, keyed by name; it is
created here (through ctypes) when the graph is built and found by name by
the kernels when the graph runs. It outlives graphs: Estimator rebuilds the
graph for train/eval/predict and calls create_table() again with the same
arguments, which reuses the table. Per graph, each table gets:

  * an "anchor": a scalar float constant fed to every lookup of the table.
    The kernel ignores it; its gradient (dynemb.core.lookup) is an
    IndexedSlices whose indices are the int64 ids and values the gradient of
    the looked-up rows, so ``tf.gradients(loss, sparse_variables)`` works as
    in mxRec and the sparse optimizer turns it into DynembApply ops;
  * a SaveableObject in SAVEABLE_OBJECTS, so tf.compat.v1.train.Saver (and
    Estimator checkpoints) save and restore the table with its optimizer
    slots and admission state.

mxRec's path for these is ``dynemb.core.embedding``.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import math
import os
import re
import zlib
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from dynemb import _lib, _state
from dynemb.constants.constants import ASCEND_GLOBAL_HASHTABLE_COLLECTION, DYNEMB_SPARSE_VARIABLES
from dynemb.util.log import logger

EXPORT_FIELDS = ("meta", "keys", "values", "last_access", "cand_keys",
                 "cand_counts", "cand_last_access", "apply_steps")


# --------------------------------------------------------------------------
# Initializers
# --------------------------------------------------------------------------

def _initializer_to_engine(init: Any, name: str, scale: float,
                           dim: int) -> tuple[int, float, float, Optional[int]]:
    """Maps a TF initializer to (kind, a, b, seed); raises for others."""
    if init is None:
        raise ValueError("create_table('%s'): emb_initializer is required, e.g. "
                         "tf.compat.v1.truncated_normal_initializer(stddev=0.05)" % name)
    cls = type(init).__name__
    cfg = init.get_config() if hasattr(init, "get_config") else {}
    seed = cfg.get("seed")
    if cls in ("Zeros", "ZerosV2"):
        return _lib.INIT_ZEROS, 0.0, 0.0, seed
    if cls in ("Ones", "OnesV2"):
        return _lib.INIT_CONSTANT, 1.0 * scale, 0.0, seed
    if cls in ("Constant", "ConstantV2"):
        v = cfg.get("value", 0)
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError("create_table('%s'): constant_initializer must hold one "
                             "scalar value for dynamic tables, got %r" % (name, v)) from None
        return _lib.INIT_CONSTANT, v * scale, 0.0, seed
    if cls in ("RandomUniform", "RandomUniformV2"):
        hi = cfg.get("maxval", 0.05)  # (TF1's None: 1 for float rows, as tf.random.uniform)
        return (_lib.INIT_UNIFORM, float(cfg.get("minval", -0.05)) * scale,
                (1.0 if hi is None else float(hi)) * scale, seed)
    if cls in ("RandomNormal", "RandomNormalV2"):
        return (_lib.INIT_NORMAL, float(cfg.get("mean", 0.0)) * scale,
                float(cfg.get("stddev", 0.05)) * scale, seed)
    if cls in ("TruncatedNormal", "TruncatedNormalV2"):
        return (_lib.INIT_TRUNCATED_NORMAL, float(cfg.get("mean", 0.0)) * scale,
                float(cfg.get("stddev", 0.05)) * scale, seed)
    if all(hasattr(init, a) for a in ("scale", "mode", "distribution")):
        return _variance_scaling(init, name, scale, seed, dim)
    raise TypeError(
        "create_table('%s'): emb_initializer %s is not supported for dynamic "
        "tables; use zeros/ones/constant (scalar)/random_uniform/random_normal/"
        "truncated_normal or a variance-scaling initializer (VarianceScaling, Glorot, "
        "He, LeCun)" % (name, cls))


def _variance_scaling(init: Any, name: str, scale: float, seed: Optional[int],
                      dim: int) -> tuple[int, float, float, Optional[int]]:
    """VarianceScaling and its Glorot / He / LeCun forms, for rows drawn one
    at a time: a table has no fixed row count, so the fans are the row's, dim
    (what a [rows, dim] variable gives in mode "fan_out"). As TensorFlow:
    truncated normal with the truncation's correction, normal, or uniform."""
    var = float(init.scale) / max(1.0, float(dim))
    dist = str(init.distribution).lower()
    if dist in ("truncated_normal", "normal"):  # (TF1's "normal" is truncated)
        return (_lib.INIT_TRUNCATED_NORMAL, 0.0,
                math.sqrt(var) / 0.87962566103423978 * scale, seed)
    if dist == "untruncated_normal":
        return _lib.INIT_NORMAL, 0.0, math.sqrt(var) * scale, seed
    if dist == "uniform":
        limit = math.sqrt(3.0 * var) * scale
        return _lib.INIT_UNIFORM, -limit, limit, seed
    raise TypeError("create_table('%s'): VarianceScaling distribution %r is not supported"
                    % (name, init.distribution))


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------

class EmbeddingTable:
    """A dynamic embedding table as seen from one graph."""

    def __init__(self, name: str, dim: int, key_dtype: tf.DType, optimizer: Any,
                 graph: tf.Graph, is_save: bool):
        self.table_name = name
        self.name = name
        self.dim = dim
        self.emb_size = dim
        self.scalar_emb_size = dim
        self.key_dtype = key_dtype
        self.optimizer = optimizer
        self.optimizer_list = [optimizer] if optimizer is not None else []
        self.applied_by: Any = None  # the sparse optimizer applying its gradients here
        self.graph = graph
        self.is_save = is_save
        self.is_dp = False
        self.padding_keys: tuple = ()  # keys whose rows are never updated
        self.access_and_evict_config: Optional[dict[str, Any]] = None
        # the serving_default_value the engine holds (set_default_value), if any
        self.default_value: Optional[np.ndarray] = None
        self.tiered = False  # has an SSD tier (set by create_table)
        # on several ranks: divide the summed gradients by the rank count
        self.average_gradients = False
        with graph.as_default(), graph.name_scope(None):
            self.anchor = tf.constant(0.0, dtype=tf.float32,
                                      name=op_name(name) + "_dynemb_anchor")
        # mxRec code reads table.variable; the anchor plays that role.
        self.variable = self.anchor

    def size(self) -> int:
        """Rows (admitted ids) in the table now."""
        return _lib.table_stats(self.table_name)["size"]

    def capacity(self) -> int:
        """Row slots allocated now."""
        return _lib.table_stats(self.table_name)["capacity"]

    def stats(self) -> dict[str, int]:
        """Every engine counter (size, lookups, hits, evicted, ...)."""
        return _lib.table_stats(self.table_name)

    def stats_op(self) -> tf.Tensor:
        """A tensor with the counters (order: dynemb._lib.STATS_FIELDS)."""
        return _lib.ops.dynemb_stats(table_name=self.table_name)

    def evict_op(self, now: Any, threshold: Optional[int] = None) -> tf.Tensor:
        """An op removing rows idle for more than `threshold` (0: every row
        not accessed at `now`), or the table's eviction_threshold."""
        return _lib.ops.dynemb_evict(now=tf.cast(now, tf.int64), table_name=self.table_name,
                                     threshold=-1 if threshold is None else int(threshold))

    def export_op(self) -> Any:
        """The table's contents as tensors (see EXPORT_FIELDS)."""
        return _lib.ops.dynemb_export(table_name=self.table_name)

    def __repr__(self) -> str:
        return "<dynemb table %r dim=%d>" % (self.table_name, self.dim)


def require_graph_mode(what: str) -> None:
    if tf.executing_eagerly():
        raise RuntimeError(
            "dynemb: %s needs graph mode, as mxRec scripts use it: call "
            "tf.compat.v1.disable_eager_execution() at the start, or build the model "
            "inside `with tf.Graph().as_default():` (Estimator does this)" % what)


def op_name(name: str) -> str:
    """`name` as a valid TensorFlow op name (table names may hold any character)."""
    s = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name)
    return s if re.match(r"[A-Za-z0-9.]", s) else "t" + s


_INIT_NAMES = {_lib.INIT_ZEROS: "zeros", _lib.INIT_CONSTANT: "constant",
               _lib.INIT_UNIFORM: "uniform", _lib.INIT_NORMAL: "normal",
               _lib.INIT_TRUNCATED_NORMAL: "truncated normal"}
_OPT_NAMES = {_lib.OPT_SGD: "SGD", _lib.OPT_ADAGRAD: "Adagrad", _lib.OPT_ADAM: "lazy Adam",
              _lib.OPT_FTRL: "FTRL", _lib.OPT_ADAMW: "lazy AdamW"}


def _config_fields(c: _lib.TableConfig) -> dict[str, str]:
    """Comparable fields of an engine config (run-time knobs excluded), each
    as the words a mismatch message uses."""
    o, i = c.optimizer, c.init
    return {
        "dim": str(c.dim),
        "initializer": "%s (a=%g, b=%g, seed %d)" % (_INIT_NAMES.get(i.kind, i.kind), i.a,
                                                      i.b, i.seed),
        "sparse optimizer": "%s (initial accumulator %g, beta1 %g, beta2 %g, epsilon %g, "
                            "learning rate power %g, l1 %g, l2 %g, l2 shrinkage %g, weight decay %g)"
                            % (_OPT_NAMES.get(o.kind, o.kind), o.initial_accumulator_value,
                               o.beta1, o.beta2, o.epsilon, o.learning_rate_power, o.l1,
                               o.l2, o.l2_shrinkage, o.weight_decay),
        "capacity in memory": "unlimited" if not c.host_vocabulary_size else
                              "%d rows" % c.host_vocabulary_size,
        "ssd_vocabulary_size": str(c.ssd_vocabulary_size),
        "nonfinite_policy": "error" if c.nonfinite_policy == 0 else "skip",
    }


# mxRec's reductions of a table's gradients over ranks: the sum (the update
# of one process training on the global batch), or the sum divided by the
# rank count (for losses that are each rank's mean).
ALL2ALL_GRADIENTS_OPS = ("sum_gradients", "sum_gradients_and_div_by_ranksize")


def _same_on_every_rank(name: str, fields: dict[str, str]) -> None:
    """On several ranks every rank creates the same tables, in the same
    order, with the same configuration (each holds a shard of one table):
    anything else is an error naming the rank and what differs."""
    w = _state._world()  # pylint: disable=protected-access
    mine = json.dumps({"name": name, "fields": fields}, sort_keys=True)
    theirs = w.allgather(_state.CONFIG_CHANNEL, mine.encode())
    for rank, text in enumerate(theirs):
        other = json.loads(text.decode())
        if other["name"] != name:
            raise ValueError(
                "create_table('%s'): at this point rank %d creates table '%s'; every rank "
                "must create the same tables in the same order (each rank holds a shard "
                "of every table)" % (name, rank, other["name"]))
        diff = [k for k in fields if other["fields"].get(k) != fields[k]]
        if diff:
            raise ValueError(
                "create_table('%s'): rank %d asks for another configuration: %s. Create "
                "each table with the same arguments on every rank"
                % (name, rank, "; ".join("its %s is %s, this rank's (%d) is %s"
                                         % (k, other["fields"].get(k), w.rank, fields[k])
                                         for k in diff)))


def _padding_keys(name: str, keys: Any, mask: Any) -> tuple:
    """The padding keys as a tuple of ints (mxRec's rule: keys and the mask
    come together)."""
    if keys is None:
        if mask:
            raise ValueError("create_table('%s'): padding_keys_mask=True needs padding_keys "
                             "(an int64 or a list of them)" % name)
        return ()
    listed = list(keys) if isinstance(keys, (list, tuple)) else [keys]
    if not listed or any(isinstance(k, bool) or not isinstance(k, int) or
                         not -2**63 <= k < 2**63 for k in listed):
        raise ValueError("create_table('%s'): padding_keys must be an int64 or a non-empty "
                         "list of int64 keys, got %r" % (name, keys))
    if not mask:
        raise ValueError("create_table('%s'): padding_keys is set but padding_keys_mask is "
                         "False; pass padding_keys_mask=True for their rows not to be "
                         "updated, or drop padding_keys" % name)
    return tuple(sorted(set(listed)))


def create_table(key_dtype: Any, dim: Any, name: str, emb_initializer: Any,
                 device_vocabulary_size: Optional[int] = None, host_vocabulary_size: int = 0,
                 ssd_vocabulary_size: int = 0, ssd_data_path: Any = None,
                 optimizer_list: Optional[list] = None, is_save: bool = True,
                 is_dp: bool = False, init_param: float = 1.0,
                 all2all_gradients_op: Any = "sum_gradients", enable_merge: bool = False,
                 padding_keys: Any = None, padding_keys_mask: bool = False,
                 padding_keys_len: Optional[int] = None,
                 value_dtype: Any = tf.float32, shard_num: int = 1,
                 fusion_optimizer_var: bool = True, hashtable_threshold: int = 0,
                 mode: Any = None, nonfinite_policy: str = "error") -> EmbeddingTable:
    """Creates (or, with an identical configuration, reuses) a dynamic table.

    dim: int or tf.TensorShape([dim]). Tables need no preset size: a table
    created without any size grows on demand, and so does one with
    ``init(use_dynamic_expansion=True)`` or a host tier (host_vocabulary_size
    > 0). A fixed capacity is only what the user asks for: a table given
    device_vocabulary_size alone, without dynamic expansion, holds at most
    that many rows (as in mxRec), and its "full" error names
    device_vocabulary_size.
    optimizer_list: [sparse optimizer] (optional; newer mxRec has none): the
    optimizer applied to the table's gradients decides its optimizer state
    (slots), in either order, as long as the table holds no rows yet.
    nonfinite_policy (dynemb only): 'error' rejects a batch whose gradients
    hold NaN/Inf, 'skip' drops those ids' updates and counts them.
    is_dp: mxRec's data-parallel (replicated) table: on several ranks every
    rank holds all of it (lookups count every rank's ids on every replica,
    gradients summed over ranks are applied on every replica); with one
    process a table is one copy either way. enable_merge: mxRec merges tables of equal
    configuration to save host-device channels; dynemb keeps them apart
    (nothing to save). padding_keys (an int64 or a list of them, with
    padding_keys_mask=True): keys whose rows are never updated; their
    gradients are dropped. padding_keys_len (the feature's static id count)
    is accepted: dynemb needs no static shape for it.
    """
    del shard_num, fusion_optimizer_var, hashtable_threshold, mode
    del enable_merge, padding_keys_len
    if all2all_gradients_op not in ALL2ALL_GRADIENTS_OPS:
        raise ValueError("create_table('%s'): all2all_gradients_op must be one of %s, got %r"
                         % (name, ", ".join(map(repr, ALL2ALL_GRADIENTS_OPS)),
                            all2all_gradients_op))
    ranks = _state.get_rank_size()
    pads = _padding_keys(name, padding_keys, padding_keys_mask)
    cfg_init = _state.require_init("create_table('%s')" % name)
    require_graph_mode("create_table('%s')" % name)
    if nonfinite_policy not in ("error", "skip"):
        raise ValueError("create_table('%s'): nonfinite_policy must be 'error' (reject a "
                         "batch with NaN/Inf gradients) or 'skip' (skip those ids)" % name)
    if not isinstance(name, str) or not name:
        raise ValueError("create_table: name must be a non-empty string, got %r" % (name,))
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in (tf.int32, tf.int64):
        raise TypeError("create_table('%s'): key_dtype must be tf.int64 or tf.int32, "
                        "got %s" % (name, key_dtype.name))
    if tf.as_dtype(value_dtype) != tf.float32:
        raise TypeError("create_table('%s'): value_dtype must be tf.float32" % name)
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError("create_table('%s'): dim as tf.TensorShape must be "
                             "[dim], got %s" % (name, dim))
        dim = int(dim[0])
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
        raise ValueError("create_table('%s'): dim must be an int in [1, 65536], "
                         "got %r" % (name, dim))
    if optimizer_list is None:
        optimizer_list = []
    if not isinstance(optimizer_list, (list, tuple)):
        optimizer_list = [optimizer_list]
    if len(optimizer_list) > 1:
        raise ValueError("create_table('%s'): one sparse optimizer per table is "
                         "supported, got %d in optimizer_list" % (name, len(optimizer_list)))
    opt = optimizer_list[0] if optimizer_list else None
    if opt is not None and not hasattr(opt, "_engine_optimizer"):
        raise TypeError("create_table('%s'): optimizer_list must hold a dynemb sparse "
                        "optimizer (dynemb.optimizers.<kind>.create_hash_optimizer), "
                        "got %s" % (name, type(opt).__name__))
    if device_vocabulary_size is None:
        device_vocabulary_size = 0  # (0, like no size at all: grows on demand)
    for field, v in (("device_vocabulary_size", device_vocabulary_size),
                     ("host_vocabulary_size", host_vocabulary_size),
                     ("ssd_vocabulary_size", ssd_vocabulary_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError("create_table('%s'): %s must be a non-negative int, "
                             "got %r" % (name, field, v))
    if not (isinstance(init_param, (int, float)) and math.isfinite(init_param)):
        raise ValueError("create_table('%s'): init_param must be a finite number" % name)

    graph = tf.compat.v1.get_default_graph()
    st = _state.graph_state(graph)
    if name in st.tables:
        raise ValueError(
            "create_table: a table named '%s' was already created in this graph; "
            "reuse the object create_table returned, or pick another name" % name)

    c = _lib.TableConfig()
    _lib.clib.dynemb_table_config_init(ctypes.byref(c))
    name_b = name.encode()
    c.name = name_b
    c.dim = dim
    kind, a, b, seed = _initializer_to_engine(emb_initializer, name, float(init_param), dim)
    c.init.kind, c.init.a, c.init.b = kind, a, b
    c.init.seed = (int(seed) & (2**64 - 1)) if seed is not None else zlib.crc32(name_b)
    if opt is not None:
        opt._engine_optimizer(c.optimizer)
    c.nonfinite_policy = 0 if nonfinite_policy == "error" else 1
    # Tiers: there is no device tier in this version, so rows mxRec would keep
    # in device memory live in host memory too. A table given only
    # device_vocabulary_size, without dynamic expansion, is fixed at that many
    # rows, as in mxRec (the engine's "full" message names that argument);
    # without any size, with a host tier, or with dynamic expansion it grows
    # on demand.
    budget_name = b"device_vocabulary_size"
    if device_vocabulary_size and not (_state.get_use_dynamic_expansion() or
                                       host_vocabulary_size or ssd_vocabulary_size):
        c.host_vocabulary_size = device_vocabulary_size
        c.host_budget_name = budget_name
    ssd_path_b = None
    if ssd_vocabulary_size:
        # device + host rows stay in memory, a cache above the SSD tier; the
        # engine moves the least recently used ones to a file in ssd_data_path
        # (a list: the directories filled one after the other, as mxRec does;
        # its default and an empty list: the working directory)
        paths = [ssd_data_path] if isinstance(ssd_data_path, str) else list(ssd_data_path or ())
        if not paths:
            paths = [os.getcwd()]
        for path in map(str, paths):
            if "\n" in path:
                raise ValueError("create_table('%s'): ssd_data_path %r holds a newline; "
                                 "pass directories without one" % (name, path))
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:
                raise ValueError("create_table('%s'): ssd_data_path '%s' cannot be created "
                                 "(%s); pass a writable directory" % (name, path, e)) from None
            if not os.access(path, os.W_OK | os.X_OK):
                raise ValueError("create_table('%s'): ssd_data_path '%s' is not writable; pass "
                                 "a writable directory" % (name, path))
        memory_rows = device_vocabulary_size + host_vocabulary_size
        if memory_rows == 0:
            raise ValueError("create_table('%s'): an SSD tier needs rows in memory above it; "
                             "set host_vocabulary_size (or device_vocabulary_size) > 0" % name)
        dirs = [str(p) for p in paths]
        if ranks > 1:  # ranks on one host must not share the table's file
            dirs = [os.path.join(d, "rank-%d" % _state.get_rank_id()) for d in dirs]
            for d in dirs:
                os.makedirs(d, exist_ok=True)
        ssd_path_b = "\n".join(dirs).encode()  # (the engine's list: one per line)
        c.host_vocabulary_size = memory_rows
        c.ssd_vocabulary_size = ssd_vocabulary_size
        c.ssd_data_path = ssd_path_b
    del cfg_init
    if ranks > 1:
        _same_on_every_rank(name, dict(_config_fields(c), **{
            "all2all_gradients_op": all2all_gradients_op, "padding keys": str(pads),
            "is_dp": str(bool(is_dp)),
            "key_dtype": key_dtype.name}))

    with _lib.table_handle(name, missing=None) as existing:
        if existing is not None:  # the table exists in this process: same config?
            old = _lib.TableConfig()
            _lib.clib.dynemb_table_get_config(existing, ctypes.byref(old))
            want, have = _config_fields(c), _config_fields(old)
            # (the optimizer is the applied one's: apply_gradients sets it)
            diff = [k for k in want if want[k] != have[k] and k != "sparse optimizer"]
            if diff:
                raise ValueError(
                    "create_table: table '%s' already exists in this process with "
                    "another configuration: %s. Use another name, drop the old table "
                    "first with dynemb.drop_table('%s'), or end the run with "
                    "terminate_config_initializer() before init() again"
                    % (name, "; ".join("its %s is %s, this call asks for %s"
                                       % (k, have[k], want[k]) for k in diff), name))
            logger.debug("create_table('%s'): reusing the existing table", name)
        else:
            h = ctypes.c_void_p()
            _lib.check(_lib.clib.dynemb_table_create(ctypes.byref(c), ctypes.byref(h)),
                       "create_table('%s')" % name)
            _state.HANDLES[name] = h

    table = EmbeddingTable(name, dim, key_dtype, opt, graph, is_save)
    table.is_dp = bool(is_dp)
    if ranks > 1 and is_dp:  # every rank holds all of it (dynemb.core.checkpoint)
        _state.REPLICATED_TABLES.add(name)
    else:
        _state.REPLICATED_TABLES.discard(name)
    table.average_gradients = all2all_gradients_op == "sum_gradients_and_div_by_ranksize"
    table.padding_keys = pads
    table.tiered = bool(ssd_vocabulary_size)
    st.tables[name] = table
    st.anchors[table.anchor.name] = table
    graph.add_to_collection(DYNEMB_SPARSE_VARIABLES, table.anchor)
    graph.add_to_collection(ASCEND_GLOBAL_HASHTABLE_COLLECTION, table.anchor)
    renamed = _state.hashtable_collection()  # (mxRec's collection, renamed by the script)
    if renamed not in (DYNEMB_SPARSE_VARIABLES, ASCEND_GLOBAL_HASHTABLE_COLLECTION):
        graph.add_to_collection(renamed, table.anchor)
    if is_save:
        # The Saver keeps only a marker of the table; its rows go to the
        # checkpoint's sparse directory, mxRec's sparse-<prefix> (engine
        # format: atomic, checksummed, streamed; dynemb.core.checkpoint
        # patches Saver.save/restore).
        saveable = TieredTableSaveable(table) if table.tiered else MarkerTableSaveable(table)
        graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return table


atexit.register(_state.release_handles)


def drop_table(name: str) -> None:
    """Removes table `name` from the process (its memory is freed once no
    running op uses it). Graphs that refer to it fail with a clear error."""
    h = _state.HANDLES.pop(name, None)
    if h is not None:
        _lib.clib.dynemb_table_release(h)
    _lib.check(_lib.clib.dynemb_table_drop(name.encode()), "drop_table('%s')" % name)


def clear_tables() -> None:
    """Removes every table from the process (tests, notebooks)."""
    _state.release_handles()
    _lib.clib.dynemb_registry_clear()


def table_for_variable(var: Any) -> EmbeddingTable:
    """The table whose sparse variable (anchor) is `var`."""
    name = getattr(var, "name", None)
    graph = getattr(var, "graph", None)
    st = _state.existing_graph_state(graph)
    if st is None or name not in st.anchors:
        raise ValueError(
            "dynemb: %r is not a dynemb sparse variable; pass the sparse variables "
            "from get_dense_and_sparse_variable() (and dense variables to a TF "
            "optimizer)" % (name or var,))
    return st.anchors[name]


def address_table(address: Any) -> tuple:
    """(table, looked-up rows) of an "address" tensor of by-address training
    (ASCEND_SPARSE_LOOKUP_ID_OFFSET)."""
    st = _state.existing_graph_state(getattr(address, "graph", None))
    name = getattr(address, "name", None)
    if st is None or name not in st.addresses:
        raise ValueError(
            "dynemb: %r is not an address of a dynemb lookup; pass the tensors of "
            "tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET) (train lookups "
            "made after init(use_dynamic_expansion=True)) to a ByAddr optimizer, or use "
            "the plain optimizer with get_dense_and_sparse_variable()" % (name or address,))
    return st.addresses[name]


def constant_default_value(value: Any, tname: str) -> Optional[np.ndarray]:
    """A serving_default_value's numbers when it is known while the graph is
    built (numbers, or a tensor of constants only), else None (a tensor that
    reads the batch, a placeholder or a variable: a per-lookup default)."""
    v = tf.get_static_value(value) if tf.is_tensor(value) else value
    if v is None:
        try:
            v = _evaluate_constant(value, tname)
        except ValueError:
            return None
    return np.asarray(v, dtype=np.float32)


def set_default_value(table: EmbeddingTable, value: Any) -> None:
    """serving_default_value: what lookups of `table` return for ids without a
    row (eval lookups of unknown ids, ids not admitted yet); a scalar or `dim`
    numbers: a number, a list, or a tensor computed from constants only
    (``tf.ones(dim) * 2``), evaluated once when the graph is built."""
    tname = table.table_name
    v = tf.get_static_value(value) if tf.is_tensor(value) else value
    if v is None:
        v = _evaluate_constant(value, tname)
    arr = np.asarray(v, dtype=np.float32)
    if arr.ndim == 0:
        arr = np.full([table.dim], arr, np.float32)
    arr = arr.reshape(-1)
    if arr.size != table.dim:
        raise ValueError("sparse_lookup('%s'): serving_default_value has %d numbers but the "
                         "table has dim %d; pass a scalar or %d numbers"
                         % (tname, arr.size, table.dim, table.dim))
    with _lib.table_handle(tname, no_longer_registered(tname)) as h:
        buf = (ctypes.c_float * table.dim)(*arr.tolist())
        _lib.check(_lib.clib.dynemb_table_set_default_value(h, buf),
                   "sparse_lookup('%s') serving_default_value" % tname)
    table.default_value = arr


def set_thresholds(table_name: str, access_threshold: int,
                   eviction_threshold: Optional[int], what: str,
                   missing: Exception) -> None:
    """A lookup's admission and eviction settings on its engine table (the
    sightings that admit a key, counting on; the eviction threshold, None
    for off: the engine's own 0). `what` names the caller in errors;
    `missing` is raised if the table is no longer registered."""
    with _lib.table_handle(table_name, missing) as h:
        _state.set_table_threshold(h, access_threshold, what)
        _lib.check(_lib.clib.dynemb_table_set_eviction_threshold(
            h, ctypes.c_int64(eviction_threshold or 0)), what)


def engine_default_value(table: EmbeddingTable) -> np.ndarray:
    """The default row the engine holds for `table` now (zeros until a
    serving_default_value set it; shared by the table's graphs)."""
    tname = table.table_name
    with _lib.table_handle(tname, no_longer_registered(tname)) as h:
        c = _lib.TableConfig()
        _lib.clib.dynemb_table_get_config(h, ctypes.byref(c))
        return np.array(c.default_value[:table.dim], np.float32)


_STATE_OP_TYPES = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2",
                   "ReadVariableOp", "IteratorGetNext", "IteratorGetNextSync")


def _evaluate_constant(value: tf.Tensor, tname: str) -> Any:
    """The value of a tensor that depends on constants only, computed now in
    a session of its own; a clear error if it reads anything that changes."""
    seen, stack = set(), [value.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _STATE_OP_TYPES or op.op_def.is_stateful:
            raise ValueError(
                "sparse_lookup('%s'): serving_default_value reads %s '%s', which changes "
                "while the graph runs; dynemb keeps one default value per table, set when "
                "the graph is built: compute it from constants (e.g. tf.ones(dim) * 2) or "
                "pass numbers" % (tname, op.type, op.name))
        stack.extend(i.op for i in op.inputs)
        stack.extend(op.control_inputs)
    with tf.compat.v1.Session(graph=value.graph) as s:
        return s.run(value)


def no_longer_registered(tname: str) -> ValueError:
    """What sparse_lookup raises when its table was dropped since create_table."""
    return ValueError("sparse_lookup('%s'): the table is no longer registered "
                      "(dropped?); create it again" % tname)


def sparse_variables(graph: Optional[tf.Graph] = None) -> list:
    g = graph or tf.compat.v1.get_default_graph()
    return list(g.get_collection(DYNEMB_SPARSE_VARIABLES))


# --------------------------------------------------------------------------
# Saver integration
# --------------------------------------------------------------------------

class TableSaveable(saveable_object.SaveableObject):
    """Saves a table (rows, optimizer slots, admission candidates, Adam's step
    count) as eight checkpoint tensors ``dynemb/<table>/<field>``; restoring
    replaces the table's contents."""

    def __init__(self, table: EmbeddingTable):
        self.table_name = table.table_name
        with table.graph.as_default(), table.graph.name_scope(None), \
                tf.name_scope(op_name(table.table_name) + "_dynemb_save"):
            exported = _lib.ops.dynemb_export(table_name=table.table_name)
        specs = [saveable_object.SaveSpec(t, "", "dynemb/%s/%s" % (table.table_name, f))
                 for f, t in zip(EXPORT_FIELDS, exported)]
        super().__init__(exported[0].op, specs, "dynemb/" + table.table_name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        kw = dict(zip(EXPORT_FIELDS, restored_tensors))
        return _lib.ops.dynemb_import(table_name=self.table_name,
                                      flags=_lib.IMPORT_REPLACE, **kw).op


def _meta_now(table_name: str):
    """(dim, row_floats, optimizer kind) of a table, read when the Saver saves
    (the optimizer, and so the row layout, may be decided after create_table)."""
    import numpy as np  # (numpy comes with TensorFlow)
    with _lib.table_handle(table_name) as h:
        c = _lib.TableConfig()
        _lib.clib.dynemb_table_get_config(h, ctypes.byref(c))
        return np.array([c.dim, _lib.clib.dynemb_table_row_floats(h), c.optimizer.kind],
                        np.int64)


class MarkerTableSaveable(saveable_object.SaveableObject):
    """A table in a Saver checkpoint: the marker tensor ``dynemb/<table>/meta``
    (dim, row floats, optimizer kind: what warm start checks); the rows go into
    the checkpoint's sparse directory (mxRec's ``sparse-<prefix>``) when the
    Saver saves and come back when it restores (dynemb.core.checkpoint).
    Checkpoints of earlier versions held the rows as tensors beside ``meta``
    (TableSaveable); restore still reads those."""

    def __init__(self, table: EmbeddingTable):
        self.table_name = table.table_name
        with table.graph.as_default(), table.graph.name_scope(None), \
                tf.name_scope(op_name(table.table_name) + "_dynemb_save"):
            meta = tf.numpy_function(lambda: _meta_now(self.table_name), [], tf.int64,
                                     stateful=True, name="meta")
            meta.set_shape([3])
        super().__init__(meta.op, [saveable_object.SaveSpec(
            meta, "", "dynemb/%s/meta" % table.table_name)], "dynemb/" + table.table_name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes
        return tf.no_op(name=op_name(self.table_name) + "_dynemb_restore")


class TieredTableSaveable(saveable_object.SaveableObject):
    """A table with an SSD tier in a Saver checkpoint: one marker tensor
    ``dynemb/<table>/tiered`` ([dim], for warm start's checks). Its rows go into
    the checkpoint's sparse directory (as MarkerTableSaveable's; checkpoints of
    earlier versions: ``<checkpoint prefix>.dynemb``), streamed: never all in
    memory."""

    def __init__(self, table: EmbeddingTable):
        self.table_name = table.table_name
        with table.graph.as_default(), table.graph.name_scope(None), \
                tf.name_scope(op_name(table.table_name) + "_dynemb_save"):
            marker = tf.constant([table.dim], tf.int64, name="tiered")
        super().__init__(marker.op, [saveable_object.SaveSpec(
            marker, "", "dynemb/%s/tiered" % table.table_name)], "dynemb/" + table.table_name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes
        return tf.no_op(name=op_name(self.table_name) + "_dynemb_restore")


# The checkpoint markers of tables (a SavedModel's saver leaves them out).
TABLE_SAVEABLES = (TableSaveable, MarkerTableSaveable, TieredTableSaveable)
