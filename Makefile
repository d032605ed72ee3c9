# GroupLin's two everyday commands: `make run` (the demo) and `make test` (every test: the
# formatting check, a normal build and a sanitizer + fuzzing build). Both install missing
# dependencies first.
BUILD ?= build
SAN_BUILD ?= build-san
JOBS ?= $(shell nproc)

.PHONY: all deps build run test test-release test-sanitize bench clean format format-check

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/grouplin demo

test: format-check test-release test-sanitize

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# clang with AddressSanitizer + UndefinedBehaviorSanitizer: every unit test again, the fuzzers'
# corpora replayed, and each fuzzer run for a bounded time.
test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DGROUPLIN_FUZZ=ON >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS)

bench: build
	./$(BUILD)/grouplin bench

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

# Fails when a tracked C++ file is not laid out as .clang-format says (`make format` fixes it).
format-check: deps
	@files=$$(git ls-files '*.cpp' '*.hpp') && [ -n "$$files" ] && \
	  clang-format --dry-run --Werror $$files && echo "format-check: clang-format clean"

clean:
	rm -rf $(BUILD) $(SAN_BUILD)
