# mmpe: the two commands of the README.
#   make demo   set up .venv, generate the embedded data set, train the
#               quick-start DETR-iRPE for ~10 min on CPU, evaluate (COCO AP)
#   make demo-fast   the same for the quick-start Conditional-DETR-iRPE, which
#               passes AP50 0.5 in the demo's training compute (README)
#   make demo-seg   the same for semantic segmentation (MMSegmentation):
#               label maps for the embedded set, the quick-start Semantic
#               FPN with a tiny CPVT, mIoU
#   make test   set up .venv with test dependencies, run the test suite
#   make test-each-file   the same, each test file in a pytest process of
#               its own (a file that needs another to run first fails)
#   make docs   set up .venv plus the documentation tools (requirements/docs.txt),
#               build the site into docs/_build/html, warnings as errors
#   make figures  draw the figures of the docs (docs/_static/figures) from
#               docs/data/*.json and, when it exists, the demo's work dir
#   make docs-tables  rewrite the tables of docs/benchmark.md, results.md and
#               testing.md from docs/data/*.json (standard library only)
#   make kernel-report  compile the fused Triton kernels for sm_90 and sm_80
#               (no GPU needed) and write what their compiled code says
#               (registers, spills, instructions per tile, ...) into
#               docs/data/kernel_report_sm{90,80}.{json,md}
#   make gpu-check  on a machine with CUDA: the CUDA tests, FlexAttention
#               against the explicit backend forward and backward, the auto
#               rule's memory estimates against measured peaks, the long-sequence
#               and backbone benchmarks; one markdown report (path printed).
#               Without CUDA it says so in one line and exits 0
PY := .venv/bin/python
DEMO_CONFIG ?= configs/quickstart/detr_irpe_r18_synthetic.py
DEMO_WORK_DIR ?= work_dirs/demo
DEMO_FAST_CONFIG ?= configs/quickstart/conditional-detr_irpe_r18_synthetic.py
DEMO_FAST_WORK_DIR ?= work_dirs/demo-fast
DEMO_SEG_CONFIG ?= configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py
DEMO_SEG_WORK_DIR ?= work_dirs/demo-seg
# extra pytest arguments, e.g. PYTEST_ARGS='-p randomly' for a shuffled run
# (file order by default: pytest.ini) and '-p randomly --randomly-seed=N' to
# replay one (docs/testing.md)
PYTEST_ARGS ?=
# one intra-op thread per test process (and the tools the tests start): on a
# machine busy with other work OpenMP threads spinning against each other slow
# the suite many times over
TEST_THREADS ?= 1
# test processes (pytest-xdist): one per core, each with TEST_THREADS threads;
# files go whole to one process (--dist loadfile: a module's fixtures are built
# once). TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
DOCS_BUILD_DIR ?= docs/_build/html
SPHINX_ARGS ?=
# the set-up the site is built on: the runtime stack; .ci/run, after make
# test, names setup-tests (which installs the runtime stack too)
DOCS_SETUP ?= setup

.PHONY: demo demo-fast test test-each-file setup setup-tests data train-demo \
	eval-demo demo-seg setup-docs docs figures gpu-check docs-tables \
	kernel-report

setup:
	bash tools/setup_env.sh

setup-tests:
	bash tools/setup_env.sh tests

data: setup
	$(PY) tools/dataset_converters/make_synthetic_coco.py --out-dir data/synthetic_coco

# --resume: a second `make demo` continues (or just re-evaluates) the run
# in $(DEMO_WORK_DIR) instead of overwriting its checkpoints.
train-demo: data
	$(PY) tools/train.py $(DEMO_CONFIG) --work-dir $(DEMO_WORK_DIR) --resume

eval-demo:
	$(PY) tools/test.py $(DEMO_CONFIG) "$$(cat $(DEMO_WORK_DIR)/last_checkpoint)" \
		--work-dir $(DEMO_WORK_DIR)/test

demo: train-demo
	$(MAKE) eval-demo

# the second demo: the same steps with the Conditional DETR config
demo-fast:
	$(MAKE) demo DEMO_CONFIG=$(DEMO_FAST_CONFIG) DEMO_WORK_DIR=$(DEMO_FAST_WORK_DIR)

# semantic segmentation: the embedded set plus label maps (seg_maps/), the
# quick-start Semantic FPN trained (--resume: a second run continues or just
# re-evaluates) and tested with mmseg's IoUMetric
demo-seg: setup
	$(PY) tools/dataset_converters/make_synthetic_seg.py --out-dir data/synthetic_coco
	$(PY) tools/train.py $(DEMO_SEG_CONFIG) --work-dir $(DEMO_SEG_WORK_DIR) --resume
	$(PY) tools/test.py $(DEMO_SEG_CONFIG) "$$(cat $(DEMO_SEG_WORK_DIR)/last_checkpoint)" \
		--work-dir $(DEMO_SEG_WORK_DIR)/test

test: setup-tests
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest tests \
		$(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# every test file in a pytest process of its own (order independence;
# docs/testing.md); one line per file, exit status 1 if any failed
test-each-file: setup-tests
	TEST_THREADS=$(TEST_THREADS) bash tools/test_each_file.sh $(PYTEST_ARGS)

# the documentation tools go into the same .venv (autodoc imports mmpe, so
# the site needs the runtime stack); pinned in requirements/docs.txt
setup-docs: $(DOCS_SETUP)
	$(PY) -m pip install -q -r requirements/docs.txt

# -W --keep-going: every warning is an error, all of them reported at once
docs: setup-docs
	$(PY) -m sphinx -W --keep-going -b html $(SPHINX_ARGS) docs $(DOCS_BUILD_DIR)
	@echo "[docs] open $(DOCS_BUILD_DIR)/index.html"

# matplotlib comes with the test dependencies; the attention map and the loss
# curve need a `make demo` run (DEMO_WORK_DIR), the other figures only docs/data
figures: setup-tests
	$(PY) tools/analysis/make_figures.py --out-dir docs/_static/figures \
		$(if $(wildcard $(DEMO_WORK_DIR)/last_checkpoint),--demo-work-dir $(DEMO_WORK_DIR))

# no set-up needed: the script reads JSON and writes Markdown (tests/test_docs/
# test_docs_data.py fails when a committed table differs from this)
docs-tables:
	$(if $(wildcard $(PY)),$(PY),python3) tools/analysis/docs_tables.py

# KERNEL_REPORT_ARGS: e.g. --subset main, --dtypes bfloat16
KERNEL_REPORT_ARGS ?=
kernel-report: setup-tests
	$(PY) tools/analysis/kernel_report.py --arch 90 80 --out-dir docs/data \
		$(KERNEL_REPORT_ARGS)

# GPU_CHECK_ARGS: e.g. --skip-benchmarks (tests and checks only), --out-dir DIR
GPU_CHECK_ARGS ?=
gpu-check: setup-tests
	$(PY) tools/gpu_check.py $(GPU_CHECK_ARGS)
