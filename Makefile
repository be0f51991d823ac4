# resnet-tpu: `make demo` and `make test` work on a fresh machine with
# Python 3.10, 3.11 or 3.12 as python3, and nothing else: they create .venv
# first, one environment that holds both engines (requirements/cpu.txt,
# test-tools.txt and test-jax.txt: the newest TensorFlow, Keras and JAX that
# Python has, chosen by environment markers), every package pinned by
# requirements/constraints/test-py<X.Y>.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DATA := demo_data
DEMO_RUN := runs/demo
PYTHON_VERSION := $(shell $(PYTHON) -c \
    'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
TEST_REQUIREMENTS := requirements/cpu.txt requirements/test-tools.txt \
    requirements/test-jax.txt
TEST_CONSTRAINTS := requirements/constraints/test-py$(PYTHON_VERSION).txt

.PHONY: venv lint test test-tf test-jax free-space free-space-ci constraints \
	bench-gpu bench-gpu-wheels bench-compile-cache fashion-mnist test-lab \
	bench-engines-cpu demo-data \
	test-tpu-build \
	check-requirements demo demo-jax bench bench-eval-stall \
	bench-collectives bench-cpu-kernels profile-ops accelerator-check \
	study study-ladder study-recipe-choice study-recipe \
	study-recipe-long study-recipe-revised study-recipe-crop \
	study-confirm study-regime clean

$(VENV)/.installed: $(TEST_REQUIREMENTS) $(TEST_CONSTRAINTS)
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(addprefix -r ,$(TEST_REQUIREMENTS)) \
	    -c $(TEST_CONSTRAINTS)
	touch $@

# A Python without pinned test sets stops here, before any install.
requirements/constraints/test-py%.txt:
	@echo "make: $(PYTHON) is Python $(or $*,unknown); make test and make" \
	    "demo run on Python 3.10-3.13 (requirements/constraints/ pins" \
	    "each): run make PYTHON=python3.12 test, or any of them." >&2
	@exit 1

venv: $(VENV)/.installed

# Imports run only down the package's data flow (.importlinter's layers),
# and ruff.toml's checks hold; both read the source, neither loads
# TensorFlow, so their venv is small.
LINT_VENV := .venv-lint

$(LINT_VENV)/.installed: requirements/lint.txt
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LINT_VENV)/bin/python -m pip install --quiet -r requirements/lint.txt
	touch $@

lint: $(LINT_VENV)/.installed
	PYTHONPATH=. $(LINT_VENV)/bin/lint-imports --no-cache
	$(LINT_VENV)/bin/ruff check --no-cache .

# The suite runs in TEST_WORKERS processes (pytest-xdist; 0: in pytest's
# own process), a test file per process at a time, so module fixtures are
# built once. Two keep a 2-core machine busy: tracing is single-threaded.
TEST_WORKERS ?= 2

# Both engines: TensorFlow's suite (tests/), then JAX's (tests_jax/).
test: free-space test-tf test-jax

# Free space first (tests/free_space.py): the GB the suites' scratch files
# under TMPDIR take at their peak (2.3 measured in a clean clone's .ci/run;
# 4 leaves room), and each virtual environment a run installs (measured).
# CI's run installs two more (.ci/run).
SCRATCH_GB ?= 4
TEST_ENV_GB := .venv=3.0
CI_ENV_GB := $(TEST_ENV_GB) .venv-tpu=1.9 .venv-lint=0.1

free-space:
	@$(PYTHON) tests/free_space.py $(SCRATCH_GB) $(TEST_ENV_GB)

free-space-ci:
	@$(PYTHON) tests/free_space.py $(SCRATCH_GB) $(CI_ENV_GB)

test-tf: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
	    --no-loadscope-reorder --durations=15

# The JAX engine's suite (tests_jax/) in its own pytest process, on 8
# virtual CPU devices (tests_jax/conftest.py), in the same .venv: the JAX
# test-jax.txt picks for this Python beside TensorFlow, which JAX training
# takes its input and files from. The equivalence tests run their
# TensorFlow side in a child process (TF_PYTHON).
test-jax: venv
	$(PY) -c "import jax, keras; print('JAX', jax.__version__, 'Keras', \
	    keras.__version__)"
	TF_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -n $(TEST_WORKERS) \
	    --dist loadfile --no-loadscope-reorder --durations=10 tests_jax

