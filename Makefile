# Entry points for a fresh machine: `make run` (build the library and the `flare` command, then
# benchmark on the default device: the GPU when present, else the CPU backend), `make test`
# (every test but the kernel sweep), `make test-kernels` (the kernel sweep) and `make check`
# (both: what CI runs). A C++ compiler is enough; the CUDA toolkit is reached at run time.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup configure build run test test-kernels check clean

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

# The kernel sweep: every shipped kernel configuration and variant family compiled with NVRTC
# for sm_80 and sm_90a and refused on register spills or local memory (the tests named
# *WithoutSpills*; about 13 minutes of one core, 6.5 on two). Run it after a kernel change.
KERNEL_SWEEP = WithoutSpills

# The C++ suites but the kernel sweep, then the Python package's pytest suite
# (python/run_tests.sh builds the extension and installs its missing build requirements from
# PyPI).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -E '$(KERNEL_SWEEP)'
	JOBS=$(JOBS) bash python/run_tests.sh $(BUILD)

test-kernels: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -R '$(KERNEL_SWEEP)'

check: test test-kernels

clean:
	rm -rf $(BUILD)
