"""Constants with mxRec's names (``mx_rec.constants.constants``)."""
from enum import Enum

# Graph collection holding a data-timestamp tensor (seconds). When present,
# eviction thresholds count seconds of data time.
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
# Graph collection of the sparse "variables" (one anchor tensor per table);
# tf.gradients(loss, anchor) yields the table's IndexedSlices gradient.
DYNEMB_SPARSE_VARIABLES = "DYNEMB_SPARSE_VARIABLES"


class BaseEnum(Enum):
    """Enum whose members can be looked up by value, with a clear error."""

    @classmethod
    def mapping(cls, key):
        for m in cls:
            if m.value == key or m.name == key:
                return m
        raise ValueError("%r is not a valid %s; use one of %s"
                         % (key, cls.__name__, [m.value for m in cls]))

    @classmethod
    def values(cls):
        return [m.value for m in cls]


class ApplyGradientsStrategy(BaseEnum):
    """How gradients of repeated ids are applied. dynemb always sums the
    gradients of a repeated id and updates its row once (TensorFlow's
    IndexedSlices semantics), which is SUM_SAME_ID_GRADIENTS_AND_APPLY;
    DIRECT_APPLY is accepted for compatibility and behaves the same."""
    DIRECT_APPLY = "direct_apply"
    SUM_SAME_ID_GRADIENTS_AND_APPLY = "sum_same_id_gradients_and_apply"
