"""BatchResizeStopHook: the authors' ``epoch < stop_epoch`` rule of their
collate function (0-based epochs), also after a resume past the stop."""
import logging
import types

import pytest
from mmdet.models.data_preprocessors import DetDataPreprocessor
from torch import nn

from mmpe.datasets import RTDETRBatchResize
from mmpe.engine import BatchResizeStopHook


class _Model(nn.Module):

    def __init__(self, batch_augments):
        super().__init__()
        self.data_preprocessor = DetDataPreprocessor(
            batch_augments=batch_augments)


def _runner(model, epoch):
    return types.SimpleNamespace(
        model=model, epoch=epoch, logger=logging.getLogger('test'))


def test_stops_from_the_epoch_on():
    model = _Model([dict(type='RTDETRBatchResize')])
    resize = model.data_preprocessor.batch_augments[0]
    assert isinstance(resize, RTDETRBatchResize)
    hook = BatchResizeStopHook(stop_epoch=3)
    # the authors: multi-scale while epoch < stop_epoch
    expected = {epoch: epoch < 3 for epoch in range(5)}
    for epoch, on in expected.items():
        hook.before_train_epoch(_runner(model, epoch))
        assert resize.enabled is on, epoch
    # a run resumed at epoch 4 starts without it
    fresh = _Model([dict(type='RTDETRBatchResize')])
    hook.before_train_epoch(_runner(fresh, 4))
    assert not fresh.data_preprocessor.batch_augments[0].enabled


def test_no_batch_resize_is_an_error():
    with pytest.raises(ValueError, match='no RTDETRBatchResize'):
        BatchResizeStopHook(stop_epoch=1).before_train_epoch(
            _runner(_Model(None), 0))


@pytest.mark.parametrize('value', [-1, 1.5, True])
def test_bad_stop_epoch(value):
    with pytest.raises(ValueError, match='`stop_epoch`'):
        BatchResizeStopHook(stop_epoch=value)
