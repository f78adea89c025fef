"""Automatic graph modification (mxRec: ``mx_rec.graph``): see dynemb.graph.modifier."""
from dynemb.graph.modifier import (GraphModificationError, GraphModifierHook, get_initializer,
                                   modify_graph_and_start_emb_cache)

__all__ = ["GraphModificationError", "GraphModifierHook", "get_initializer",
           "modify_graph_and_start_emb_cache"]
