"""mxRec's ``mx_rec.graph.hooks``: the slicing hooks (dynemb.graph.slicing)."""
from dynemb.graph.slicing import LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook

__all__ = ["LookupSubgraphSlicerHook", "OrphanLookupKeySlicerHook"]
