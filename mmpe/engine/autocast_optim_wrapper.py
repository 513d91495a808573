"""Mixed precision without a GPU: bf16 autocast around the forward.

MMEngine 0.10.7's ``AmpOptimWrapper`` asserts a CUDA/NPU/MLU/MUSA device, so
``--amp`` cannot use it on a CPU-only host. bf16 has float32's exponent
range, so it needs no loss scaling: this wrapper only runs the forward under
``torch.autocast`` (``tools/train.py --amp`` picks it when CUDA is absent).
"""
from contextlib import contextmanager
from typing import Union

import torch
from mmengine.optim import OptimWrapper
from torch import nn

from mmdet.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class AutocastOptimWrapper(OptimWrapper):
    """:class:`OptimWrapper` whose forward runs under ``torch.autocast``.

    Args:
        dtype (str or torch.dtype): Autocast dtype, ``'bfloat16'`` (default;
            the one CPU autocast supports well) or ``'float16'``.
        **kwargs: :class:`OptimWrapper`'s arguments.
    """

    DTYPES = ('bfloat16', 'float16')

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16',
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).replace('torch.', '')
        if dtype not in self.DTYPES:
            raise ValueError(f'Unsupported `dtype` {dtype!r} for '
                             f'AutocastOptimWrapper, choose from '
                             f'{self.DTYPES}')
        self.cast_dtype = getattr(torch, dtype)

    @contextmanager
    def optim_context(self, model: nn.Module):
        """Gradient-accumulation context of the parent, plus autocast on the
        model's device type."""
        param = next(model.parameters(), None)
        device_type = param.device.type if param is not None else 'cpu'
        with super().optim_context(model), torch.autocast(
                device_type=device_type, dtype=self.cast_dtype):
            yield
