"""Shape policy of the compiled FlexAttention path: a few padded sizes
instead of one compilation per (batch, grid).

``torch.compile(flex_attention, dynamic=False)`` specialises on every shape
it sees: the tokens ``L`` of q, k, v, the contextual lookups
``(B, H, L, num_buckets)``, the key mask ``(B, L)`` and the per-axis index
tables of the ``score_mod``. A detector trained on randomly resized images
(DETR's recipe: short side 480-800, long side up to 1333, batches padded to
their largest image) gives a new C5 grid almost every batch, so one
compilation per grid would pass dynamo's recompile limit (8 per code object
by default) within a few dozen steps, after which dynamo runs FlexAttention
uncompiled, materialising the whole ``(B, H, L, L)`` score tensor.

The policy: each call is padded to a size bucket, and nothing else of the
grid reaches a compiled shape or a guarded constant.

* Tokens: ``L`` is padded at the end to the next power of two, at least
  one FlexAttention block (:data:`FLEX_BLOCK`, 128): ``log2`` of the range
  of lengths compilations per (batch, dtype, heads, head size), e.g. four
  (256 ... 2048) for every C5 grid of DETR's recipe. Padded keys are masked
  (``-inf`` through the key mask), padded queries are dropped from the
  output, so the result equals the unpadded attention.
* Work: a power of two wastes up to half of the tokens, but the call's
  ``BlockMask`` (:func:`tail_block_mask`) lists only the key blocks that
  hold real tokens and none for query blocks of padding alone: the kernel
  skips the padded blocks, so the work grows by less than one block row
  and column of 128 tokens. The padded q, k, v, output and lookups are
  ``O(L)`` memory, at most twice the unpadded ones.
* Grid: the grid's width and its number of cells enter the ``score_mod``
  as 0-d tensors (values, not guarded constants), and the per-axis index
  tables are made for a square grid of :func:`table_side` cells per side,
  fixed by the bucket for grids up to an aspect ratio of 4. iRPE's buckets
  depend on the offset between two cells only (Eq. 18 of Wu et al., 2021,
  per axis or of the distance), so the tables of a smaller grid are the
  top-left block of the larger ones and any grid reads them unchanged.

Not dynamic shapes: in PyTorch 2.13 inductor's CPU FlexAttention template
fails to build with symbolic sizes, and the CUDA template's dynamic-shape
path has not been run by mmpe (no GPU so far); static shapes are what both
templates build, and the padded ones are checked on CPU (forward) here and
on CUDA by ``make gpu-check``. The compiled
wrapper keeps its own recompile count (``isolate_recompiles``) with a limit
of :data:`FLEX_RECOMPILE_LIMIT` and ``fullgraph=True``, so that past the
limit a call raises (and :class:`~mmpe.models.layers.PEAttention` falls back
to a backend without an ``(L, L)`` tensor, with a warning) instead of
running FlexAttention uncompiled.
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

#: FlexAttention's block of query rows and key columns (its default)
FLEX_BLOCK = 128
#: Compilations of the compiled wrapper before a call raises; buckets from
#: 128 to 16384 tokens are 8 per (batch, dtype, heads, head size, term
#: config), and a training run sees one or two batch sizes.
FLEX_RECOMPILE_LIMIT = 16


def padded_length(length: int) -> int:
    """The bucket of ``length`` tokens: the next power of two, at least
    :data:`FLEX_BLOCK`."""
    if length < 1:
        raise ValueError(f'`length` must be >= 1, got {length!r}')
    return max(FLEX_BLOCK, 1 << (length - 1).bit_length())


def table_side(height: int, width: int, padded: int) -> int:
    """Cells per side of the square grid the index tables are made for.

    A power of two, at least ``2 sqrt(padded)`` (so that a grid of at most
    ``padded`` cells with an aspect ratio up to 4 never needs more: the
    side depends on the bucket alone) and at least ``max(height, width)``.
    """
    least = max(height, width, math.ceil(2 * math.sqrt(padded)))
    return 1 << (least - 1).bit_length()


def pad_tokens(x: Tensor, padded: int) -> Tensor:
    """``(B, H, L, d)`` -> ``(B, H, padded, d)``, zeros appended."""
    return F.pad(x, (0, 0, 0, padded - x.shape[2]))


def padded_key_mask(key_padding_mask: Optional[Tensor], batch: int,
                    length: int, padded: int,
                    device: torch.device) -> Tensor:
    """``(B, padded)`` bool, True at the batch's padded keys and at the
    tokens appended by :func:`pad_tokens`."""
    mask = torch.ones(batch, padded, dtype=torch.bool, device=device)
    if key_padding_mask is None:
        mask[:, :length] = False
    else:
        mask[:, :length] = key_padding_mask.bool()
    return mask


def tail_block_mask(length: int, padded: int, device: torch.device):
    """The ``BlockMask`` of a call padded from ``length`` to ``padded``
    tokens: every query block that holds a real token sees the key blocks
    that hold real tokens; query blocks of padding alone see none (their
    rows are dropped). Inside the last partial block the key mask of
    :func:`padded_key_mask` masks the padded keys.

    Returns:
        BlockMask: For any batch and head (broadcast), ``FLEX_BLOCK``
        square blocks, ``seq_lengths=(padded, padded)``.
    """
    from torch.nn.attention.flex_attention import BlockMask
    blocks = padded // FLEX_BLOCK
    used = -(-length // FLEX_BLOCK)  # blocks holding real tokens
    # (1, 1, blocks): key blocks per query block
    num = torch.full((1, 1, blocks), used, dtype=torch.int32, device=device)
    num[..., used:] = 0
    # (1, 1, blocks, blocks): the key blocks in order (the first `num` read)
    indices = torch.arange(blocks, dtype=torch.int32, device=device)
    indices = indices.expand(1, 1, blocks, blocks).contiguous()
    return BlockMask.from_kv_blocks(num, indices, BLOCK_SIZE=FLEX_BLOCK,
                                    seq_lengths=(padded, padded))
