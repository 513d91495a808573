"""RT-DETR's exponential moving average of the weights, as an MMEngine
averaged model.

The RT-DETR authors' ``ModelEMA`` (lyuwenyu/RT-DETR,
``rtdetrv2_pytorch/src/optim/ema.py``, from timm's ``ModelEmaV2``) starts
from a copy of the model and, after every optimiser step ``t = 1, 2, ...``,
updates every floating-point entry of the state dict (parameters *and*
buffers, e.g. BatchNorm's running statistics):

.. math::

    d_t = \\mathrm{decay} \\cdot (1 - e^{-t / \\mathrm{warmups}}), \\qquad
    \\bar\\theta_t = d_t \\, \\bar\\theta_{t-1} + (1 - d_t) \\, \\theta_t,

with ``decay = 0.9999`` and ``warmups = 2000`` in every RT-DETRv2 recipe
(``configs/rtdetrv2/include/optimizer.yml``). MMEngine's
:class:`~mmengine.model.ExponentialMovingAverage` has a constant momentum
and copies the model at its first update; mmdet's ``ExpMomentumEMA`` ramps
the momentum as YOLOX does. Neither is this ramp, so this class is it, used
through MMEngine's ``EMAHook``::

    custom_hooks = [dict(type='EMAHook', ema_type='RTDETREMA',
                         decay=0.9999, warmups=2000, priority=49)]

(``update_buffers`` is True by default here: the authors average buffers.)
"""
import math
from typing import Optional

import torch
from mmengine.model import BaseAveragedModel
from torch import Tensor, nn

from mmdet.registry import MODELS


def rtdetr_ema_decay(updates: int, decay: float, warmups: int) -> float:
    """The decay of update ``updates`` (1 for the first):
    ``decay * (1 - exp(-updates / warmups))``."""
    return decay * (1 - math.exp(-updates / warmups))


@MODELS.register_module()
class RTDETREMA(BaseAveragedModel):
    """The RT-DETR authors' EMA (``ModelEMA``) on MMEngine's averaged model.

    ``steps`` (a buffer, saved with the EMA state in checkpoints) counts the
    updates made, the authors' ``updates``. Unlike MMEngine's averaged
    models, the first update averages too (the authors' EMA starts from the
    model as it was when the EMA was built: the initialised or loaded
    weights); integer buffers stay as they were copied, as the authors'.

    Args:
        model (nn.Module): The model to average.
        decay (float): The decay that the ramp reaches, in (0, 1).
            Defaults to 0.9999.
        warmups (int): The ramp's time constant in updates, > 0.
            Defaults to 2000.
        interval (int): Only 1 (the authors update after every optimiser
            step). Defaults to 1.
        device (torch.device, optional): Where to keep the average.
            Defaults to None (the model's device).
        update_buffers (bool): Average the floating-point buffers too (the
            authors do); False keeps them equal to the model's. Defaults to
            True.
    """

    def __init__(self,
                 model: nn.Module,
                 decay: float = 0.9999,
                 warmups: int = 2000,
                 interval: int = 1,
                 device: Optional[torch.device] = None,
                 update_buffers: bool = True) -> None:
        if isinstance(decay, bool) or not isinstance(
                decay, (int, float)) or not 0 < decay < 1:
            raise ValueError(f'Unsupported `decay` {decay!r} for RTDETREMA, '
                             'please give a number in (0, 1), e.g. 0.9999')
        if isinstance(warmups, bool) or not isinstance(
                warmups, int) or warmups <= 0:
            raise ValueError(
                f'Unsupported `warmups` {warmups!r} for RTDETREMA, please '
                'give a positive number of updates, e.g. 2000')
        if interval != 1:
            raise ValueError(
                f'Unsupported `interval` {interval!r} for RTDETREMA, choose '
                'from (1,): the authors update after every optimiser step')
        super().__init__(model, interval, device, update_buffers)
        self.decay = float(decay)
        self.warmups = warmups

    def avg_func(self, averaged_param: Tensor, source_param: Tensor,
                 steps: int) -> None:
        """``averaged = d * averaged + (1 - d) * source`` in place, ``d`` the
        decay of update ``steps`` (1 for the first)."""
        d = rtdetr_ema_decay(steps, self.decay, self.warmups)
        averaged_param.mul_(d).add_(source_param, alpha=1 - d)

    def update_parameters(self, model: nn.Module) -> None:
        """One update from ``model``'s current weights (after an optimiser
        step)."""
        self.steps += 1
        steps = int(self.steps.item())
        source = (
            model.state_dict()
            if self.update_buffers else dict(model.named_parameters()))
        for name, averaged in self.avg_parameters.items():
            if averaged.dtype.is_floating_point:
                self.avg_func(averaged.data,
                              source[name].data.to(averaged.device), steps)
        if not self.update_buffers:
            for b_avg, b_src in zip(self.module.buffers(), model.buffers()):
                b_avg.data.copy_(b_src.data.to(b_avg.device))

    def extra_repr(self) -> str:
        return f'decay={self.decay}, warmups={self.warmups}'
