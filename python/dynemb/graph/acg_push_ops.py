"""mxRec's ``mx_rec.graph.acg_push_ops``: the hook that moves the graph's
string-parsing ops into the dataset (dynemb.graph.slicing)."""
from dynemb.graph.slicing import ACGPushOpsToDatasetHook, push_ops_to_dataset

__all__ = ["ACGPushOpsToDatasetHook", "push_ops_to_dataset"]
