"""Detectors that pass each batch's padding mask to their backbone.

MMDetection pads the images of a batch bottom/right to one size and calls
``self.backbone(batch_inputs)``: the padding is image content for the
backbone. A mask-aware ViT (CPVT) can do better -- padded tokens are never
attended to and the PEG's zero padding starts at each image's own border
(Chu et al. 2021, Sec. 3.2) -- so every image gets its single-image
features. :class:`PaddingAwareMixin` gives it the mask through the call:
``extract_feat(batch_inputs, batch_data_samples)`` builds the ``(B, H, W)``
mask from the samples' ``img_shape`` (see
:func:`mmpe.models.utils.padding_mask_from_samples`) and calls
``self.backbone(batch_inputs, padding_mask=mask)``.

mmdet's ``loss`` / ``predict`` / ``_forward`` call ``extract_feat(inputs)``
without the samples, so the mixin's entry points hold their own call's
samples while that call runs and restore what was there before when it
returns or raises: every ``extract_feat`` inside one call (however many)
gets that call's mask, and nothing outlives the call. The backbone holds no
state, and the detector adds no parameter: state-dict keys are those of the
plain mmdet detector, so checkpoints load into either.

Config switch: ``model.type='PaddingAwareMaskRCNN'`` (or
``'PaddingAwareRetinaNet'``, ``'PaddingAwareDETR'``) instead of the mmdet
type; ``'PaddingAwareDINO'`` also refuses a pyramid whose number of levels
is not its deformable attention's. Another detector:
``class X(PaddingAwareMixin, ItsMMDetClass)``.
"""
import inspect
from contextlib import contextmanager
from typing import Iterator, Tuple

from torch import Tensor

from mmdet.models.detectors import DETR, DINO, MaskRCNN, RetinaNet
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList, SampleList
from ...utils.config_checks import check_feature_levels
from ..utils.padding_mask import padding_mask_from_samples


class PaddingAwareMixin:
    """Put before an mmdet detector class whose ``extract_feat`` is
    backbone then optional neck (single-stage, two-stage, DETR family).

    The backbone's ``forward`` must take ``padding_mask`` (a ``(B, H, W)``
    bool pixel mask, True on padding), as :class:`mmpe.models.CPVT` does.
    One call at a time per module instance, as for any ``nn.Module`` with
    run-time state; ``nn.DataParallel`` replicas are separate instances.
    """

    #: data samples of the entry-point call in progress (None outside one)
    _call_samples: OptSampleList = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        backbone = self.backbone
        params = inspect.signature(backbone.forward).parameters
        if 'padding_mask' not in params:
            raise ValueError(
                f'{type(self).__name__}: backbone {type(backbone).__name__} '
                'takes no `padding_mask`; mask-aware backbones: CPVT (or use '
                'the plain mmdet detector type)')

    @contextmanager
    def _samples_of_call(self, samples: OptSampleList) -> Iterator[None]:
        outer = self._call_samples
        self._call_samples = samples
        try:
            yield
        finally:
            self._call_samples = outer

    def forward(self,
                inputs: Tensor,
                data_samples: OptSampleList = None,
                mode: str = 'tensor'):
        # also here: subclasses may override loss/predict above the mixin
        with self._samples_of_call(data_samples):
            return super().forward(inputs, data_samples, mode)

    def loss(self, batch_inputs: Tensor, batch_data_samples: SampleList):
        with self._samples_of_call(batch_data_samples):
            return super().loss(batch_inputs, batch_data_samples)

    def predict(self,
                batch_inputs: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        with self._samples_of_call(batch_data_samples):
            return super().predict(
                batch_inputs, batch_data_samples, rescale=rescale)

    def _forward(self,
                 batch_inputs: Tensor,
                 batch_data_samples: OptSampleList = None):
        with self._samples_of_call(batch_data_samples):
            return super()._forward(batch_inputs, batch_data_samples)

    def extract_feat(self,
                     batch_inputs: Tensor,
                     batch_data_samples: OptSampleList = None
                     ) -> Tuple[Tensor, ...]:
        """Backbone (told the padding) and optional neck.

        Args:
            batch_inputs (Tensor): Padded images ``(B, C, H, W)``.
            batch_data_samples (list[DetDataSample], optional): Their
                samples; defaults to those of the entry-point call in
                progress. None outside a call, or empty: no mask.

        Returns:
            tuple[Tensor]: The backbone's (or neck's) feature maps.
        """
        samples = batch_data_samples
        if samples is None:
            samples = self._call_samples
        mask = padding_mask_from_samples(samples,
                                         batch_inputs) if samples else None
        x = self.backbone(batch_inputs, padding_mask=mask)
        if self.with_neck:
            x = self.neck(x)
        return x


@MODELS.register_module()
class PaddingAwareMaskRCNN(PaddingAwareMixin, MaskRCNN):
    """mmdet's ``MaskRCNN`` whose backbone sees each batch's padding."""


@MODELS.register_module()
class PaddingAwareRetinaNet(PaddingAwareMixin, RetinaNet):
    """mmdet's ``RetinaNet`` whose backbone sees each batch's padding."""


@MODELS.register_module()
class PaddingAwareDETR(PaddingAwareMixin, DETR):
    """mmdet's ``DETR`` whose backbone sees each batch's padding."""


@MODELS.register_module()
class PaddingAwareDINO(PaddingAwareMixin, DINO):
    """mmdet's ``DINO`` whose backbone sees each batch's padding.

    Built only when the neck gives as many maps as the deformable attention
    has levels (``num_feature_levels``, the encoder's and the decoder's
    ``num_levels``): a mismatch is refused naming the fields
    (:func:`mmpe.utils.config_checks.check_feature_levels`) instead of
    failing at the first forward. Head, encoder and decoder are mmdet's.
    """

    def __init__(self, *args, **kwargs) -> None:
        check_feature_levels(
            type(self).__name__, kwargs.get('neck'),
            kwargs.get('num_feature_levels', 4), kwargs.get('encoder'),
            kwargs.get('decoder'))
        super().__init__(*args, **kwargs)
