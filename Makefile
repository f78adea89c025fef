# dynemb build. `make demo` and `make test` are the two entry points (README).
#
#   make            engine libraries + CLI (build/)
#   make venv       .venv with the pinned TensorFlow (first run downloads it)
#   make ops        TensorFlow op library (needs the venv)
#   make test       every test: C unit tests (ASan+UBSan), TSan stress,
#                   checkpoint fuzzing, Python/TensorFlow tests
#   make demo       venv + build + the Criteo training demo
#   make bench      engine benchmark (JSON)

CC       ?= cc
PYTHON   ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
TF_PIN   := tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
BASEFLAGS:= -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -fPIC -fvisibility=hidden -pthread $(WARN)
CFLAGS   ?= -O2 -g
LDLIBS   := -lz -lm -pthread

ENGINE_SRC := $(wildcard src/*.c)
TOOL_SRC   := $(wildcard tools/*.c)
TEST_SRC   := $(wildcard tests/c/test_*.c)
TSAN_SRC   := $(wildcard tests/c/tsan_*.c)

# --- release build ---------------------------------------------------------
REL_OBJ  := $(ENGINE_SRC:src/%.c=build/obj/%.o)

all: build/libdynemb.a build/libdynemb.so build/dynemb

build/obj/%.o: src/%.c include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -c $< -o $@

build/libdynemb.a: $(REL_OBJ)
	@rm -f $@
	ar rcs $@ $^

build/libdynemb.so: $(REL_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS) -Wl,--no-undefined

build/dynemb: $(TOOL_SRC) build/libdynemb.a
	$(CC) $(BASEFLAGS) $(CFLAGS) -Itools $(TOOL_SRC) build/libdynemb.a -o $@ $(LDLIBS)

# --- sanitizer builds for tests ---------------------------------------------
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS := -O1 -g -fsanitize=thread

build/asan/test_%: tests/c/test_%.c $(ENGINE_SRC) tests/c/check.h include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(ASAN_FLAGS) -Itests/c $< $(ENGINE_SRC) -o $@ $(LDLIBS)

build/tsan/tsan_%: tests/c/tsan_%.c $(ENGINE_SRC) tests/c/check.h include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(TSAN_FLAGS) -Itests/c $< $(ENGINE_SRC) -o $@ $(LDLIBS)

# libFuzzer needs clang; the fuzz target is skipped where clang is missing.
build/fuzz/fuzz_ckpt: tests/fuzz/fuzz_ckpt.c $(ENGINE_SRC) include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	clang $(BASEFLAGS) -Wno-unused-command-line-argument -O1 -g -fsanitize=fuzzer,address,undefined $< $(ENGINE_SRC) -o $@ $(LDLIBS)

C_TESTS    := $(TEST_SRC:tests/c/%.c=build/asan/%)
TSAN_TESTS := $(TSAN_SRC:tests/c/%.c=build/tsan/%)

c-tests: $(C_TESTS) $(TSAN_TESTS)

# --- Python / TensorFlow ------------------------------------------------------
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TF_PIN) pytest numpy
	@touch $@

venv: $(VENV)/.stamp

ops: venv build/libdynemb.a
	$(MAKE) -f tf/ops.mk PYTHON=$(VPY)

install-py: venv
	$(VPY) -m pip install -q --no-build-isolation -e .

# --- entry points ---------------------------------------------------------------
test: all c-tests
	@if command -v clang >/dev/null 2>&1; then $(MAKE) --no-print-directory build/fuzz/fuzz_ckpt; fi
	@if [ -f pyproject.toml ]; then $(MAKE) --no-print-directory install-py; fi
	@bash tests/run_all.sh

demo: all install-py
	$(VPY) examples/criteo_demo.py

bench: all
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist uniform --threads 2 --json
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist zipf:1.05 --threads 2 --json

clean:
	rm -rf build

.PHONY: all c-tests venv ops install-py test demo bench clean
