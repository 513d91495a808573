"""Builders shared by the compile tests: small DETR-family detectors with a
given ``encoder_pe``, the encoder call as a function of a feature map (so that
the grid is the map's symbolic size), and inputs with a padded image."""
import copy
import os.path as osp

import torch
from mmdet.registry import MODELS
from mmengine.config import Config

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
QUICK = osp.join(ROOT, 'configs', 'quickstart')
#: mmdet detector -> a quick-start config of its mmpe subclass
DETECTOR_CONFIGS = {
    'DETR': 'detr_irpe_r18_synthetic.py',
    'ConditionalDETR': 'conditional-detr_irpe_r18_synthetic.py',
    'DABDETR': 'dab-detr_irpe_r18_synthetic.py',
}
#: grids (h, w) a stream of batches gives the encoder
GRIDS = ((6, 7), (9, 5), (8, 11), (12, 10), (5, 13))


def small_detector(detector: str, encoder_pe: dict, seed: int = 0,
                   num_layers: int = 1):
    """The quick-start config of ``detector`` with ``encoder_pe`` and
    ``num_layers`` encoder layers, initialised, in eval mode."""
    cfg = copy.deepcopy(
        Config.fromfile(osp.join(QUICK, DETECTOR_CONFIGS[detector])).model)
    cfg.encoder.num_layers = num_layers
    attn = cfg.encoder.layer_cfg.self_attn_cfg
    for key in ('rpe_cfg', 'rpe_on', 'rope_cfg'):
        attn.pop(key, None)
    cfg.encoder_pe = dict(encoder_pe)
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


class EncoderCall(torch.nn.Module):
    """``detector``'s absolute encoding and encoder as the detector calls
    them, from a feature map ``(B, C, h, w)`` and its padding mask
    ``(B, h, w)``: the grid (and the RoPE positions of normalised
    coordinates) are read from the map's shape and the mask inside the
    call, as :meth:`PEEncoderMixin.pre_transformer` does."""

    def __init__(self, detector) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, feat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        det = self.detector
        height, width = feat.shape[-2:]
        if det.abs_pe == 'learnable':
            pos = det._learned_pos(feat)
        else:
            # (B, C, h, w) -> (B, h * w, C); 'none' zeroes it as the mixin
            pos = det.positional_encoding(mask).flatten(2).transpose(1, 2)
            if det.abs_pe == 'none':
                pos = torch.zeros_like(pos)
        tokens = feat.flatten(2).transpose(1, 2)  # (B, h * w, C)
        # RoPE positions from the grid and the mask (None: integer indices)
        rope_pos = None
        if det.rope_coords is not None:
            rope_pos = det.rope_coords((height, width), mask.flatten(1))
        return det.forward_encoder(tokens, mask.flatten(1), pos,
                                   (height, width), rope_pos)['memory']


def feature_batch(grid, channels: int, batch: int = 2, seed: int = 0):
    """Features ``(B, C, h, w)`` and a mask ``(B, h, w)`` whose last image
    is padded (its bottom row and right column)."""
    h, w = grid
    g = torch.Generator().manual_seed(seed)
    feat = torch.randn(batch, channels, h, w, generator=g)
    mask = torch.zeros(batch, h, w, dtype=torch.bool)
    mask[-1, h - 1:] = True
    mask[-1, :, w - 1:] = True
    return feat, mask
