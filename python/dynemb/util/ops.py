"""mxRec's host-pipeline ops (mxRec: ``mx_rec.util.ops``).

mxRec loads a library of custom TensorFlow ops and hands scripts the module
of its wrappers; scripts call three of them. dynemb's ops are in its own op
library (dynemb._lib), so `import_host_pipeline_ops()` returns one object
with the three, each with mxRec's meaning on host memory:

  * ``set_threshold(threshold, emb_name=None, ids_name=None)``: an op that,
    when the script runs it, changes tables' admission threshold
    (``DynembSetAccessThreshold``);
  * ``return_timestamp(tensor)``: the batch's timestamp as int64, which
    admission and eviction then use as their clock (data time);
  * ``clear_channel(channel_id)``: a no-op op, as dynemb has no data channels
    to drain (see its docstring).

The one idea behind return_timestamp: it is called inside a ``Dataset.map``
function, but lookups read their clock from the ``ASCEND_TIMESTAMP``
collection of the outer graph, where they match a timestamp to their ids by
the iterator both come from. So the call leaves a `_PendingTimestamp` in the
outer graph's collection; when a lookup converts it to a tensor, it finds the
``get_next`` output of each iterator whose elements carry this timestamp
component (through the dataset ops and map functions between them) and takes
the place of those tensors in the collection.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

from dynemb import _lib, _state
from dynemb.constants.constants import (ASCEND_TIMESTAMP, EVAL_CHANNEL_ID, LIBASC_OPS_SO,
                                        MAX_ACCESS_THRESHOLD,
                                       TRAIN_CHANNEL_ID)
from dynemb.graph.trace import GET_NEXT_TYPES
from dynemb.util.log import logger

# Channel ids of get_training_mode_channel_id(True / False), mxRec's values.
TRAIN_CHANNEL, EVAL_CHANNEL = TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID


# --------------------------------------------------------------------------
# set_threshold
# --------------------------------------------------------------------------

def _names(value: Union[None, str, Sequence[str]], what: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError("set_threshold: %s must be a table name or a list of them, got %r"
                    % (what, value))


def _table_of_lookup(ids_name: str) -> Optional[str]:
    """The table of the lookup made with sparse_lookup(..., name=ids_name) in
    the default graph (its op is under that name scope, maybe uniquified)."""
    graph = tf.compat.v1.get_default_graph()
    st = _state.existing_graph_state(graph)
    for record in reversed(st.lookups if st is not None else []):
        scope = record["op"].name.rpartition("/")[0]
        base = scope.rpartition("_")
        if scope == ids_name or (base[0] == ids_name and base[2].isdigit()):
            return record["table"].table_name
    return None


def _tables_for(emb_name: Any, ids_name: Any) -> List[str]:
    tables = _names(emb_name, "emb_name")
    if tables:
        return tables  # mxRec: ids_name has no effect
    for name in _names(ids_name, "ids_name"):
        table = _state.table_of_feature(name) or _table_of_lookup(name)
        if table is None:
            raise ValueError(
                "set_threshold(ids_name=%r): no FeatureSpec and no sparse_lookup(name=...) of "
                "that name in the default graph; pass the table's name as emb_name" % name)
        tables.append(table)
    if not tables:
        tables = sorted(_state.HANDLES)
        if not tables:
            raise ValueError("set_threshold: no table exists yet; create the tables first "
                             "or name one with emb_name")
    return list(dict.fromkeys(tables))


def _threshold_tensor(threshold: Any) -> tf.Tensor:
    """`threshold` as an int64 scalar tensor, checked (at run time when its
    value is not known while the graph is built)."""
    if isinstance(threshold, bool):
        raise TypeError("set_threshold: threshold must be an int or an integer tensor, "
                        "got %r" % threshold)
    value = threshold if isinstance(threshold, int) else tf.get_static_value(threshold)
    if value is not None:
        if getattr(value, "shape", ()) not in ((), None):
            raise ValueError("set_threshold: threshold must be a scalar, got shape %s"
                             % (value.shape,))
        value = int(value)
        if not 0 <= value <= MAX_ACCESS_THRESHOLD:
            raise ValueError("set_threshold: threshold = %d is out of range; give a number "
                             "of sightings from 1 to 2147483647 (2^31-1), or 0 to stop "
                             "counting "
                             "them" % value)
        return tf.constant(value, tf.int64)
    t = tf.convert_to_tensor(threshold)
    if not t.dtype.is_integer:
        raise TypeError("set_threshold: threshold must be an integer tensor, got %s"
                        % t.dtype.name)
    return tf.cast(tf.reshape(t, []), tf.int64)  # (the op checks the range)


# --------------------------------------------------------------------------
# return_timestamp
# --------------------------------------------------------------------------

_MARKS = itertools.count(1)
_MARK_PREFIX = "dynemb_return_timestamp"

# Dataset ops that keep an element's components in place (their first input is
# the dataset they read).
_KEEPS_COMPONENTS = frozenset({
    "PrefetchDataset", "ShardDataset", "RepeatDataset", "ShuffleDataset",
    "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "TakeDataset", "SkipDataset", "FilterDataset",
    "CacheDataset", "CacheDatasetV2", "BatchDataset", "BatchDatasetV2",
    "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset", "UnbatchDataset",
    "RebatchDataset", "RebatchDatasetV2", "ModelDataset", "OptimizeDataset",
    "OptimizeDatasetV2", "OptionsDataset", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "AssertCardinalityDataset", "AssertNextDataset",
    "IgnoreErrorsDataset", "TakeWhileDataset", "FinalizeDataset",
})
_MAPS = frozenset({"MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2"})


def _function_def(graph: tf.Graph, name: str):
    g = graph
    while g is not None:
        fn = g._get_function(name)  # pylint: disable=protected-access
        if fn is not None:
            return fn.definition
        g = getattr(g, "outer_graph", None)
    return None


class _Node:
    """A dataset op, of a graph (`op`) or of a function (`fdef`, `node`)."""

    def __init__(self, graph: tf.Graph, op=None, fdef=None, node=None):
        self.graph, self.op, self.fdef, self.node = graph, op, fdef, node

    @property
    def type(self) -> str:
        return self.op.type if self.op is not None else self.node.op

    def function(self, attr: str) -> Optional[str]:
        nd = self.op.node_def if self.op is not None else self.node
        return nd.attr[attr].func.name if attr in nd.attr else None

    def data_inputs(self) -> int:
        if self.op is not None:
            return len(self.op.inputs)
        return sum(1 for s in self.node.input if not s.startswith("^"))

    def input(self, k: int) -> Optional["_Node"]:
        if self.op is not None:
            return _Node(self.graph, op=self.op.inputs[k].op)
        refs = [s for s in self.node.input if not s.startswith("^")]
        return _fdef_node(self.graph, self.fdef, refs[k].split(":")[0])


def _fdef_node(graph: tf.Graph, fdef, name: str) -> Optional[_Node]:
    for nd in fdef.node_def:
        if nd.name == name:
            return _Node(graph, fdef=fdef, node=nd)
    return None  # a function argument


def _output_source(fdef, index: int, mark: str) -> Union[bool, int, None]:
    """Where output `index` of function `fdef` comes from, through Identity
    ops: True for the node named `mark`, an argument's index, or None."""
    ref = fdef.ret[fdef.signature.output_arg[index].name]
    nodes = {nd.name: nd for nd in fdef.node_def}
    args = [a.name for a in fdef.signature.input_arg]
    for _ in range(10_000):
        name = ref.split(":")[0]
        if name == mark:
            return True
        if name in args:
            return args.index(name)
        nd = nodes.get(name)
        if nd is None or nd.op != "Identity":
            return None
        ref = [s for s in nd.input if not s.startswith("^")][0]
    return None


