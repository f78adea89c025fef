"""The second generation's tables: get_embedding_table, embedding_lookup and
the lists a script trains and saves them with.

A table here is a first-generation table (dynemb.core.tables.EmbeddingTable,
made by create_table), created with mxRec v2's arguments and meanings:

* fixed capacity: ``device_vocabulary_size`` rows at most, and a full
  table is an error naming that argument (the first generation's rule for a
  table given only that size, without dynamic expansion);
* admission: ``min_used_times`` m admits an id once it has been looked up
  *more* than m times, i.e. at its (m+1)-th sighting, which is the engine's
  access_threshold m+1 (an id not admitted yet reads the default value, zeros,
  and its gradients are dropped);
* eviction: ``max_cold_secs`` s stamps every lookup with the wall clock, and
  EmbeddingTableSaver.save first removes the rows idle for more than s
  seconds (dynemb.v2.saver);
* saving: only through EmbeddingTableSaver (is_save=False keeps the tables
  out of a tf.compat.v1.train.Saver of the dense variables, so the two sit
  side by side as in mxRec's quick start).

Calling get_embedding_table again with the same name in the same graph
returns the same table (mxRec's demo builds its train and eval models with
two calls each), provided the arguments are the same.
"""
from __future__ import annotations

import enum
import re
import weakref
from typing import Any, Optional

import tensorflow as tf

from dynemb import _state
from dynemb.constants.constants import MAX_ACCESS_THRESHOLD
from dynemb.core.embedding import EmbeddingTable, create_table, sparse_lookup
from dynemb.core.tables import set_thresholds

_NAME = re.compile(r"^[0-9A-Za-z_.]{1,128}$")
_MAX_VOCABULARY = 10**9
_MAX_EVICTION = 2**63 - 1  # the engine's clock difference (int64 seconds)


class EmbDistributionStrategy(enum.Enum):
    """mxRec's distribution strategies of a table: model parallel (each rank
    holds the ids it owns) is the one there is."""
    MP = "MP"


# graph -> {table name: table}, in creation order (per graph: tables are
# graph objects, and a fresh graph builds its own)
_TABLES: "weakref.WeakKeyDictionary[tf.Graph, dict[str, EmbeddingTable]]" = \
    weakref.WeakKeyDictionary()


