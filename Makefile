# mmpe: the two commands of the README.
#   make demo   set up .venv, generate the embedded data set, train the
#               quick-start DETR-iRPE for ~10 min on CPU, evaluate (COCO AP)
#   make demo-fast   the same for the quick-start Conditional-DETR-iRPE, which
#               passes AP50 0.5 in the demo's training compute (README)
#   make demo-seg   the same for semantic segmentation (MMSegmentation):
#               label maps for the embedded set, the quick-start Semantic
#               FPN with a tiny CPVT, mIoU
#   make test   set up .venv with test dependencies, run the test suite
PY := .venv/bin/python
DEMO_CONFIG ?= configs/quickstart/detr_irpe_r18_synthetic.py
DEMO_WORK_DIR ?= work_dirs/demo
DEMO_FAST_CONFIG ?= configs/quickstart/conditional-detr_irpe_r18_synthetic.py
DEMO_FAST_WORK_DIR ?= work_dirs/demo-fast
DEMO_SEG_CONFIG ?= configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py
DEMO_SEG_WORK_DIR ?= work_dirs/demo-seg
PYTEST_ARGS ?=

.PHONY: demo demo-fast test setup setup-tests data train-demo eval-demo \
	demo-seg

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
	$(PY) -m pytest tests $(PYTEST_ARGS)
