"""Names and shapes of a timm / DeiT / MAE ViT's state dict, written out by
hand from timm's ``VisionTransformer`` (patch 16, class token, absolute
table, pre-norm blocks with a fused qkv and a 4x MLP, final norm): the
checkpoints the converters and configs are tested on."""
from typing import Dict, Tuple


def timm_vit_shapes(dims: int, depth: int = 12,
                    grid: int = 14) -> Dict[str, Tuple[int, ...]]:
    """``name -> shape`` of a ViT with ``dims`` channels, ``depth`` blocks
    and a table for a ``grid x grid`` patch grid plus the class token (no
    classification head)."""
    shapes = {
        'cls_token': (1, 1, dims),
        'pos_embed': (1, 1 + grid * grid, dims),
        'patch_embed.proj.weight': (dims, 3, 16, 16),
        'patch_embed.proj.bias': (dims, ),
        'norm.weight': (dims, ),
        'norm.bias': (dims, ),
    }
    for i in range(depth):
        for name, shape in (('norm1', (dims, )), ('norm2', (dims, )),
                            ('attn.qkv', (3 * dims, dims)),
                            ('attn.proj', (dims, dims)),
                            ('mlp.fc1', (4 * dims, dims)),
                            ('mlp.fc2', (dims, 4 * dims))):
            shapes[f'blocks.{i}.{name}.weight'] = shape
            shapes[f'blocks.{i}.{name}.bias'] = shape[:1]
    return shapes
