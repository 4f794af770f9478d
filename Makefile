# Two entry points for a fresh machine: `make run` (build the library and the `flare` command,
# then benchmark on the default device: the GPU when present, else the CPU backend) and
# `make test` (every test). A C++ compiler is enough; the CUDA toolkit is reached at run time.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup configure build run test clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Only what the benchmark runs (libflare and the flare command), not the test suites.
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target flare_cli
	$(BUILD)/flare bench

# The C++ suites, then the Python package's pytest suite (python/run_tests.sh builds the
# extension and installs its missing build requirements from PyPI).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	JOBS=$(JOBS) bash python/run_tests.sh $(BUILD)

clean:
	rm -rf $(BUILD)
