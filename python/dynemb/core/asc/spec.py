"""FeatureSpec: one id feature of the batch and the table it feeds.

The explicit alternative to automatic graph modification: the script names each
id feature of its batches with a FeatureSpec, maps the dataset with
``get_asc_insert_func(tgt_key_specs=[...])`` (dynemb.core.asc.insert: sends the
ids to the engine in the input pipeline and adds reserved components to each
batch) and looks tables up with ``sparse_lookup(table, spec, batch=batch)``;
``start_asc_pipeline()`` (dynemb.core.asc.lookups) then switches those lookups
to the prepared components before the first step.

mxRec's path for these is ``dynemb.core.asc.feature_spec``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from dynemb import _state
from dynemb.constants.constants import MAX_ACCESS_THRESHOLD

# Reserved batch keys added by the insert function.
RESERVED_PREFIX = "__dynemb__"


def admitted_key(spec_name: str) -> str:
    return f"{RESERVED_PREFIX}/{spec_name}/admitted"


def stamp_key(spec_name: str) -> str:
    """The clock value (int64 scalar) the spec's batch was prepared with:
    the rows' last access, which eviction counts from."""
    return f"{RESERVED_PREFIX}/{spec_name}/stamp"


def tickets_key(spec_name: str) -> str:
    """Admission tickets of the spec's ids (int64, -1 = not admitted), training
    pipelines only."""
    return f"{RESERVED_PREFIX}/{spec_name}/tickets"


def _nonneg_int(owner: str, field: str, v: Any) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"FeatureSpec('{owner}'): {field} must be an int >= 0 or None, "
                         f"got {v!r}")
    return v


class FeatureSpec:
    """One id feature of the batch and the table it feeds.

    name: the feature's name; also its key in the batch dict unless index_key is
    given (a key, or a position for batches that are tuples of tensors).
    table_name: the dynemb table the ids are looked up in (default: name; the
    timestamp feature has none). access_threshold / eviction_threshold: the table's
    admission and eviction settings (as sparse_lookup's access_and_evict_config).
    is_timestamp: this feature holds the batch's data time in seconds; eviction
    then counts data time. batch_size: the number of ids per batch, if static
    (checked at run time when given). faae_coefficient: weight of one occurrence
    in admission counting (a key is admitted when the weights of its
    occurrences, in every spec of its table, add up to access_threshold).
    """

    def __init__(self, name: str, table_name: Optional[str] = None,
                 index_key: Optional[Any] = None, access_threshold: Optional[int] = None,
                 eviction_threshold: Optional[int] = None, is_timestamp: Optional[bool] = None,
                 batch_size: Optional[int] = None, faae_coefficient: Any = 1, **kwargs: Any):
        if kwargs:
            raise TypeError(f"FeatureSpec('{name}'): unexpected arguments {sorted(kwargs)}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"FeatureSpec: name must be a non-empty string, got {name!r}")
        self.name = name
        self.index_key = name if index_key is None else index_key
        if isinstance(self.index_key, bool) or not (
                isinstance(self.index_key, str) and 1 <= len(self.index_key) <= 255 or
                isinstance(self.index_key, int) and 0 <= self.index_key <= 255):
            raise ValueError(f"FeatureSpec('{name}'): index_key must be a batch key (1 to 255 "
                             f"characters) or a tuple position (0 to 255), got {index_key!r}")
        self.is_timestamp = bool(is_timestamp)
        if table_name is None and not self.is_timestamp:
            table_name = name  # (mxRec: the table of the feature's name)
        if self.is_timestamp and (access_threshold not in (None, -1, 0) or
                                  eviction_threshold not in (None, -1)):
            raise ValueError(f"FeatureSpec('{name}'): a timestamp feature has no table, so "
                             f"no access_threshold / eviction_threshold")
        self.table_name = table_name
        # (mxRec's -1: off, as None)
        self.access_threshold = _nonneg_int(name, "access_threshold",
                                            None if access_threshold == -1 else access_threshold)
        self.eviction_threshold = _nonneg_int(
            name, "eviction_threshold", None if eviction_threshold == -1 else eviction_threshold)
        if self.access_threshold is not None and self.access_threshold > MAX_ACCESS_THRESHOLD:
            raise ValueError(f"FeatureSpec('{name}'): access_threshold must be an int in "
                             f"[0, 2^31-1] (or -1 / None: off), got {access_threshold!r}")
        self.batch_size = _nonneg_int(name, "batch_size", batch_size)
        self.faae_coefficient = _state.check_faae(f"FeatureSpec('{name}')", faae_coefficient)
        # Batch key of the timestamp spec of the insert function this spec was
        # given to (set by get_asc_insert_func), or None.
        self.timestamp_key: Optional[Any] = None
        if self.table_name is not None:
            _state.TABLE_OF_SPEC[name] = self.table_name

    def rename(self, name: str) -> None:
        """Gives the spec a name of its own (its batch key stays)."""
        self.name = name
        if self.table_name is not None:
            _state.TABLE_OF_SPEC[name] = self.table_name

    @property
    def access_and_evict_config(self) -> Optional[Dict[str, int]]:
        """The spec's thresholds in sparse_lookup's access_and_evict_config form."""
        if self.access_threshold is None and self.eviction_threshold is None:
            return None
        return {"access_threshold": self.access_threshold or 0,
                "eviction_threshold": self.eviction_threshold,
                "faae_coefficient": self.faae_coefficient}

    def __repr__(self) -> str:
        return (f"FeatureSpec({self.name!r}, table_name={self.table_name!r}, "
                f"index_key={self.index_key!r}, access_threshold={self.access_threshold}, "
                f"eviction_threshold={self.eviction_threshold}, "
                f"is_timestamp={self.is_timestamp})")

