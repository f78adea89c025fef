"""mxRec's end-of-sequence dataset: ``Dataset.eos_map``.

On several ranks every train step exchanges with every other rank, so all
ranks must run the same number of steps. When one rank's data ends before
the others', the others wait in an exchange that never comes and fail at
its deadline (docs/distributed.md). mxRec's scripts avoid that with
``dataset.eos_map(librec, channel_id, max_train_steps, max_eval_steps)``
(``librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)``), applied before
the FeatureSpec insert function. dynemb gives it this effect:

- the dataset ends after at most ``max_train_steps`` (channel 0, training)
  or ``max_eval_steps`` (channel 1, evaluation) elements; a value <= 0 sets
  no limit;
- on several ranks it ends on every rank at the first element some rank no
  longer has: before each element the ranks agree, with one all-reduce of a
  "have one more" flag in tf.data's threads, whether every rank has it. So
  every rank's iterator raises OutOfRangeError at the same step, and the
  training loop (or Estimator) ends on every rank at once. Ranks with more
  data drop their remainder, as mxRec does.

The agreement is an exchange on a channel of its own (numbered when the
dataset is built, in the same order on every rank). Each epoch ends with
every rank having made the same number of agreements, so a re-initialized
iterator starts in step on every rank.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dynemb import _state
from dynemb.constants.constants import EVAL_CHANNEL_ID, TRAIN_CHANNEL_ID
from dynemb.util.log import logger

TRAIN_CHANNEL, EVAL_CHANNEL = TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"eos_map: {what} must be an int (<= 0: no limit), got {value!r}")
    return value


def _filler(spec: tf.TensorSpec) -> tf.Tensor:
    """A tensor that fits `spec`, for the element that marks the end."""
    shape = [0] if spec.shape.rank is None else [d if d is not None else 0
                                                  for d in spec.shape.as_list()]
    if spec.dtype == tf.string:
        value = tf.constant("", tf.string)
    elif spec.dtype == tf.bool:
        value = tf.constant(False)
    else:
        value = tf.zeros([], spec.dtype)
    return tf.fill(shape, value)


def eos_map(dataset: tf.data.Dataset, libreco: Any, channel_id: int,
            max_train_steps: int = -1, max_eval_steps: int = -1) -> tf.data.Dataset:
    """The dataset, ending after the channel's step limit and, on several
    ranks, on every rank at once (see the module docstring)."""
    if not hasattr(libreco, "so_pkg_name"):  # dynemb.util.ops.HostPipelineOps
        raise TypeError("eos_map: the first argument must be the object "
                        "import_host_pipeline_ops(LIBREC_EOS_OPS_SO) returns, got %r"
                        % (libreco,))
    if isinstance(channel_id, bool) or channel_id not in (TRAIN_CHANNEL, EVAL_CHANNEL):
        raise ValueError(f"eos_map: channel_id must be {TRAIN_CHANNEL} (training) or "
                         f"{EVAL_CHANNEL} (evaluation), got {channel_id!r}")
    limit = _int(max_train_steps if channel_id == TRAIN_CHANNEL else max_eval_steps,
                 "max_train_steps" if channel_id == TRAIN_CHANNEL else "max_eval_steps")
    _int(max_eval_steps if channel_id == TRAIN_CHANNEL else max_train_steps,
         "max_eval_steps" if channel_id == TRAIN_CHANNEL else "max_train_steps")
    if limit > 0:
        dataset = dataset.take(limit)
    ranks = _state.get_rank_size()
    if ranks <= 1:
        return dataset
    specs = tf.nest.flatten(dataset.element_spec)
    if not all(isinstance(s, tf.TensorSpec) for s in specs):
        raise TypeError("eos_map: on several ranks the dataset's elements must be tensors "
                        "(no sparse or ragged components); convert them after eos_map")
    structure = dataset.element_spec
    channel = _state.next_exchange_channel()

    def tag(*x):  # tf.data passes a tuple's parts (not a namedtuple's) as arguments
        return tf.constant(1.0), (x if type(structure) is tuple else x[0])

    def agree(flag, element):
        total = _state.sharded_ops().dynemb_allreduce(
            tensors=[tf.reshape(flag, [1])], reduction="sum", channel=channel,
            ranks=ranks)[0]
        return tf.reshape(total, []), element

    end = tf.data.Dataset.from_tensors(
        (tf.constant(0.0), tf.nest.pack_sequence_as(structure,
                                                    [_filler(s) for s in specs])))
    out = (dataset.map(tag).concatenate(end).map(agree)
           .take_while(lambda total, _e: total > ranks - 0.5)
           .map(lambda _t, element: element))
    logger.info("eos_map: channel %d ends on all %d ranks at once%s", channel_id, ranks,
                f" (at most {limit} steps)" if limit > 0 else "")
    return out


def patch_dataset() -> None:
    """Gives tf.data datasets mxRec's ``eos_map`` method."""
    def method(self, libreco, channel_id, max_train_steps=-1, max_eval_steps=-1):
        return eos_map(self, libreco, channel_id, max_train_steps, max_eval_steps)

    method.__doc__ = eos_map.__doc__
    tf.data.Dataset.eos_map = method
