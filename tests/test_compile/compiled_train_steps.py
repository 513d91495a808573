"""Losses of two training steps of a quick-start config, eager and through
``torch.compile(model.train_step, backend='aot_eager')`` (what MMEngine's
``compile`` setting does, ``Runner._maybe_compile``), as JSON on stdout.

Run by ``test_compiled_training.py`` in a fresh interpreter, as
``tools/train.py`` runs a compiled training.

The batches carry the metainfo that mmdet's pipeline gives (``Resize`` sets
``scale_factor`` to a tuple of floats), not the numpy array of
``mmdet.testing.demo_mm_inputs``: TorchDynamo (PyTorch 2.13) traces
``data_sample.to(device)`` -> ``set_metainfo`` -> ``copy.deepcopy`` of the
metainfo, treats an ndarray there as a tensor and fails on its
``__deepcopy__`` (``TorchRuntimeError ... 'ndarray' object has no attribute
'__deepcopy__'``), unless a list value earlier in the dict made it break the
graph first. The dict's order is that of a Python set of the keys, so it
failed or passed with ``PYTHONHASHSEED`` (seeds 4, 5 and 7 failed, 0-3 and 6
passed), which is what made this case fail in some suite runs.

    python tests/test_compile/compiled_train_steps.py detr_irpe_r18_synthetic.py
"""
import copy
import json
import os.path as osp
import sys

import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
QUICK = osp.join(ROOT, 'configs', 'quickstart')
# two batches of two images (a wide and a tall one, padded), two sizes
BATCHES = ([(3, 96, 160), (3, 128, 96)], [(3, 112, 64), (3, 80, 144)])


def as_pipeline_metainfo(batch: dict) -> dict:
    """Numpy arrays in each sample's metainfo become tuples of floats, as
    mmdet's ``Resize`` + ``PackDetInputs`` give ``scale_factor``."""
    for sample in batch['data_samples']:
        arrays = {k: tuple(v.tolist()) for k, v in sample.metainfo_items()
                  if isinstance(v, np.ndarray)}
        sample.set_metainfo(arrays)
    return batch


def batches(num_classes: int, with_mask: bool) -> list:
    return [
        as_pipeline_metainfo(demo_mm_inputs(
            batch_size=2, image_shapes=shapes, num_items=[2, 1],
            num_classes=num_classes, with_mask=with_mask))
        for shapes in BATCHES
    ]


def run_steps(cfg, step_fn_of, data: list, steps: int = 2) -> list:
    """Build the model at seed 0, then ``steps`` optimizer steps; the
    losses of each step as floats."""
    from mmpe.engine.plain_param_groups_hook import plain_param_groups
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    model.init_weights()
    model.train()
    for m in model.modules():  # dropout draws differ between graphs
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    # what tools/train.py's PlainParamGroupsHook does before training
    plain_param_groups(optim_wrapper.optimizer)
    step = step_fn_of(model)
    losses = []
    for i in range(steps):
        log_vars = step(copy.deepcopy(data[i % len(data)]), optim_wrapper)
        losses.append({k: float(v) for k, v in log_vars.items()})
    return losses


def main(name: str) -> None:
    register_all_modules(init_default_scope=True)
    import mmpe  # noqa: F401
    cfg = Config.fromfile(osp.join(QUICK, name))
    data = batches(4, with_mask=name.startswith('mask-rcnn'))
    eager = run_steps(cfg, lambda m: m.train_step, data)
    compiled = run_steps(
        cfg, lambda m: torch.compile(m.train_step, backend='aot_eager'),
        data)
    print(json.dumps(dict(eager=eager, compiled=compiled)))


if __name__ == '__main__':
    main(sys.argv[1])
