"""Automatic graph modification (mxRec: ``mx_rec.graph``): see dynemb.graph.modifier.

The package also holds what modifier is built from (trace, pipeline, rewrite,
modification), which the rest of dynemb imports; so that importing those does
not import modifier, which sits above them, modifier's names are loaded here
when first asked for.
"""
_MODIFIER = ["GraphModificationError", "GraphModifierHook", "get_initializer",
             "modify_graph_and_start_emb_cache"]
_HOOKS = ["LookupSubgraphSlicerHook", "OrphanLookupKeySlicerHook"]
__all__ = _MODIFIER + _HOOKS


def __getattr__(name: str):
    if name in _MODIFIER:
        from dynemb.graph import modifier
        return getattr(modifier, name)
    if name in _HOOKS:
        from dynemb.graph import hooks
        return getattr(hooks, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