def _int_arg(name: str, arg: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError("get_embedding_table('%s'): %s = %r is invalid; it must be an int "
                         "in [%d, %d]" % (name, arg, value, low, high))
    return value


def get_embedding_table(name: str, dimension: int, device_vocabulary_size: int,
                        initializer: Any = None, key_dtype: Any = tf.int64,
                        value_dtype: Any = tf.float32,
                        distribution_strategy: Any = EmbDistributionStrategy.MP.value,
                        min_used_times: Optional[int] = None,
                        max_cold_secs: Optional[int] = None) -> EmbeddingTable:
    """Creates a table of `dimension` floats per id holding at most
    `device_vocabulary_size` ids (or returns the one of that name this graph
    has, created with the same arguments). initializer: a TensorFlow
    initializer (default tf.compat.v1.random_normal_initializer(), mxRec's).
    Raises ValueError / TypeError naming the argument that is out of its
    documented range."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError("get_embedding_table: name = %r is invalid; it must have 1 to 128 "
                         "characters of [0-9A-Za-z_.]" % (name,))
    _int_arg(name, "dimension", dimension, 1, 512)
    _int_arg(name, "device_vocabulary_size", device_vocabulary_size, 1, _MAX_VOCABULARY)
    if min_used_times is not None:
        _int_arg(name, "min_used_times", min_used_times, 0, 2**31 - 1)
    if max_cold_secs is not None:
        _int_arg(name, "max_cold_secs", max_cold_secs, 0, 2**64 - 1)
    if tf.as_dtype(key_dtype) != tf.int64:
        raise TypeError("get_embedding_table('%s'): key_dtype must be tf.int64 (the only "
                        "one mxRec supports), got %s" % (name, tf.as_dtype(key_dtype).name))
    if tf.as_dtype(value_dtype) != tf.float32:
        raise TypeError("get_embedding_table('%s'): value_dtype must be tf.float32, got %s"
                        % (name, tf.as_dtype(value_dtype).name))
    strategy = getattr(distribution_strategy, "value", distribution_strategy)
    if strategy != EmbDistributionStrategy.MP.value:
        raise ValueError("get_embedding_table('%s'): distribution_strategy = %r is not "
                         "supported; it must be %r (model parallel)"
                         % (name, distribution_strategy, EmbDistributionStrategy.MP.value))
    if initializer is None:
        initializer = tf.compat.v1.random_normal_initializer()
    graph = tf.compat.v1.get_default_graph()
    args = {"dimension": dimension, "device_vocabulary_size": device_vocabulary_size,
            "initializer": initializer, "min_used_times": min_used_times,
            "max_cold_secs": max_cold_secs}
    tables = _TABLES.setdefault(graph, {})
    if name in tables:
        old = tables[name].v2_args
        diff = [k for k in args if k != "initializer" and old[k] != args[k]]
        if diff:
            raise ValueError(
                "get_embedding_table('%s'): this graph has a table of that name with "
                "other arguments (%s); pass the same ones to get it again, or use "
                "another name" % (name, ", ".join("%s %r, now %r" % (k, old[k], args[k])
                                                   for k in diff)))
        return tables[name]
    _state.require_init("get_embedding_table('%s') (call mxrec.init(toml_path) first)"
                        % name)
    table = create_table(key_dtype=tf.int64, dim=dimension, name=name,
                         emb_initializer=initializer,
                         device_vocabulary_size=device_vocabulary_size, is_save=False)
    table.v2_args = args
    # (mxRec v2 evicts by idle seconds: the lookups stamp the wall clock)
    table.v2_evict_config = None if min_used_times is None and max_cold_secs is None else {
        "access_threshold": min(_admission(min_used_times), MAX_ACCESS_THRESHOLD),
        "eviction_threshold": None if max_cold_secs is None else min(max_cold_secs,
                                                                     _MAX_EVICTION),
        "eviction_clock": "wall"}
    tables[name] = table
    return table


def _admission(min_used_times: Optional[int]) -> int:
    """The engine's access_threshold of `min_used_times`: admitted at the
    sighting after the m-th (0: at once)."""
    return 0 if min_used_times is None else min_used_times + 1


def embedding_lookup(emb_table: EmbeddingTable, ids: Any, is_train: bool = True) -> tf.Tensor:
    """The rows of `ids` (an int64 or int32 tensor of any shape; not a
    tf.SparseTensor: make it dense first, as mxRec asks) -> ids.shape +
    [dimension]. New ids get rows (subject to min_used_times) as in mxRec,
    whose lookups all train; is_train=False (dynemb's) reads unknown ids as
    zeros and adds nothing."""
    if not isinstance(emb_table, EmbeddingTable) or not hasattr(emb_table, "v2_args"):
        raise TypeError("embedding_lookup: emb_table must be a table from "
                        "get_embedding_table(), got %s" % type(emb_table).__name__)
    if isinstance(ids, tf.SparseTensor):
        raise TypeError("embedding_lookup('%s'): ids is a tf.SparseTensor; convert it "
                        "first: tf.sparse.to_dense(ids, default_value=0)"
                        % emb_table.table_name)
    out = sparse_lookup(emb_table, ids, is_train=is_train,
                        access_and_evict_config=emb_table.v2_evict_config)
    threshold = _admission(emb_table.v2_args["min_used_times"])
    if threshold > MAX_ACCESS_THRESHOLD:  # (2^31: beyond the first generation's range)
        cfg = emb_table.v2_evict_config
        set_thresholds(emb_table.table_name, threshold, cfg["eviction_threshold"],
                       "embedding_lookup('%s')" % emb_table.table_name,
                       ValueError("embedding_lookup: table '%s' no longer exists"
                                  % emb_table.table_name))
    return out


def get_existing_tables() -> list:
    """The tables get_embedding_table created in the default graph, in
    creation order."""
    return list(_TABLES.get(tf.compat.v1.get_default_graph(), {}).values())


def get_sparse_embedding() -> list:
    """The trainable parameter of each table of the default graph (its sparse
    variable, in creation order): tf.gradients(loss, these) gives each
    table's gradient as tf.IndexedSlices, which AdamWOptimizer.apply_gradients
    takes."""
    return [t.anchor for t in get_existing_tables()]


def get_init_hashtable_op() -> list:
    """The ops to run before training: dynemb's tables need none (the engine
    creates a row when an id is first admitted), so this is one no-op, kept
    so that sess.run(get_init_hashtable_op()) works as in mxRec."""
    return [tf.no_op(name="dynemb_init_hashtables")]
