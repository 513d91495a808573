"""The deterministic weights, input and samples of the RT-DETR parity
fixtures (``tests/data/rtdetr_authors/``).

The fixture script (``rtdetr_encoder_fixtures.py``, beside this file) and
the tests share this module: every tensor of a state dict comes from its
name, shape and a seed alone, so the tests rebuild the released modules'
weights without storing them. The values keep activations at a moderate
scale through a deep ResNet in eval mode: conv / linear weights
``N(0, 2 / fan_in)`` (He), BN / LayerNorm scales ``U[0.5, 1]`` and shifts
``U[-0.1, 0.1]``, running means ``U[-0.1, 0.1]`` and variances
``U[0.5, 1.5]``.
"""
import zlib
from typing import Dict, Iterable, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: the seed of every fixture (recorded in each file)
SEED = 51
#: values sampled per output level
NUM_SAMPLES = 256


def _generator(name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(
        (zlib.crc32(name.encode()) * 1000003 + seed) % (2**63))


def rule_tensor(name: str, shape: Sequence[int], seed: int = SEED) -> Tensor:
    """The float32 value of the state dict entry ``name`` of ``shape`` (an
    int64 zero for ``num_batches_tracked``)."""
    leaf = name.rsplit('.', 1)[-1]
    if leaf == 'num_batches_tracked':
        return torch.zeros(shape, dtype=torch.long)
    gen = _generator(name, seed)
    shape = tuple(shape)

    def uniform(low: float, high: float) -> Tensor:
        return torch.rand(shape, generator=gen) * (high - low) + low

    if leaf == 'running_var':
        return uniform(0.5, 1.5)
    if len(shape) >= 2:  # conv / linear / in_proj weights
        fan_in = 1
        for size in shape[1:]:
            fan_in *= size
        return torch.randn(shape, generator=gen) * (2.0 / fan_in)**0.5
    if leaf == 'weight':  # a norm's scale
        return uniform(0.5, 1.0)
    return uniform(-0.1, 0.1)  # biases, shifts, running means


def rule_state(names_shapes: Iterable[Tuple[str, Sequence[int]]],
               seed: int = SEED) -> Dict[str, Tensor]:
    """``{name: rule_tensor(name, shape)}``."""
    return {
        name: rule_tensor(name, shape, seed)
        for name, shape in names_shapes
    }


def rule_image(small: Tensor, size: Tuple[int, int]) -> Tensor:
    """The network input: the stored ``(3, h, w)`` uint8 image, bilinearly
    resized to ``size`` (no corner alignment), in ``[0, 1]`` (the released
    preprocessing divides by 255, no mean / std): ``(1, 3, H, W)``."""
    image = small.float()[None] / 255.
    return F.interpolate(image, size=size, mode='bilinear',
                         align_corners=False)


def small_image(seed: int = SEED) -> Tensor:
    """A ``(3, 60, 80)`` uint8 image from the seed (stored in the fixture;
    this only makes it)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, 60, 80), generator=gen,
                         dtype=torch.uint8)


def sample_index(numel: int, seed: int = SEED) -> Tensor:
    """``NUM_SAMPLES`` flat indices into a level of ``numel`` values."""
    gen = torch.Generator().manual_seed(seed + numel)
    return torch.randperm(numel, generator=gen)[:NUM_SAMPLES]


def level_record(level: Tensor, seed: int = SEED) -> Dict:
    """What a fixture keeps of one output level: its shape, the values at
    :func:`sample_index` and float64 checksums (sum, sum of absolute
    values, sum of squares)."""
    flat = level.detach().double().flatten()
    index = sample_index(flat.numel(), seed)
    return dict(
        shape=list(level.shape),
        index=index.tolist(),
        values=flat[index].tolist(),
        sum=flat.sum().item(),
        abs_sum=flat.abs().sum().item(),
        sq_sum=(flat * flat).sum().item())
