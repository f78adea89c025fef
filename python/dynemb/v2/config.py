"""``init(toml_path)``: the second generation's start, from mxRec's TOML file.

The file has three parts (api/initialization_of_the_training_framework.md
and the little demo's demo.toml):

* ``[mxrec]`` (mandatory): ``log_level`` and ``use_ranktable``, and with
  ``use_ranktable = false`` the ``[mxrec.cm-node-info]`` table of HCCL's
  cluster settings;
* ``[model]``: ``mode``, ``deterministic``, ``saved_path`` and the step
  counts, which the script reads itself (mxRec's demo does); checked here
  so that a typo fails at init, naming the key;
* ``[model.distribution]``: ``interface``, ``local_rank_size``,
  ``num_server``.

Every entry is checked for its type and range, and an error names the key
(``[section] key``) and what it must be. Ranks come from the MPI launch, as
for the first generation: the rank-table and cm-node settings describe an
Ascend HCCL cluster and are checked but not used (docs/mxrec-v2.md).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from dynemb.util import initialize
from dynemb.util.log import logger

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover (older Pythons: the tomli package)
    import tomli as _toml  # type: ignore[no-redef]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MODES = ("train_and_evaluate", "load_and_train", "predict")

# The settings of the last init() (the parsed file, checked), for scripts
# and tests that want them back: get_config().
_LAST: dict[str, Any] = {}


class TomlConfigError(ValueError):
    """An entry of init()'s TOML file is missing or invalid (the message
    names the file, the section and the key)."""


def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


# section -> key -> (check, what it must be, required)
_SCHEMA: dict[str, dict[str, tuple]] = {
    "mxrec": {
        "log_level": (lambda v: v in LOG_LEVELS, "one of %s" % ", ".join(LOG_LEVELS), True),
        "use_ranktable": (_flag, "true or false", True),
    },
    "mxrec.cm-node-info": {
        "cm_chief_ip": (_text, "a non-empty string (an IP address)", True),
        "cm_chief_port": (_int_in(0, 65535), "an integer in [0, 65535]", True),
        "cm_chief_device": (_int_in(0, 2**31 - 1), "an integer >= 0", True),
        "cm_worker_ip": (_text, "a non-empty string (an IP address)", True),
        "cm_worker_size": (_int_in(1, 2**31 - 1), "an integer >= 1", True),
    },
    "model": {
        "mode": (lambda v: v in MODES, "one of %s" % ", ".join(MODES), False),
        "deterministic": (_flag, "true or false", False),
        "saved_path": (_text, "a non-empty string (a directory)", False),
        "train_steps": (_int_in(0, 2**63 - 1), "an integer >= 0", False),
        "train_interval": (_int_in(1, 2**63 - 1), "an integer >= 1", False),
        "eval_steps": (_int_in(0, 2**63 - 1), "an integer >= 0", False),
        "batch_number": (_int_in(1, 2**63 - 1), "an integer >= 1", False),
    },
    "model.distribution": {
        "interface": (_text, "a non-empty string (a network interface name)", False),
        "local_rank_size": (_int_in(1, 2**31 - 1), "an integer >= 1", False),
        "num_server": (_int_in(1, 2**31 - 1), "an integer >= 1", False),
    },
}


def _section(doc: dict, dotted: str) -> Any:
    """The table at `dotted` ("model.distribution"), or None."""
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _check(doc: dict, path: str) -> None:
    def fail(section: str, key: str, problem: str) -> None:
        raise TomlConfigError("mxrec init('%s'): [%s] %s %s" % (path, section, key, problem))

    if not isinstance(doc.get("mxrec"), dict):
        raise TomlConfigError("mxrec init('%s'): the [mxrec] table is missing; it is "
                              "mandatory (log_level, use_ranktable)" % path)
    for section, keys in _SCHEMA.items():
        table = _section(doc, section)
        if table is None:
            # (only the cluster settings are needed, and only without a rank table)
            if section == "mxrec.cm-node-info" and doc["mxrec"].get("use_ranktable") is False:
                raise TomlConfigError(
                    "mxrec init('%s'): [mxrec.cm-node-info] is missing: use_ranktable = "
                    "false reads the cluster from it; add it, or set use_ranktable = true"
                    % path)
            continue
        if not isinstance(table, dict):
            fail(section.rpartition(".")[0] or section, section.rpartition(".")[2],
                 "must be a table")
        for key, (ok, what, required) in keys.items():
            if key not in table:
                if required:
                    fail(section, key, "is missing; it must be %s" % what)
                continue
            if not ok(table[key]):
                fail(section, key, "= %r is invalid; it must be %s" % (table[key], what))
        for key in sorted(set(table) - set(keys)):
            if not isinstance(table[key], dict):
                logger.warning("mxrec init('%s'): [%s] %s is not a setting of mxRec's "
                               "file; it is ignored", path, section, key)


def init(toml_path: str) -> None:
    """Starts the second generation from the TOML file at `toml_path`
    (a path of 1 to 1024 characters). Raises TomlConfigError naming the
    section and key of a missing or invalid entry, FileNotFoundError for a
    missing file."""
    if not isinstance(toml_path, (str, os.PathLike)):
        raise TypeError("mxrec init(toml_path): pass the path of the TOML file as a "
                        "string, got %r" % (toml_path,))
    path = os.fspath(toml_path)
    if not 1 <= len(path) <= 1024:
        raise ValueError("mxrec init(toml_path): the path must have 1 to 1024 characters, "
                         "got %d" % len(path))
    try:
        with open(path, "rb") as f:
            doc = _toml.load(f)
    except FileNotFoundError:
        raise FileNotFoundError("mxrec init('%s'): no such file; pass the path of the "
                                "TOML configuration (mxRec's demo.toml layout)" % path) \
            from None
    except _toml.TOMLDecodeError as e:
        raise TomlConfigError("mxrec init('%s'): not valid TOML: %s" % (path, e)) from None
    _check(doc, path)
    logger.setLevel(getattr(logging, doc["mxrec"]["log_level"]))
    model = doc.get("model", {})
    # The first generation's settings: fixed-capacity tables (no dynamic
    # expansion), as the second generation documents them.
    initialize.init(train_steps=model.get("train_steps", -1),
                    eval_steps=model.get("eval_steps", -1),
                    use_dynamic_expansion=False)
    _LAST.clear()
    _LAST.update(doc)


def get_config() -> dict:
    """The settings the last init() read (a copy; {} before init)."""
    import copy
    return copy.deepcopy(_LAST)