# requirements/constraints/test-py<X.Y>.txt: everything make test's .venv
# resolves on Python X.Y, pinned, for each Python the set claims; pip's dry
# run for that Python, so no second Python is needed. Rerun after a pin in
# requirements/ changes.
constraints: venv
	$(PY) -m requirements.wheel_metadata --constraints

# The lab's runs at their tiniest settings (tests/lab): benchmarks, studies,
# the all-reduce model and the profilers. `make test` runs one smoke each.
test-lab: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 \
	    tests/lab

# The suite's TPU-build half on the wheel TPU users install: exactly
# requirements/tpu-vm-tensorflow.txt (tensorflow-tpu 2.19.1, libtpu 0.0.10,
# Keras 3.12.4) plus test-tools.txt, on Python 3.10 where CI finds it. libtpu is not
# loaded and never asks a cloud metadata server (TPU_LOAD_LIBRARY=0,
# TPU_SKIP_MDS_QUERY=1), and where this user may, the run has no network but
# loopback (unshare -n). pip's cache keeps the wheels between runs.
TPU_PYTHON ?= $(PYTHON)
TPU_VENV := .venv-tpu
TPU_PY := $(TPU_VENV)/bin/python
TPU_BUILD_TESTS := tests/test_tpu_build.py tests/test_tpu_runtime.py \
    tests/test_compat.py tests/test_distributed_batch_norm.py \
    tests/test_bn_all_reduce.py tests/test_gradient_all_reduce.py \
    tests/test_lars.py tests/test_rmsprop_warmup.py tests/test_schedules.py \
    tests/test_trainer.py tests/test_resume_exact.py tests/test_main.py \
    tests/test_export.py tests/test_config.py tests/test_topology.py \
    tests/test_collective_census.py tests/test_corrected_momentum.py \
    tests/test_loop.py tests/test_loss.py tests/test_imports_without_jax.py
TPU_ENV := TPU_LOAD_LIBRARY=0 TPU_SKIP_MDS_QUERY=1
OFFLINE := $(shell unshare -n true 2>/dev/null && \
    echo "unshare -n sh -c 'ip link set lo up 2>/dev/null; exec \"\$$@\"' --")

$(TPU_VENV)/.installed: requirements/tpu-vm-tensorflow.txt \
    requirements/test-tools.txt
	$(TPU_PYTHON) -m venv $(TPU_VENV)
	$(TPU_PY) -m pip install --quiet --upgrade pip
	$(TPU_PY) -m pip install --quiet -r requirements/tpu-vm-tensorflow.txt \
	    -r requirements/test-tools.txt
	touch $@

test-tpu-build: $(TPU_VENV)/.installed
	$(TPU_PY) -m pip list 2>/dev/null | grep -E '^(tensorflow(-tpu|-cpu)?|libtpu|keras) '
	env $(TPU_ENV) $(OFFLINE) $(TPU_PY) -m pytest -q -n $(TEST_WORKERS) \
	    --dist loadfile --durations=10 $(TPU_BUILD_TESTS)

# pip resolves every install set (requirements/wheel_metadata.py
# INSTALL_SETS: what a CPU, TPU VM or GPU host installs for each engine, and
# the test environments) for the Pythons it is for, as a dry run: it
# installs nothing and downloads metadata only (about 5 minutes). CI runs it.
check-requirements: venv
	$(PY) -m requirements.wheel_metadata --resolve

# The demo's data: 10 synthetic classes of 40 px, 2,000 train and 250
# validation images, as TFRecords; $(1) is the Python that builds them.
define demo_data
	rm -rf $(DEMO_DATA)
	$(1) -m data.make_synthetic --output_dir=$(DEMO_DATA)/images \
	    --num_classes=10 --images_per_class=200 \
	    --validation_images_per_class=25 --image_size=40
	$(1) -m data.build_tfrecords --input_dir=$(DEMO_DATA)/images/train \
	    --output_dir=$(DEMO_DATA)/tfrecords --split=train --num_shards=4
	$(1) -m data.build_tfrecords --input_dir=$(DEMO_DATA)/images/validation \
	    --output_dir=$(DEMO_DATA)/tfrecords --split=validation --num_shards=2
