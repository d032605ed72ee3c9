# GroupLin's two everyday commands: `make run` (the demo) and `make test` (every test: the
# formatting check, a normal build, a sanitizer + fuzzing build and an aarch64 cross build). Both
# install missing dependencies first.
BUILD ?= build
SAN_BUILD ?= build-san
CROSS_BUILD ?= build-aarch64
JOBS ?= $(shell nproc)

.PHONY: all deps build run test test-release test-sanitize test-cross bench clean format \
	format-check

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/grouplin demo

test: format-check test-release test-sanitize test-cross

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# clang with AddressSanitizer + UndefinedBehaviorSanitizer: every unit test again, the fuzzers'
# corpora replayed, and each fuzzer run for a bounded time.
test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DGROUPLIN_FUZZ=ON >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS)

# The library and its core and kernels tests built for aarch64 by Debian's cross compiler, with
# x86 code compiled out (portable kernels, table CRC), and run under qemu-user where it is there.
# qemu emulates each float operation by a call: the three slowest grouped GEMM tests (plan and
# thread-count invariance: 5 of the 7 minutes of test time there; planning is the same code on
# every architecture, and the native builds run them) are left out.
CROSS_SLOW_TESTS = ^KernelsTest\.(TilingDoesNotChangeResults|SameBitsFor.*)$$
test-cross: deps
	@cmake -S . -B $(CROSS_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  --toolchain cmake/aarch64-linux-gnu.cmake -DGROUPLIN_BUILD_TOOLS=OFF \
	  -DGROUPLIN_BUILD_EXAMPLES=OFF -DGROUPLIN_BUILD_BENCH=OFF '-DGROUPLIN_TEST_SUITES=core;kernels' \
	  >/dev/null
	@cmake --build $(CROSS_BUILD) -j $(JOBS)
	@if command -v qemu-aarch64 >/dev/null; then \
	  ctest --test-dir $(CROSS_BUILD) --output-on-failure -j $(JOBS) -E '$(CROSS_SLOW_TESTS)'; \
	else \
	  echo "test-cross: skipped: running the aarch64 tests (no qemu-aarch64; Debian package qemu-user)"; \
	fi

bench: build
	./$(BUILD)/grouplin bench

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

# Fails when a tracked C++ file is not laid out as .clang-format says (`make format` fixes it).
format-check: deps
	@files=$$(git ls-files '*.cpp' '*.hpp') && [ -n "$$files" ] && \
	  clang-format --dry-run --Werror $$files && echo "format-check: clang-format clean"

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(CROSS_BUILD)
