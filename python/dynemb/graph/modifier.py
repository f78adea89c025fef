"""Automatic graph modification (mxRec: ``mx_rec.graph.modifier``).

This module is mxRec's import path only; the code lives in
dynemb.graph.modification (how lookups' input pipelines are rebuilt) and
dynemb.graph.rewrite (how lookup and apply ops are switched to them).
"""
from dynemb.graph.modification import (DEFAULT_DUMP_DIR, DEFAULT_PREFETCH, DUMP_DIR_ENV,
                                       GraphModifierHook, get_initializer,
                                       modify_graph_and_start_emb_cache)
from dynemb.graph.rewrite import GraphModificationError

__all__ = ["GraphModifierHook", "GraphModificationError", "get_initializer",
           "modify_graph_and_start_emb_cache"]
