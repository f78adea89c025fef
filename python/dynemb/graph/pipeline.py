"""Rebuilding a tf.data iterator with extra, precomputed components.

Given the ``IteratorGetNext`` op of a user's iterator, `extend_iterator`:

1. recovers the dataset the iterator reads: for ``make_initializable_iterator``
   (and ``Iterator.from_structure`` + ``make_initializer``) the dataset variant
   tensor given to its ``MakeIterator`` op; for ``make_one_shot_iterator`` the
   ``OneShotIterator``'s ``dataset_factory`` function, called through a
   ``StatefulPartitionedCall``. The variant becomes a Dataset again with
   ``tf.data.experimental.from_variant`` and the flat element signature read from
   the ``IteratorGetNext`` op;
2. builds ``dataset.map(fn).prefetch(n)`` where ``fn`` returns the original flat
   components followed by the extra ones (computed in tf.data's threads, ahead of
   the training step), and a new iterator of the same kind over it; with a
   ``start_fn``, each element also gets its position in the pass and a value
   read once, when the pass's first element is made (``enumerate`` and
   ``scan`` ahead of the map: the clock of the step that will train it);
3. moves every consumer of the old ``get_next`` outputs to the new ones
   (``Operation._update_input``; must happen before the graph first runs), and
   chains the new initializer to the old one (a control input of the old
   ``MakeIterator``), so that ``sess.run(iterator.initializer)`` or Estimator's
   own dataset hook still initializes what the graph now reads.

At exit, sessions still open on a graph whose pipeline prepares batches
ahead (rebuilt here, or FeatureSpec mode's) are deleted while the interpreter
is whole (``delete_sessions_at_exit``): the pipeline keeps running the
script's own input functions (a ``from_generator`` generator, a
``py_function``) in tf.data's threads; once Python's finalization has begun
such a thread dies where it waits for the GIL, and TensorFlow's own deletion
of the session at teardown could wait for it for ever.

Fetching the old ``get_next`` tensors directly (``sess.run(next_batch)``) still
reads the old iterator: those fetches are not graph edges and cannot be moved.
"""

from __future__ import annotations

import atexit
import gc
import weakref
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.ops import gen_functional_ops

from dynemb import _state
from dynemb.util.log import logger

# Graphs whose pipelines prepare batches ahead: their sessions are deleted at exit.
_AHEAD_GRAPHS: "weakref.WeakSet[tf.Graph]" = weakref.WeakSet()


class PipelineError(ValueError):
    """An iterator's input pipeline cannot be rebuilt."""


@dataclass
class ExtendedIterator:
    old_get_next: tf.Operation
    new_get_next: tf.Operation
    extras: List[tf.Tensor]              # new get_next outputs after the old ones
    initializers: List[tf.Operation]     # one per dataset; empty for one-shot iterators
    one_shot: bool

    @property
    def iterator_name(self) -> str:
        return self.old_get_next.inputs[0].op.name


def _element_spec(get_next: tf.Operation) -> tuple:
    shapes = get_next.get_attr("output_shapes")
    types = get_next.get_attr("output_types")
    return tuple(tf.TensorSpec(tf.TensorShape(s), tf.dtypes.as_dtype(t))
                 for s, t in zip(shapes, types))


def _dataset_sources(get_next: tf.Operation):
    """(one_shot, [(variant tensor, MakeIterator op or None)]) for the iterator."""
    resource = get_next.inputs[0]
    it = resource.op
    if it.type == "OneShotIterator":
        factory = it.get_attr("dataset_factory")
        variant = gen_functional_ops.stateful_partitioned_call(
            args=[], Tout=[tf.variant], f=factory, name="dataset_factory_call")[0]
        return True, [(variant, None)]
    if it.type in ("IteratorV2", "Iterator"):
        makers = [c for c in resource.consumers() if c.type == "MakeIterator"]
        if not makers:
            raise PipelineError(
                f"automatic graph modification: iterator '{it.name}' has no initializer "
                f"(MakeIterator op); create it with "
                f"tf.compat.v1.data.make_initializable_iterator(dataset) or "
                f"make_one_shot_iterator(dataset).")
        return False, [(m.inputs[0], m) for m in makers]
    raise PipelineError(
        f"automatic graph modification: iterator op '{it.name}' of type {it.type} is not "
        f"supported (feedable/string-handle and anonymous iterators cannot be rebuilt); "
        f"use tf.compat.v1.data.make_initializable_iterator or make_one_shot_iterator.")


