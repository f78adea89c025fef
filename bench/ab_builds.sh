#!/bin/bash
# Alternates dynemb training-throughput runs of several builds, so that a
# noisy shared machine slows them alike; prints one "name samples/s" line per
# run, then the median per build.
#
#   bench/ab_builds.sh ROUNDS NAME=TREE [NAME=TREE ...]
#
# TREE is a source tree with a built op library (build/tf/_dynemb_ops.so and
# python/dynemb), e.g. a `git worktree` of another commit after `make ops`;
# an empty TREE means this tree. Each run is
#   bench/tf_train.py --variants dynemb --repeats 2 --steps 150 --json
# with that tree's package and op library.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:?usage: bench/ab_builds.sh ROUNDS NAME=TREE ...}
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
  for spec in "$@"; do
    name=${spec%%=*}
    tree=${spec#*=}
    tree=${tree:-$here}
    sps=$(PYTHONPATH="$tree/python" DYNEMB_OPS_LIB="$tree/build/tf/_dynemb_ops.so" \
          "$here/.venv/bin/python" "$here/bench/tf_train.py" --variants dynemb \
          --repeats 2 --steps 150 --json 2>/dev/null | tail -1 |
          "$here/.venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["dynemb_samples_per_s"])')
    echo "$name $sps" | tee -a "$out"
  done
done
echo "median samples/s per build:"
"$here/.venv/bin/python" - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, value = line.split()
    runs[name].append(int(value))
for name, values in runs.items():
    print(f"{name} {statistics.median(values):.0f} {values}")
PY
