#!/usr/bin/env bash
# Runs every test binary that `make test` built, then the Python/TensorFlow
# tests, and ends with one line "N passed, N failed" over all of them.
# Exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0
count() {  # count PASS/FAIL lines of a C test's output; a crash is a failure
  local out="$1" rc="$2" p f
  p=$(grep -c '^PASS ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out")
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
}
for t in build/asan/test_* build/tsan/tsan_*; do
  [ -x "$t" ] || continue
  echo "== $t"
  out=$(ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        TSAN_OPTIONS=halt_on_error=1 "$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^PASS ' | tail -n 40
  count "$out" "$rc"
done
if [ -x build/fuzz/fuzz_ckpt ]; then
  echo "== fuzz_ckpt (20 s)"
  mkdir -p build/fuzz/corpus
  if build/fuzz/fuzz_ckpt -max_total_time=20 -print_final_stats=0 \
       build/fuzz/corpus tests/fuzz/seeds >build/fuzz/log.txt 2>&1; then
    echo "PASS fuzz_ckpt"; passed=$((passed + 1))
  else
    tail -n 30 build/fuzz/log.txt; echo "FAIL fuzz_ckpt"; failed=$((failed + 1))
  fi
fi
if [ -x .venv/bin/python ] && [ -d tests/py ] && ls tests/py/test_*.py >/dev/null 2>&1; then
  echo "== pytest"
  out=$(.venv/bin/python -m pytest -q tests/py 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 60
  line=$(grep -E '[0-9]+ (passed|failed)' <<<"$out" | tail -n 1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); p=${p:-0}
  f=$(grep -oE '[0-9]+ (failed|error|errors)' <<<"$line" | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