def extend_iterator(get_next: tf.Operation, extra_fn: Callable[..., List[tf.Tensor]], *,
                    prefetch: int = 2, name: str = "dynemb_pipeline",
                    start_fn: Optional[Callable[[], tf.Tensor]] = None) -> ExtendedIterator:
    """Rebuilds `get_next`'s pipeline with ``extra_fn``'s components appended.

    `extra_fn` is called inside the new map function (once per dataset), with the element's
    flat components (tensors of that function's graph, in ``get_next`` output
    order) and returns the extra tensors. `prefetch` > 0 lets the pipeline (and so
    extra_fn's side effects) run that many batches ahead of the step.
    `start_fn` (an int64 scalar >= 0, built inside tf.data's functions): extra_fn
    is then called as extra_fn(components, index, start), `index` the element's
    position since the iterator was (re)initialized and `start` start_fn's
    value when that pass made its first element.
    """
    graph = get_next.graph
    spec = _element_spec(get_next)
    n_old = len(spec)
    with graph.as_default(), tf.name_scope(name):
        one_shot, sources = _dataset_sources(get_next)

        def fn(*components):
            extras = list(extra_fn(list(components)))
            return tuple(components) + tuple(extras)

        def counted_fn(index, start, components):
            extras = list(extra_fn(list(components), index, start))
            return tuple(components) + tuple(extras)

        def first_start(state, element):
            index, components = element
            start = tf.where(state < 0, tf.cast(start_fn(), tf.int64), state)
            return start, (index, start, components)

        new_iter = None
        new_inits: List[tf.Operation] = []
        for variant, _maker in sources:
            ds = tf.data.experimental.from_variant(variant, spec)
            if start_fn is None:
                ds = ds.map(fn)
            else:
                ds = ds.enumerate().scan(tf.constant(-1, tf.int64), first_start).map(counted_fn)
            if prefetch > 0:
                ds = ds.prefetch(prefetch)
            if one_shot:
                new_iter = tf.compat.v1.data.make_one_shot_iterator(ds)
            elif new_iter is None:
                new_iter = tf.compat.v1.data.make_initializable_iterator(ds)
                new_inits.append(new_iter.initializer)
            else:  # another dataset of a reinitializable iterator
                new_inits.append(new_iter.make_initializer(ds))
        flat = tf.nest.flatten(new_iter.get_next())
    new_get_next = flat[0].op
    structures = _state.graph_state(graph).batch_structures
    if get_next.name in structures:  # the new batch has the old one's shape
        old_structure = structures[get_next.name]  # (its leaves lead the outputs)
        structures[new_get_next.name] = tf.nest.pack_sequence_as(
            old_structure, flat[:len(tf.nest.flatten(old_structure))])
    for old, new in zip(get_next.outputs, flat[:n_old]):
        new.set_shape(old.shape)
        replace_uses(old, new)
    for (_variant, maker), init in zip(sources, new_inits):
        if maker is not None:
            maker._add_control_input(init)  # pylint: disable=protected-access
    return ExtendedIterator(old_get_next=get_next, new_get_next=new_get_next,
                            extras=flat[n_old:], initializers=new_inits, one_shot=one_shot)


def replace_uses(old: tf.Tensor, new: tf.Tensor, keep: Sequence[tf.Operation] = ()) -> int:
    """Makes every consumer of `old` (except ops in `keep`) read `new`."""
    count = 0
    keep_names = {op.name for op in keep}
    for consumer in list(old.consumers()):
        if consumer.name in keep_names:
            continue
        for i, inp in enumerate(consumer.inputs):
            if inp is old or inp.name == old.name:
                consumer._update_input(i, new)  # pylint: disable=protected-access
                count += 1
    return count


def delete_sessions_at_exit(graph: tf.Graph) -> None:
    """Marks `graph` as one whose sessions are deleted at exit (module docstring)."""
    _AHEAD_GRAPHS.add(graph)


def _delete_open_sessions() -> None:
    """Deletes the sessions a script left open on the marked graphs, as
    TensorFlow itself would at teardown, but while the interpreter is whole,
    so their input threads finish (module docstring). Registered after
    dynemb's terminate (dynemb._state is imported first), so it runs before it."""
    if not len(_AHEAD_GRAPHS):
        return
    from tensorflow.python.client.session import BaseSession
    for obj in gc.get_objects():
        if isinstance(obj, BaseSession) and getattr(obj, "_session", None) is not None \
                and obj.graph in _AHEAD_GRAPHS:
            try:
                obj.__del__()  # close, then TF_DeleteSession; a second call does nothing
            except Exception as e:  # shutdown must not raise
                logger.warning("closing a session at exit: %s", e)


atexit.register(_delete_open_sessions)

