"""Runner hook: the backbone of a padded batch learns where the padding is.

See :func:`mmpe.models.utils.attach_padding_mask`. Add to a config::

    custom_hooks = [dict(type='BackbonePaddingMaskHook')]
"""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS


@HOOKS.register_module()
class BackbonePaddingMaskHook(Hook):
    """Attach :func:`attach_padding_mask` to the runner's detector once, so
    its mask-aware backbone (CPVT) sees each batch's padding in training,
    validation and testing."""

    priority = 'NORMAL'

    def before_run(self, runner) -> None:
        # imported here: mmpe.engine loads before mmpe.models
        from mmpe.models.utils import attach_padding_mask
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._handle = attach_padding_mask(model)

    def after_run(self, runner) -> None:
        handle = getattr(self, '_handle', None)
        if handle is not None:
            handle.remove()
            self._handle = None
