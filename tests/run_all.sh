#!/usr/bin/env bash
# Runs the tests that make built and ends with one line "N passed, N failed"
# over all of them (skipped tests are in neither count; CI reads that line).
# Exits non-zero if anything failed.
#
#   tests/run_all.sh c [PROGRAM [TEST...]]   the C tests (`make check`): every
#        program of build/asan, build/tsan, build/plain, the checkpoint fuzzer
#        (where it was built), the MPI exchange tests of build/mpi under
#        mpirun on 2 and 3 ranks, and tests/install_test.sh; or the one PROGRAM
#        (test_table, fuzz_ckpt, install_test), with only its TEST functions
#   tests/run_all.sh py    the Python/TensorFlow tests on the pinned
#        TensorFlow, and unless TF_COMPAT=0 once more on the newer TensorFlow
#        of $TF_COMPAT_VENV with the same op library
#   tests/run_all.sh all   both (`make test`)
set -u
cd "$(dirname "$0")/.."
mode=${1:-all}
only=${2:-}
case "$mode" in
  c|py|all) ;;
  *) echo "usage: tests/run_all.sh c|py|all [PROGRAM [TEST...]]" >&2; exit 2 ;;
esac
shift $(($# < 2 ? $# : 2))  # what is left: test function names
passed=0; failed=0
count() {  # count PASS/FAIL lines of a C test's output; a crash is a failure
  local out="$1" rc="$2" p f
  p=$(grep -c '^PASS ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out")
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
}
run_counted() {  # LABEL COMMAND...: runs a C test program, counted
  local out rc
  echo "== $1"; shift
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^PASS ' | tail -n 40
  count "$out" "$rc"
}
wanted() { [ -z "$only" ] || [ "$only" = "$1" ]; }  # PROGRAM given: only it
c_tests() {
  local t
  for t in build/asan/test_* build/tsan/tsan_* build/plain/plain_*; do
    [ -x "$t" ] && wanted "$(basename "$t")" || continue
    run_counted "$t" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      TSAN_OPTIONS=halt_on_error=1 "$t" "$@"
  done
  if [ -x build/fuzz/fuzz_ckpt ] && wanted fuzz_ckpt; then
    echo "== fuzz_ckpt (20 s)"
    mkdir -p build/fuzz/corpus
    if build/fuzz/fuzz_ckpt -max_total_time=20 -print_final_stats=0 \
         build/fuzz/corpus tests/fuzz/seeds >build/fuzz/log.txt 2>&1; then
      echo "PASS fuzz_ckpt"; passed=$((passed + 1))
    else
      tail -n 30 build/fuzz/log.txt; echo "FAIL fuzz_ckpt"; failed=$((failed + 1))
    fi
  fi
  # The exchange between processes: 2 and 3 ranks, each run bounded (a
  # hang is a failure, never a stuck CI). vader's single-copy mechanism
  # needs ptrace rights that containers often lack; plain copies serve.
  for t in build/mpi/mpi_*; do
    [ -x "$t" ] && wanted "$(basename "$t")" || continue
    for n in 2 3; do
      run_counted "$t ($n ranks)" env ASAN_OPTIONS=detect_leaks=0 \
        OMPI_MCA_btl_vader_single_copy_mechanism=none \
        timeout -k 5 120 mpirun --oversubscribe --allow-run-as-root -np "$n" "$t" "$@"
    done
  done
  if [ ! -e build/mpi ] && [ -z "$only" ]; then
    echo "== MPI exchange tests skipped: no mpicc (Debian: apt-get install openmpi-bin libopenmpi-dev)"
  fi
  if wanted install_test; then run_counted tests/install_test.sh bash tests/install_test.sh; fi
}
pytest_run() {  # LABEL PYTHON [VAR=VALUE...]: one pytest run over tests/py, counted
  local label="$1" py="$2" out rc line p f s par=(); shift 2
  # Tests in parallel where pytest-xdist is installed (make venv installs it):
  # one worker per core, at most 4 (each holds a TensorFlow, ~0.5 GB).
  local cores; cores=$(nproc 2>/dev/null || echo 1)
  if [ "${PYTEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}" -gt 1 ] 2>/dev/null &&
     "$py" -c "import xdist" 2>/dev/null; then
    par=(-n "${PYTEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}" --dist loadgroup)
  fi
  echo "== pytest ($label${par:+, ${par[1]} workers})"
  out=$(env "$@" "$py" -m pytest -q -rs -p no:cacheprovider "${par[@]}" tests/py 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 60
  line=$(grep -E '[0-9]+ (passed|failed|skipped|errors?) in ' <<<"$out" | tail -n 1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); p=${p:-0}
  f=$(grep -oE '[0-9]+ (failed|error|errors)' <<<"$line" | awk '{s+=$1} END {print s+0}')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+'); s=${s:-0}
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  # pytest exit 5 = nothing collected; any other non-zero without counted
  # failures (crash, collection error, usage error) is one failure.
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
}
py_tests() {  # every pytest run, counted
  OPS_LIB=build/tf/_dynemb_ops.so
  if [ -x .venv/bin/python ] && [ -d tests/py ] && ls tests/py/test_*.py >/dev/null 2>&1; then
    sum_before=$(sha256sum "$OPS_LIB" 2>/dev/null | cut -c1-64)
    built_with=$(cat "$OPS_LIB.tf-version" 2>/dev/null || echo '?')
    echo "== op library $OPS_LIB: sha256 ${sum_before:-missing}, built with TensorFlow $built_with headers"
    pytest_run "pinned TensorFlow" .venv/bin/python
    # Compatibility run (make test TF_COMPAT=1, the default): the sess.run tests
    # on a newer TensorFlow, loading the very same op library file. dynemb is
    # not installed in that venv: python/ comes from the source tree.
    compat_venv=${TF_COMPAT_VENV:-.venv-tf219}
    if [ "${TF_COMPAT:-1}" != 0 ]; then
      if [ -x "$compat_venv/bin/python" ] && [ -n "$sum_before" ]; then
        pytest_run "compatibility: $compat_venv, same op library" "$compat_venv/bin/python" \
          TF_USE_LEGACY_KERAS=1 PYTHONPATH="$PWD/python" DYNEMB_OPS_LIB="$PWD/$OPS_LIB"
        sum_after=$(sha256sum "$OPS_LIB" 2>/dev/null | cut -c1-64)
        if [ "$sum_after" = "$sum_before" ]; then
          echo "PASS tf-compat: both pytest runs loaded $OPS_LIB sha256 $sum_before"
          passed=$((passed + 1))
        else
          echo "FAIL tf-compat: $OPS_LIB changed between the two runs ($sum_before -> ${sum_after:-missing})"
          failed=$((failed + 1))
        fi
      else
        echo "FAIL tf-compat: $compat_venv/bin/python or $OPS_LIB missing (make test builds both; make test TF_COMPAT=0 skips this run)"
        failed=$((failed + 1))
      fi
    fi
    echo "== pytest: $skipped skipped over all runs"
  fi
}
skipped=0
if [ "$mode" != py ]; then c_tests "$@"; fi
if [ "$mode" != c ]; then py_tests; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
