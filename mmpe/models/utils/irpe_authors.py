"""The iRPE authors' table layout (microsoft/Cream ``iRPE/``) in mmpe's.

Their bias tables ``lookup_table_bias`` are ``(H', buckets)``; contextual
``lookup_table_weight`` is ``(H', head_dim, buckets)`` on q / k and
``(H', buckets, head_dim)`` on v. mmpe's :class:`~mmpe.models.layers.iRPE`
keeps ``(H', buckets)`` and ``(H', buckets, head_dim)``. Shared by the
DETR-iRPE and DeiT-iRPE converters in ``tools/model_converters/``.
"""
import torch


def authors_table_to_mmpe(key: str, on: str, kind: str,
                          value: torch.Tensor) -> torch.Tensor:
    """One authors' table in mmpe's layout (a new tensor).

    Args:
        key (str): The checkpoint key, named in errors.
        on (str): 'q', 'k' or 'v'.
        kind (str): 'bias' (``lookup_table_bias``) or 'weight'
            (contextual ``lookup_table_weight``).
        value (Tensor): The authors' table.

    Returns:
        Tensor: bias ``(H', buckets)``; contextual ``(H', buckets, head_dim)``.
    """
    if kind == 'bias':
        if on == 'v':
            raise ValueError(f'{key}: the authors\' code has no bias-mode '
                             'table on values, cannot place it')
        if value.dim() != 2:
            raise ValueError(f'{key}: a bias table is (heads, buckets), got '
                             f'shape {tuple(value.shape)}')
        return value.clone()
    if value.dim() != 3:
        raise ValueError(f'{key}: a contextual table is 3-D, got shape '
                         f'{tuple(value.shape)}')
    # q / k: (H', head_dim, nb) -> (H', nb, head_dim); v is already so
    table = value.transpose(1, 2) if on in 'qk' else value
    return table.contiguous().clone()
