"""mxRec's ``mx_rec.graph.slicers``: the slicer objects behind the hooks
(dynemb.graph.slicing)."""
from dynemb.graph.slicing import LookupSubgraphSlicer, OrphanLookupKeySlicer, SlicingError

__all__ = ["LookupSubgraphSlicer", "OrphanLookupKeySlicer", "SlicingError"]