def _carries(dataset: Optional[_Node], index: int, mark: str) -> bool:
    """Whether component `index` of `dataset`'s elements is the timestamp
    that return_timestamp marked `mark`."""
    for _ in range(1_000):
        if dataset is None:
            return False
        if dataset.type in _KEEPS_COMPONENTS:
            dataset = dataset.input(0)
            continue
        fname = dataset.function("f") if dataset.type in _MAPS else None
        fdef = _function_def(dataset.graph, fname) if fname else None
        if fdef is None or index >= len(fdef.signature.output_arg):
            return False
        source = _output_source(fdef, index, mark)
        if source is True:
            return True
        captured = dataset.data_inputs() - 1
        if source is None or source >= len(fdef.signature.input_arg) - captured:
            return False  # computed in the map, or a captured tensor
        dataset, index = dataset.input(0), source
    return False


def _datasets_of(iterator: tf.Operation) -> List[_Node]:
    graph = iterator.graph
    if iterator.type == "OneShotIterator":
        fdef = _function_def(graph, iterator.get_attr("dataset_factory").name)
        if fdef is None or not fdef.signature.output_arg:
            return []
        ref = fdef.ret[fdef.signature.output_arg[0].name].split(":")[0]
        node = _fdef_node(graph, fdef, ref)
        while node is not None and node.type == "Identity":
            node = node.input(0)
        return [node] if node is not None else []
    return [_Node(graph, op=c.inputs[0].op) for c in iterator.outputs[0].consumers()
            if c.type == "MakeIterator"]