endef

# make demo's data alone (make bench-engines-cpu makes it where it is missing).
demo-data: venv
	$(call demo_data,$(PY))

demo: DEMO_START := $(shell date +%s)
demo: venv
	rm -rf $(DEMO_RUN)
	$(call demo_data,$(PY))
	$(PY) main.py --flagfile=flags/cpu_demo.cfg \
	    --data_dir=$(DEMO_DATA)/tfrecords --model_dir=$(DEMO_RUN)
	$(PY) -m tools.export_savedmodel --model_dir=$(DEMO_RUN) \
	    --export_dir=$(DEMO_RUN)/export
	$(PY) -m tools.evaluate --saved_model=$(DEMO_RUN)/export \
	    --data_dir=$(DEMO_DATA)/tfrecords > $(DEMO_RUN)/saved_model_eval.json
	$(PY) -m tools.plot_metrics --model_dir=$(DEMO_RUN)
	@$(PY) -m tools.demo_summary --model_dir=$(DEMO_RUN) \
	    --saved_model_eval=$(DEMO_RUN)/saved_model_eval.json \
	    --start_time=$(DEMO_START)

# The same demo on the JAX engine (docs/jax.md), in the same .venv:
# it trains, checkpoints, evaluates and exports on 4 virtual CPU devices;
# the SavedModel is scored by TensorFlow, as make demo's.
DEMO_JAX_RUN := runs/demo-jax

demo-jax: DEMO_START := $(shell date +%s)
demo-jax: venv
	rm -rf $(DEMO_JAX_RUN)
	$(call demo_data,$(PY))
	$(PY) main.py --backend=jax --flagfile=flags/cpu_demo.cfg \
	    --data_dir=$(DEMO_DATA)/tfrecords --model_dir=$(DEMO_JAX_RUN) \
	    --export_dir=$(DEMO_JAX_RUN)/export
	KERAS_BACKEND=tensorflow $(PY) -m tools.evaluate \
	    --saved_model=$(DEMO_JAX_RUN)/export \
	    --data_dir=$(DEMO_DATA)/tfrecords > $(DEMO_JAX_RUN)/saved_model_eval.json
	KERAS_BACKEND=tensorflow $(PY) -m tools.plot_metrics \
	    --model_dir=$(DEMO_JAX_RUN)
	@$(PY) -m tools.demo_summary --model_dir=$(DEMO_JAX_RUN) \
	    --saved_model_eval=$(DEMO_JAX_RUN)/saved_model_eval.json \
	    --start_time=$(DEMO_START)

# Debian's dataset-fashion-mnist: the real photos of make bench (its
# evaluation bench) and make study*, in lab/study_data.FASHION_MNIST_DIR.
# Installed with apt where this user is root; elsewhere one line says how,
# before any work.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist

