"""Constants with mxRec's names (``mx_rec.constants.constants``)."""
from enum import Enum

# Graph collection holding a data-timestamp tensor (seconds). When present,
# eviction thresholds count seconds of data time.
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
# Graph collections of mxRec's "by address" training path (init(
# use_dynamic_expansion=True)): each train lookup adds its looked-up rows
# (LOCAL_EMB, [ids, dim]) and its "address" tensor (ID_OFFSET, and the same
# tensor in UNIQUE_KEYS, [ids]); tf.gradients(loss, rows) with those
# addresses is what the ByAddr optimizers apply (dynemb.optimizers.*_by_addr).
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
# Graph collection of the sparse "variables" (one anchor tensor per table);
# tf.gradients(loss, anchor) yields the table's IndexedSlices gradient.
DYNEMB_SPARSE_VARIABLES = "DYNEMB_SPARSE_VARIABLES"
# mxRec's name for the same collection, the default of
# train_params_config.ascend_global_hashtable_collection: it holds the same
# anchors.
ASCEND_GLOBAL_HASHTABLE_COLLECTION = "ASCEND_GLOBAL_HASHTABLE_COLLECTION"

# File names of mxRec's custom-op libraries: the default of
# import_host_pipeline_ops(so_pkg_name=...) and the end-of-sequence dataset
# ops. They are names only: dynemb loads no such library (its ops are in
# _dynemb_ops.so, found by dynemb._lib).
# Data channels of the train and eval pipelines (mxRec's ids: what
# get_training_mode_channel_id, clear_channel and eos_map take).
TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID = 0, 1

# The largest access_threshold (mxRec's int32 range): admission counts
# saturate there, so a higher threshold would never admit a key.
MAX_ACCESS_THRESHOLD = 2 ** 31 - 1

LIBASC_OPS_SO = "libasc_ops.so"
LIBREC_EOS_OPS_SO = "librec_eos_ops.so"
# (mxRec's examples pass it to import_host_pipeline_ops for return_timestamp)
LIBREC_TF_REC_V1_CPU_SO = "librec_tf_rec_v1_cpu.so"


class BaseEnum(Enum):
    """Enum whose members are looked up by value (mxRec's ``mapping``)."""

    @classmethod
    def mapping(cls, key):
        """The member whose value is `key`, or, for a member of any BaseEnum,
        whose value is `key.value`. KeyError, naming the valid values, if none."""
        value = key.value if isinstance(key, BaseEnum) else key
        for m in cls:
            if m.value == value:
                return m
        raise KeyError("%r is not a value of %s; use one of %s"
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


class All2allGradientsOp(BaseEnum):
    """create_table(all2all_gradients_op=...): how a table's gradients from
    all ranks are combined, summed or summed and divided by the rank count.
    With one process both leave the gradient as it is."""
    SUM_GRADIENTS = "sum_gradients"
    SUM_GRADIENTS_AND_DIV_BY_RANKSIZE = "sum_gradients_and_div_by_ranksize"


class CacheModeEnum(BaseEnum):
    """Where a table's rows live, by the names mxRec's examples use to pick
    table sizes: HBM (device_vocabulary_size only), DDR (plus
    host_vocabulary_size), SSD (plus ssd_vocabulary_size). In dynemb the
    device and host rows are both host memory, and SSD is the file tier."""
    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"
