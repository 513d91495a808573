"""Shared steps of the config tests: the weight decay mmengine gives each
parameter from a config, and one training step on two images of different
sizes and aspect ratios (a wide one and a tall one)."""
from typing import Dict

import torch
from mmdet.testing import demo_mm_inputs
from mmengine.optim import build_optim_wrapper

#: a wide and a tall image: padding on the right of one, the bottom of the
#: other
TWO_SIZES = [(3, 96, 192), (3, 160, 64)]


def weight_decays(model, cfg) -> Dict[str, float]:
    """{trained parameter name: weight decay of its group in the optimizer
    that mmengine builds from ``cfg.optim_wrapper``}."""
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    decay = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            decay[id(p)] = group.get('weight_decay',
                                     optimizer.defaults['weight_decay'])
    return {
        name: decay[id(p)]
        for name, p in model.named_parameters() if p.requires_grad
    }


def detection_train_step(model, num_classes: int,
                         with_mask: bool = False) -> torch.Tensor:
    """Losses of one training step on :data:`TWO_SIZES` (2 and 1 boxes,
    with instance masks if ``with_mask``), after ``backward``; asserts the
    total is finite."""
    model.train()
    packed = demo_mm_inputs(
        batch_size=2,
        image_shapes=TWO_SIZES,
        num_items=[2, 1],
        num_classes=num_classes,
        with_mask=with_mask)
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    total, log_vars = model.parse_losses(losses)  # lists of levels summed
    assert torch.isfinite(total), log_vars
    total.backward()
    return total