def _timestamp_outputs(graph: tf.Graph, mark: str) -> List[tf.Tensor]:
    """The get_next outputs of `graph` whose values are the timestamp marked `mark`."""
    found = []
    for op in graph.get_operations():
        if op.type not in GET_NEXT_TYPES or not op.inputs:
            continue
        datasets = _datasets_of(op.inputs[0].op)
        for i, out in enumerate(op.outputs):
            if any(_carries(d, i, mark) for d in datasets):
                found.append(out)
    return found


class _PendingTimestamp:
    """The timestamp of a Dataset.map function, in the outer graph's
    ASCEND_TIMESTAMP collection until a lookup reads it (see the module
    docstring). Converted to a tensor it is the get_next output of an
    iterator that carries it; before any iterator does, a constant that no
    iterator produces (so no lookup matches it)."""

    def __init__(self, graph: tf.Graph, mark: str):
        self._graph = weakref.ref(graph)
        self.mark = mark
        self._unresolved: Optional[tf.Tensor] = None

    def resolve(self) -> List[tf.Tensor]:
        """The get_next outputs carrying this timestamp; once there are any,
        they replace this entry in the collection."""
        graph = self._graph()
        if graph is None:
            return []
        outputs = _timestamp_outputs(graph, self.mark)
        if outputs:
            ref = graph.get_collection_ref(ASCEND_TIMESTAMP)
            at = next((k for k, v in enumerate(ref) if v is self), None)
            if at is not None:
                fresh = [t for t in outputs if all(t is not v for v in ref)]
                ref[at:at + 1] = fresh
        return outputs

    def tensor(self) -> tf.Tensor:
        outputs = self.resolve()
        if outputs:
            if len(outputs) > 1:
                logger.info("return_timestamp: iterators %s read the same timestamp; each "
                            "lookup takes the one of its own iterator",
                            ", ".join(t.op.name for t in outputs))
            return outputs[-1]
        if self._unresolved is None:
            graph = self._graph()
            with graph.as_default(), graph.name_scope(None):
                self._unresolved = tf.constant(0, tf.int64, name=self.mark + "_unresolved")
        return self._unresolved

    def __repr__(self) -> str:
        return "<return_timestamp %s, no iterator reads it yet>" % self.mark


def _convert_pending(value: _PendingTimestamp, dtype=None, name=None, as_ref=False):
    del name, as_ref
    t = value.tensor()
    return tf.cast(t, dtype) if dtype is not None and dtype != t.dtype else t


tf.register_tensor_conversion_function(_PendingTimestamp, _convert_pending)


def _outermost(graph: tf.Graph) -> tf.Graph:
    while isinstance(graph, FuncGraph) and graph.outer_graph is not None:
        graph = graph.outer_graph
    return graph


# --------------------------------------------------------------------------
# The ops object
# --------------------------------------------------------------------------

