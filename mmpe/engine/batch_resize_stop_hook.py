"""Stop RT-DETR's batch-level multi-scale training from an epoch on.

The RT-DETR authors' collate function resizes batches while
``epoch < stop_epoch`` (0-based epochs; ``stop_epoch: 71`` of 72 in the
RT-DETRv2 recipes), the same epoch from which their ``stop_epoch`` policy
drops the photometric, zoom-out and IoU-crop transforms (in mmdet:
``PipelineSwitchHook(switch_epoch=...)``). mmdet has no hook for a batch
augment; this one turns off every ``RTDETRBatchResize`` of the model's data
preprocessor before each training epoch ``>= stop_epoch``, so a run
resumed past that epoch trains at one size too.
"""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS

from ..datasets.rtdetr_batch_resize import RTDETRBatchResize
from ..utils.arg_checks import check_int


@HOOKS.register_module()
class BatchResizeStopHook(Hook):
    """Disable the model's ``RTDETRBatchResize`` from ``stop_epoch`` on.

    Args:
        stop_epoch (int): The first epoch (0-based, as ``runner.epoch``)
            trained without the batch resize, >= 0.
    """

    priority = 'NORMAL'

    def __init__(self, stop_epoch: int) -> None:
        check_int('stop_epoch', stop_epoch, minimum=0)
        self.stop_epoch = stop_epoch

    def before_train_epoch(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        augments = getattr(
            getattr(model, 'data_preprocessor', None), 'batch_augments',
            None) or []
        resizes = [a for a in augments if isinstance(a, RTDETRBatchResize)]
        if not resizes:
            raise ValueError(
                'BatchResizeStopHook found no RTDETRBatchResize in the '
                "model's data_preprocessor.batch_augments; add one (the "
                'RT-DETR configs do) or remove the hook')
        enabled = runner.epoch < self.stop_epoch
        if any(r.enabled != enabled for r in resizes):
            runner.logger.info(
                f'Epoch {runner.epoch}: batch resize '
                f"{'on' if enabled else 'off'} (stop_epoch "
                f'{self.stop_epoch})')
        for resize in resizes:
            resize.enabled = enabled
