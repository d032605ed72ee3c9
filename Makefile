# GroupLin's two everyday commands: `make run` (the demo) and `make test` (every test: the
# formatting check, a normal build, the Python package, the pinned real writers and readers, a
# sanitizer + fuzzing build and an aarch64 cross build). Both install missing dependencies first.
BUILD ?= build
SAN_BUILD ?= build-san
CROSS_BUILD ?= build-aarch64
JOBS ?= $(shell nproc)

.PHONY: all deps build run test test-release test-install test-python test-peers test-sanitize test-cross \
	bench \
	clean format format-check

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/grouplin demo

test: format-check test-release test-install test-python test-peers test-sanitize test-cross

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@echo "test-release: the kernel set this CPU runs natively (the native tests of the sets it" \
	  "lacks were skipped, their emulated twins ran):"; \
	  ./$(BUILD)/grouplin --version | sed -n 's/^kernels: /  /p'

# GroupLin as a package: installed to a temporary prefix, then an outside project
# (tests/consumer) finds it with find_package(grouplin), builds against the static and the shared
# library (and grouplin_mpi, when built) and runs; a second build goes through pkg-config alone; the installed command's
# --version must equal the library's version(). Last, the same project embeds GroupLin with
# add_subdirectory while GoogleTest, CLI11 and OpenBLAS cannot be found: it must configure.
test-install: build
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  cmake -S tests/consumer -B "$$d/embedded" -G Ninja -DGROUPLIN_SOURCE="$$PWD" \
	    -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON \
	    -DCMAKE_DISABLE_FIND_PACKAGE_OpenBLAS=ON >/dev/null && \
	  cmake --install $(BUILD) --prefix "$$d/prefix" >/dev/null && \
	  cmake -S tests/consumer -B "$$d/build" -G Ninja -DCMAKE_PREFIX_PATH="$$d/prefix" >/dev/null && \
	  cmake --build "$$d/build" >/dev/null && \
	  "$$d/build/consumer" "$$d" && "$$d/build/consumer_shared" "$$d" && \
	  { [ ! -e "$$d/build/consumer_mpi" ] || "$$d/build/consumer_mpi" >/dev/null; } && \
	  PKG_CONFIG_PATH="$$d/prefix/lib/pkgconfig" c++ -o "$$d/consumer_pc" tests/consumer/consumer.cpp \
	    $$(PKG_CONFIG_PATH="$$d/prefix/lib/pkgconfig" pkg-config --cflags --libs --static grouplin) && \
	  LD_LIBRARY_PATH="$$d/prefix/lib" "$$d/consumer_pc" "$$d" && \
	  want="grouplin $$("$$d/build/consumer" --version)" && \
	  got=$$("$$d/prefix/bin/grouplin" --version | head -1) && \
	  if [ "$$got" = "$$want" ]; then echo "test-install: installed package ok ($$got)"; \
	  else echo "test-install: grouplin --version says '$$got', the library '$$want'"; exit 1; fi

# The Python package: a wheel built by `pip wheel .` (without OpenBLAS), installed into a fresh
# virtual environment, and its pytest suite (tests/python/run.sh).
test-python: deps
	@bash tests/python/run.sh

# The real writers and readers GroupLin must agree with: PyTorch 2.x (torch.save,
# torch.load(weights_only=True)), transformers and safetensors, pinned, in an environment created
# once per machine outside the clone (scripts/peer-env.sh), against this build's grouplin command.
test-peers: build
	@BUILD=$(BUILD) bash tests/peers/run.sh

# clang with AddressSanitizer + UndefinedBehaviorSanitizer: every unit test again, the fuzzers'
# corpora replayed, and each fuzzer run for a bounded time. -O1 -g1 (line tables): sanitizer
# reports keep file and line, and the build takes less of CI's time than -O2 -g. The test code
# itself (not the library under test) at -O0, except where it computes much (tests/CMakeLists.txt):
# clang with the sanitizers compiled a test file 2.3x faster at -O0 than at -O1.
test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1' -DCMAKE_CXX_COMPILER=clang++ -DGROUPLIN_FUZZ=ON \
	  -DGROUPLIN_TEST_OPTIMIZATION=-O0 >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS)

# The library and its core and kernels tests built for aarch64 by Debian's cross compiler, with
# x86 code compiled out (portable kernels, table CRC), and run under qemu-user where it is there.
# qemu emulates each float operation by a call: the three slowest grouped GEMM tests (plan and
# thread-count invariance: 5 of the 7 minutes of test time there; planning is the same code on
# every architecture, and the native builds run them) are left out. Built at -O1: the build checks
# portability and the tests correctness, not speed.
CROSS_SLOW_TESTS = ^KernelsTest\.(TilingDoesNotChangeResults|SameBitsFor.*)$$
test-cross: deps
	@cmake -S . -B $(CROSS_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  '-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG' --toolchain cmake/aarch64-linux-gnu.cmake -DGROUPLIN_BUILD_TOOLS=OFF \
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
