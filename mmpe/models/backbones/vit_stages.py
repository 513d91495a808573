"""The depth of each parameter of the plain ViT: its stages.

Stage 0 is the input (patch embedding, class and register tokens, position
table), stage ``i + 1`` block ``i`` with what belongs to it (the PEG after
it, its RoPE-Mixed frequencies), stage ``depth + 1`` the rest (the final
norm). The same stages give layer-wise learning-rate decay
(:meth:`param_layer_id`, read by ``ViTLayerDecayOptimWrapperConstructor``)
and ``frozen_stages``.
"""
from typing import List

import torch.nn as nn


class ViTStagesMixin:
    """Layer ids and frozen stages of :class:`~mmpe.models.backbones.CPVT`.

    The host has ``patch_embed``, ``cls_token``, ``register_tokens``,
    ``pos_embed`` (parameters or None), ``blocks``, ``ropes``, ``pegs``
    with ``peg_positions``, ``norm``, ``depth`` and ``frozen_stages``.
    """

    def param_layer_id(self, name: str) -> int:
        """Depth of a parameter for layer-wise learning-rate decay.

        As BEiT (Bao et al. 2022) and ViTDet's recipe (Li et al. 2022):
        0 for the input (patch embedding, class token, position table),
        ``i + 1`` for block i and what belongs to it (the PEG after it, its
        RoPE-Mixed frequencies), ``depth + 1`` for the rest (final norm).

        Args:
            name (str): A name of :meth:`named_parameters`.

        Returns:
            int: In ``[0, depth + 1]``.
        """
        head, _, rest = name.partition('.')
        if head in ('patch_embed', 'cls_token', 'register_tokens',
                    'pos_embed'):
            return 0
        if head in ('blocks', 'ropes'):
            return int(rest.split('.')[0]) + 1
        if head == 'pegs':
            return self.peg_positions[int(rest.split('.')[0])] + 1
        return self.depth + 1

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        frozen: List[nn.Module] = [self.patch_embed]
        params = [self.cls_token, self.register_tokens, self.pos_embed]
        frozen += [self.blocks[i] for i in range(self.frozen_stages)]
        frozen += list(self.ropes)[:self.frozen_stages]
        frozen += [
            peg for pos, peg in zip(self.peg_positions, self.pegs)
            if pos < self.frozen_stages
        ]
        if self.frozen_stages == self.depth:
            frozen.append(self.norm)
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        for param in params:
            if param is not None:
                param.requires_grad = False

    def train(self, mode: bool = True) -> nn.Module:
        """Set the mode, frozen stages staying in eval mode."""
        super().train(mode)
        self._freeze_stages()
        return self
