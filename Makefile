# Two entry points for a fresh machine: `make run` (build, then benchmark on the default
# device: the GPU when present, else the CPU backend) and `make test` (every test).
BUILD ?= build
JOBS ?= $(shell nproc)
export PATH := /usr/local/cuda/bin:$(PATH)

.PHONY: setup build run test clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/flare bench

# The C++ suites, then the Python package's pytest suite (python/run_tests.sh builds the
# extension and installs its missing build requirements from PyPI).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	JOBS=$(JOBS) bash python/run_tests.sh $(BUILD)

clean:
	rm -rf $(BUILD)