fashion-mnist:
	@test -d $(FASHION_MNIST_DIR) || { [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq && \
	    apt-get install -y -qq dataset-fashion-mnist >/dev/null; } || { \
	    echo "make: $(FASHION_MNIST_DIR) is missing: run" \
	        "'sudo apt-get install dataset-fashion-mnist'" >&2; exit 1; }
	@test -d $(FASHION_MNIST_DIR) || { echo "make: dataset-fashion-mnist did" \
	    "not install $(FASHION_MNIST_DIR)" >&2; exit 1; }

# Each benchmark alternates its variants and merges its headline ratios into
# bench_results/summary.json; bench_report assembles REPORT.md.
# BENCH_DIR: where the results go (another folder times a run without
# touching the committed one).
BENCH_DIR ?= bench_results

bench: venv fashion-mnist
	$(PY) -m lab.bench_train --output_dir=$(BENCH_DIR)
	$(PY) -m lab.bench_bn_groups --output_dir=$(BENCH_DIR)
	$(PY) -m lab.bench_eval --output_dir=$(BENCH_DIR)
	$(PY) -m lab.bench_input --output_dir=$(BENCH_DIR)
	$(PY) -m lab.allreduce_sim --output_dir=$(BENCH_DIR)
	$(PY) -m lab.bench_report --output_dir=$(BENCH_DIR)

# The evaluation iterators of before issue 38 against today's: the old
# ones wait minutes per run, so this comparison is not part of make bench.
bench-eval-stall: venv fashion-mnist
	$(PY) -m lab.bench_eval --output_dir=$(BENCH_DIR) \
	    --variants=long_lived,per_evaluation
	$(PY) -m lab.bench_report --output_dir=$(BENCH_DIR)

# What JAX's persistent compilation cache saves a restarted run: the first
# step's compile seconds, cold and restarted (lab/bench_compile_cache.py,
# about 4 minutes; writes compile_cache.json).
bench-compile-cache: venv
	$(PY) -m lab.bench_compile_cache --output_dir=$(BENCH_DIR)

# Why the CPU demo trains faster on TensorFlow than on JAX: the demo through
# main.py on TensorFlow with oneDNN's kernels and with Eigen's, and on JAX,
# side by side; JAX's loop against its step; the project's JAX step against
# stock keras.layers (lab/bench_engines_cpu.py, about 14 minutes).
bench-engines-cpu: venv
	test -d $(DEMO_DATA)/tfrecords || $(MAKE) demo-data
	$(PY) -m lab.bench_engines_cpu --data_dir=$(DEMO_DATA)/tfrecords \
	    --output_dir=$(BENCH_DIR)

# ResNet-50 training steps on one GPU, the project's JAX step beside stock
# Keras and torchvision (lab/bench_gpu.py), in a Python with JAX (and torch):
# e.g. make bench-gpu BENCH_PYTHON=python3 BENCH_OUT=DIR (default
# bench_results/). A Python without Keras (the lent H200's) takes it from the
# wheels in $(BENCH_WHEELS) (make bench-gpu-wheels, run where pip reaches an
# index), installed into $(BENCH_SITE) first. BENCH_FLAGS: more flags (the
# CPU rehearsal's small shapes, tests_jax/test_bench_gpu.py). Without make:
# sh lab/bench_gpu.sh, with the same variables in its environment.
BENCH_PYTHON ?= python3
BENCH_OUT ?= bench_results
BENCH_WHEELS ?= .whl
BENCH_SITE ?= .bench-site

bench-gpu:
	BENCH_PYTHON='$(BENCH_PYTHON)' BENCH_OUT='$(BENCH_OUT)' \
	    BENCH_WHEELS='$(BENCH_WHEELS)' BENCH_SITE='$(BENCH_SITE)' \
	    BENCH_FLAGS='$(BENCH_FLAGS)' sh lab/bench_gpu.sh

# The wheels that bench carries to a machine with JAX and no Keras (the
# lent H200: Python 3.12), into .whl/; there: make bench-gpu BENCH_OUT=DIR
# (without make: BENCH_OUT=DIR sh lab/bench_gpu.sh).
bench-gpu-wheels: requirements/bench-gpu.txt
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: \
	    --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 -d $(BENCH_WHEELS) \
	    -r requirements/bench-gpu.txt
	ls -l $(BENCH_WHEELS)

# Distributed BN's group all-reduce, subgroup collective vs the masked
# fallback (why --bn_all_reduce=auto picks the collective): under a minute.
bench-collectives: venv
	$(PY) -m lab.dev.bench_collectives --output_dir=bench_results
	$(PY) -m lab.bench_report --output_dir=bench_results

# oneDNN vs Eigen CPU kernels (why resnet_tpu/runtime/cpu_kernels.py turns oneDNN
# on): one process per sample, about 3.5 minutes, so not part of `bench`.
bench-cpu-kernels: venv
	$(PY) -m lab.dev.bench_cpu_kernels --output_dir=bench_results
	$(PY) -m lab.bench_report --output_dir=bench_results

# Op time per category of the float32 ResNet-50 steps and of the BN-group
# steps (lab/dev/op_profile.py): about 5 minutes, so not part of `bench`.
profile-ops: venv
	$(PY) -m lab.dev.op_profile --workloads=ours,ours_v1_layout,keras \
	    --output_dir=bench_results
	$(PY) -m lab.dev.op_profile --workloads=bn_group1,bn_group4,bn_group8 \
	    --output_dir=bench_results
	$(PY) -m lab.bench_report --output_dir=bench_results

# First contact with a TPU VM or a GPU host (tools/accelerator_check.py), in
# the Python that has that machine's TensorFlow (not the CPU .venv), e.g.
#   make accelerator-check PYTHON=python3 ARGS=--tpu=local
accelerator-check:
	$(PYTHON) -m tools.accelerator_check $(ARGS)

# The papers' central claims on real photos (lab/study.py): Fashion-MNIST
# from Debian's dataset-fashion-mnist, criteria declared in lab/study_plan.py.
# It calibrates and prints its estimate first (--estimate_only stops there).
study: venv fashion-mnist
	$(PY) -m lab.study --output_dir=bench_results/studies

# The baseline rerun and the ladder (issue 36) at make study's committed
# scale and LR choice (2,560 images: two halvings), about 50 minutes.
study-ladder: venv fashion-mnist
	$(PY) -m lab.study --studies=baseline,ladder --halvings=2 \
	    --lr_choice=bench_results/studies/lr_choice.json \
	    --output_dir=bench_results/studies

# Each side's rule for the recipe check (issue 36), chosen on seeds 0 and 1
# at the same scale: stock Keras's momentum LR; the recipe's LARS peak,
# zero-init gamma and flip (lab/study_plan.py; about 30 minutes).
study-recipe-choice: venv fashion-mnist
	$(PY) -m lab.study --studies=recipe_choice --halvings=2 \
	    --lr_choice=bench_results/studies/lr_choice.json \
	    --output_dir=bench_results/studies

# flags/small_images.cfg against stock Keras at recipe_choice.json's rule,
# on fresh seeds, at the same scale (about 10 minutes).
study-recipe: venv fashion-mnist
	$(PY) -m lab.study --studies=recipe --halvings=2 \
	    --lr_choice=bench_results/studies/lr_choice.json \
	    --output_dir=bench_results/studies

# The recipe check again at three times the epochs (issue 36): each side's
# LR around recipe_choice.json's picks on seeds 0 and 1, then the check on
# fresh seeds 9-11 at those picks (lab/study_plan.py; about 70 minutes).
study-recipe-long: venv fashion-mnist
	$(PY) -m lab.study --studies=recipe_long_choice,recipe_long \
	    --halvings=2 --output_dir=bench_results/studies

# The revised recipe at those 30 epochs (issue 36): stock Keras's LR one
# step past its long pick, the recipe's LARS with the flip on and stock
# Keras's momentum with the recipe's input and init, each against
# recipe_long_choice.json's picks on seeds 0 and 1; then the check on fresh
# seeds 12-14 (lab/study_plan.py; about 60 minutes).
study-recipe-revised: venv fashion-mnist
	$(PY) -m lab.study --studies=recipe_revised_choice,recipe_revised \
	    --halvings=2 --output_dir=bench_results/studies

# The next round at those 30 epochs (issue 36): stock Keras's LR one more
# step, the revised recipe with mild train crops (min area 0.8, 0.5), each
# against recipe_revised_choice.json's picks on seeds 0 and 1; then the
# check on fresh seeds 15-17 (lab/study_plan.py; about 55 minutes).
study-recipe-crop: venv fashion-mnist
	$(PY) -m lab.study --studies=recipe_crop_choice,recipe_crop \
	    --halvings=2 --output_dir=bench_results/studies

# The confirmatory comparison (issue 51), declared in lab/confirm_plan.py
# before it ran: both sides' LR picked on a validation split of the
# training photos, then one check on fresh seeds 18-20 against the test
# photos (about 75 minutes).
study-confirm: venv fashion-mnist
	$(PY) -m lab.study_confirm --output_dir=bench_results/studies

# Study b in the papers' regime (issue 36): the largest batch 2.5 % of the
# images a step, 30 epochs, LARS against momentum at it, with make study's
# LR rules (lab/study_plan.py REGIME; measured time in the studies README).
study-regime: venv fashion-mnist
	$(PY) -m lab.study --studies=regime \
	    --lr_choice=bench_results/studies/lr_choice.json \
	    --output_dir=bench_results/studies

clean:
	rm -rf $(DEMO_RUN) $(DEMO_DATA) bench_results/*.tmp $(BENCH_SITE)
