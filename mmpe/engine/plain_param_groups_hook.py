"""Make the optimizer's parameter groups plain dicts, so that
``torch.compile`` can trace ``optimizer.step()``.

MMEngine's ``DefaultOptimWrapperConstructor`` puts the parameter groups into
the optimizer config, a ``ConfigDict``, before building the optimizer, so
every ``optimizer.param_groups`` entry is a ``ConfigDict``. MMEngine's
``compile`` setting compiles ``model.train_step``, which calls
``optimizer.step()``; TorchDynamo (PyTorch 2.13) fails on parameter groups of
a ``dict`` subclass (``InternalTorchDynamoError: 'UserDefinedDictVariable'
object has no attribute 'items'``). ``configs/_base_/runtime_mmpe.py``
declares this hook (and :class:`~mmpe.engine.MMPERunner` adds it where a
config left it out); elsewhere::

    custom_hooks = [dict(type='PlainParamGroupsHook')]
"""
from mmengine.hooks import Hook
from torch.optim import Optimizer

from mmdet.registry import HOOKS


def plain_param_groups(optimizer: Optimizer) -> None:
    """Replace every parameter group of ``optimizer`` by a plain ``dict``
    with the same items, in place (the list object is kept, so schedulers
    holding it see the change)."""
    groups = optimizer.param_groups
    for i, group in enumerate(groups):
        if type(group) is not dict:
            groups[i] = dict(group)


@HOOKS.register_module()
class PlainParamGroupsHook(Hook):
    """Turns the parameter groups of every optimizer of the run into plain
    dicts before training starts (:func:`plain_param_groups`).

    ``before_train`` runs after the Runner has built the optimizer wrapper
    and before the first (possibly compiled) ``train_step``. Learning rates,
    momenta and weight decays are unchanged, and so is the optimizer's state
    dict, so checkpoints and resuming are unaffected.
    """

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        # an OptimWrapperDict holds one wrapper per model part
        wrappers = wrapper.values() if hasattr(wrapper, 'values') else [
            wrapper
        ]
        for w in wrappers:
            plain_param_groups(w.optimizer)
