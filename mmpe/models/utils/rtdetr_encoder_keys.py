"""Key mapping of RT-DETR's released backbone and hybrid encoder.

From the names of ``rtdetrv2_pytorch`` (``src/nn/backbone/presnet.py``:
``PResNet``; ``src/zoo/rtdetr/hybrid_encoder.py``: ``HybridEncoder``, both
versions of its input projections) to mmpe's: the backbone is mmdet's
ResNet-vd (``ResNetV1d``), the encoder
:class:`~mmpe.models.necks.RTDETRHybridEncoder`. Names without a prefix
(``conv1.conv1_1.conv.weight``, ``input_proj.0.conv.weight``): the caller
strips the detector's ``backbone.`` / ``encoder.`` and adds mmpe's.

Released frozen BNs (``freeze_norm=True``) have no ``num_batches_tracked``;
:func:`convert_presnet` adds a zero one for every BN, so that mmdet's BN
loads strictly (the count is not used by a BN with a momentum).
"""
import re
from typing import Dict

import torch

#: the deep stem's three conv + BN layers -> their places in mmdet's
#: ``stem`` (conv, BN, ReLU per layer)
_STEM = {'conv1_1': 0, 'conv1_2': 3, 'conv1_3': 6}
#: the released bottleneck / basic block branches -> mmdet's convs and BNs
_BRANCHES = {'branch2a': '1', 'branch2b': '2', 'branch2c': '3'}


def presnet_key(name: str) -> str:
    """A released ``PResNet`` key -> mmdet's ResNet key.

    ``conv1.conv1_{1,2,3}.{conv,norm}`` -> ``stem.{0,1,3,4,6,7}``;
    ``res_layers.i.blocks.j.branch2{a,b,c}.{conv,norm}`` ->
    ``layer{i+1}.j.{conv,bn}{1,2,3}``; the shortcut's conv and norm,
    ``short.{conv,norm}`` (stride 1) or ``short.conv.{conv,norm}`` (after
    the average pool), -> ``downsample.{1,2}`` (mmdet's ResNet-vd puts a
    pool first in every shortcut, the identity at stride 1).

    Raises:
        KeyError: A name of no PResNet layer.
    """
    match = re.fullmatch(r'conv1\.(conv1_[123])\.(conv|norm)\.(\w+)', name)
    if match:
        layer, part, leaf = match.groups()
        return f'stem.{_STEM[layer] + (part == "norm")}.{leaf}'
    match = re.fullmatch(r'res_layers\.(\d+)\.blocks\.(\d+)\.(.+)', name)
    if match:
        stage, block, rest = match.groups()
        prefix = f'layer{int(stage) + 1}.{block}'
        match = re.fullmatch(r'(branch2[abc])\.(conv|norm)\.(\w+)', rest)
        if match:
            branch, part, leaf = match.groups()
            kind = 'conv' if part == 'conv' else 'bn'
            return f'{prefix}.{kind}{_BRANCHES[branch]}.{leaf}'
        match = re.fullmatch(r'short\.(conv\.)?(conv|norm)\.(\w+)', rest)
        if match:
            _, part, leaf = match.groups()
            return f'{prefix}.downsample.{1 + (part == "norm")}.{leaf}'
    raise KeyError(f'{name!r} is not a key of the released PResNet '
                   '(conv1.conv1_*, res_layers.*.blocks.*)')


def hybrid_encoder_key(name: str) -> str:
    """A released ``HybridEncoder`` key -> the
    :class:`~mmpe.models.necks.RTDETRHybridEncoder` key.

    Every conv + BN layer's ``norm`` -> ``bn`` (``input_proj.i.{0,1}`` of
    version v1 -> ``input_proj.i.{conv,bn}``); AIFI's
    ``self_attn.{in_proj_*,out_proj}`` -> ``self_attn.attn.*``,
    ``linear1`` / ``linear2`` -> ``ffn.layers.0.0`` / ``ffn.layers.1``,
    ``norm1`` / ``norm2`` -> ``norms.0`` / ``norms.1``. A deployed RepVGG
    block's fused ``conv`` keeps its name.

    Raises:
        KeyError: A name of no HybridEncoder layer.
    """
    match = re.fullmatch(r'input_proj\.(\d+)\.(conv|norm|0|1)\.(\w+)', name)
    if match:
        level, part, leaf = match.groups()
        part = 'conv' if part in ('conv', '0') else 'bn'
        return f'input_proj.{level}.{part}.{leaf}'
    match = re.fullmatch(r'(encoder\.\d+\.layers\.\d+)\.(.+)', name)
    if match:
        prefix, rest = match.groups()
        for old, new in (('self_attn.', 'self_attn.attn.'),
                         ('linear1.', 'ffn.layers.0.0.'),
                         ('linear2.', 'ffn.layers.1.'),
                         ('norm1.', 'norms.0.'), ('norm2.', 'norms.1.')):
            if rest.startswith(old):
                return f'{prefix}.{new}{rest[len(old):]}'
    if re.match(r'(lateral_convs|downsample_convs|fpn_blocks|pan_blocks)\.',
                name):
        return re.sub(r'\.norm\.', '.bn.', name)
    raise KeyError(f'{name!r} is not a key of the released HybridEncoder '
                   '(input_proj, encoder, lateral_convs, fpn_blocks, '
                   'downsample_convs, pan_blocks)')


def convert_presnet(state: Dict[str, torch.Tensor]) -> Dict:
    """A released PResNet state dict (no prefix) with mmdet's names, a zero
    ``num_batches_tracked`` added to every BN that has none."""
    out = {presnet_key(k): v for k, v in state.items()}
    for key in list(out):
        if key.endswith('.running_mean'):
            out.setdefault(key[:-len('running_mean')] + 'num_batches_tracked',
                           torch.zeros((), dtype=torch.long))
    return out


def convert_hybrid_encoder(state: Dict[str, torch.Tensor]) -> Dict:
    """A released HybridEncoder state dict (no prefix) with mmpe's names."""
    return {hybrid_encoder_key(k): v for k, v in state.items()}