class HostPipelineOps:
    """mxRec's host-pipeline op module: set_threshold, return_timestamp,
    clear_channel (see the module docstring)."""

    def __init__(self, so_pkg_name: str = LIBASC_OPS_SO):
        self.so_pkg_name = so_pkg_name

    def set_threshold(self, threshold: Any, emb_name: Union[None, str, Sequence[str]] = None,
                      ids_name: Union[None, str, Sequence[str]] = None,
                      name: Optional[str] = None) -> tf.Operation:
        """An op that, when run, sets the admission threshold of the tables
        `emb_name` (a name or a list) to `threshold` sightings (an int or an
        integer scalar tensor, 1 to 2^31-1). mxRec's ids_name has no effect
        when emb_name is given; alone, it names a FeatureSpec or a
        sparse_lookup(name=...) whose table is meant. Neither: every table.
        Ids seen before the op ran keep their counts. As in the table's
        configuration, a key is admitted when its sightings, each weighing
        the faae_coefficient of the lookup (FeatureSpec) that saw it, reach
        `threshold`; the op's output is the previous threshold."""
        tables = _tables_for(emb_name, ids_name)
        with tf.name_scope(name or "dynemb_set_threshold"):
            value = _threshold_tensor(threshold)
            for table in tables:
                # Checked now, not only when the op runs: a typo fails here.
                with _lib.table_handle(table, ValueError(
                        "set_threshold(emb_name=%r): no table of that name; create it with "
                        "create_table() first" % table)):
                    pass
            ops = [_lib.ops.dynemb_set_access_threshold(
                threshold=value, table_name=t).op for t in tables]
        return ops[0] if len(ops) == 1 else tf.group(*ops)

    def return_timestamp(self, tensor: Any) -> tf.Tensor:
        """The batch's timestamp `tensor` (any integer or float tensor of
        seconds) as int64, and the clock of the train lookups that read the
        same iterator: admission stamps and data-time eviction use it. Call
        it in the Dataset.map function that adds the timestamp to the
        element (or on the get_next output)."""
        t = tf.convert_to_tensor(tensor)
        if not (t.dtype.is_integer or t.dtype.is_floating):
            raise TypeError("return_timestamp: the timestamp must be a number tensor "
                            "(seconds), got %s" % t.dtype.name)
        graph = tf.compat.v1.get_default_graph()
        mark = "%s_%d" % (_MARK_PREFIX, next(_MARKS))
        out = tf.identity(tf.cast(t, tf.int64), name=mark)
        outer = _outermost(graph)
        if outer is graph:
            outer.add_to_collection(ASCEND_TIMESTAMP, out)
        else:
            # The op's name in its function graph is what _carries looks for.
            outer.add_to_collection(ASCEND_TIMESTAMP, _PendingTimestamp(outer, out.op.name))
        return out

    def clear_channel(self, channel_id: Any) -> tf.Operation:
        """mxRec drops the batches still queued in the host-to-device data
        channel `channel_id` (before an evaluation round, so that it reads
        the freshly initialized data). dynemb has no such channel: a
        pipeline's queued batches live in its tf.data iterator, and running
        the iterator's initializer (get_initializer) discards them. So this
        is a no-op op; channel_id must be one of
        get_training_mode_channel_id's values (0 train, 1 eval)."""
        if isinstance(channel_id, bool) or not isinstance(channel_id, (int, tf.Tensor)):
            value = tf.get_static_value(channel_id) if channel_id is not None else None
            if value is None:
                raise TypeError("clear_channel: channel_id must be an int from "
                                "train_params_config.get_training_mode_channel_id(...), got %r"
                                % (channel_id,))
            channel_id = int(value)
        if isinstance(channel_id, int) and channel_id not in (TRAIN_CHANNEL, EVAL_CHANNEL):
            raise ValueError("clear_channel: channel_id = %d; dynemb's channels are %d "
                             "(training) and %d (evaluation)"
                             % (channel_id, TRAIN_CHANNEL, EVAL_CHANNEL))
        return tf.no_op(name="dynemb_clear_channel")


_OPS: Dict[str, HostPipelineOps] = {}


def import_host_pipeline_ops(so_pkg_name: str = LIBASC_OPS_SO) -> HostPipelineOps:
    """The object holding mxRec's host-pipeline ops. so_pkg_name names
    mxRec's library (1 to 100 characters); dynemb loads no library for it,
    its ops are in dynemb's own."""
    if not isinstance(so_pkg_name, str) or not 1 <= len(so_pkg_name) <= 100:
        raise ValueError("import_host_pipeline_ops: so_pkg_name must be a string of 1 to "
                         "100 characters, got %r" % (so_pkg_name,))
    if so_pkg_name not in _OPS:
        _OPS[so_pkg_name] = HostPipelineOps(so_pkg_name)
    return _OPS[so_pkg_name]


# ConfigInitializer.get_instance().host_pipeline_ops is this object (mxRec's
# class attribute holds import_host_pipeline_ops()).
_state.HOST_PIPELINE_OPS["default"] = import_host_pipeline_ops()

__all__ = ["EVAL_CHANNEL", "HostPipelineOps", "TRAIN_CHANNEL", "import_host_pipeline_ops"]
