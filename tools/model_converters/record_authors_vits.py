"""Record features of the foundation ViTs' own model code, for the
converters' tests (tests/data/foundation_vits/).

Runs the authors' released model classes from a checkout given on the
command line (never copied here) on small models whose weights come from a
deterministic rule of each parameter's name and shape
(:func:`rule_weights`; the tests rebuild them from the same rule), and
saves their outputs at the pretraining size and at a non-square detection
size::

    git clone https://github.com/facebookresearch/dinov2 /tmp/dinov2
    python tools/model_converters/record_authors_vits.py dinov2 /tmp/dinov2 \\
        tests/data/foundation_vits
    git clone https://github.com/facebookresearch/dinov3 /tmp/dinov3
    python tools/model_converters/record_authors_vits.py dinov3 /tmp/dinov3 \\
        tests/data/foundation_vits

One ``.npz`` per model: ``arch`` (the settings), ``input_<H>x<W>`` is not
stored (the rule makes it: :func:`rule_input`), ``tokens_<H>x<W>`` the
normed tokens of the last block (class token, registers, patches row-major);
``train_tokens_<H>x<W>`` (DINOv3) the same in training mode, torch's default
generator seeded with :data:`TRAIN_SEED` before the forward (its RoPE
coordinate augmentations draw from it).
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import os.path as osp
import sys
import zlib
from functools import partial
from typing import Dict, Tuple

import numpy as np
import torch

#: DINOv2 settings: the hub's (``dinov2/hub/backbones.py``) at a small
#: width and depth; 518 px (37 x 37 tokens) is the pretraining size
DINOV2_MODELS = {
    'dinov2_small': dict(num_register_tokens=0, interpolate_antialias=False,
                         interpolate_offset=0.1),
    'dinov2_small_reg': dict(num_register_tokens=4,
                             interpolate_antialias=True,
                             interpolate_offset=0.0),
}
DINOV2_ARCH = dict(img_size=518, patch_size=14, embed_dim=64, depth=2,
                   num_heads=4, mlp_ratio=4)
#: (H, W) in pixels: the pretraining size, a non-square detection size
DINOV2_SIZES = ((518, 518), (392, 602))
#: DINOv3 settings: the hub's ViT-S/B/L (``dinov3/hub/backbones.py``:
#: RoPE base 100 on 'separate' coordinates rescaled by up to 2 in training,
#: in float32; LayerNorm eps 1e-5; 4 storage tokens; the k bias masked;
#: LayerScale) at a small width and depth; ``dinov3_small_aug`` adds
#: DINOv3's other two coordinate augmentations for a training-mode record
DINOV3_ARCH = dict(img_size=224, patch_size=16, embed_dim=64, depth=2,
                   num_heads=4, ffn_ratio=4, pos_embed_rope_base=100,
                   pos_embed_rope_normalize_coords='separate',
                   pos_embed_rope_dtype='fp32', qkv_bias=True,
                   layerscale_init=1e-5, norm_layer='layernormbf16',
                   ffn_layer='mlp', n_storage_tokens=4, mask_k_bias=True)
DINOV3_MODELS = {
    'dinov3_small': dict(pos_embed_rope_rescale_coords=2),
    'dinov3_small_aug': dict(pos_embed_rope_rescale_coords=2,
                             pos_embed_rope_shift_coords=0.1,
                             pos_embed_rope_jitter_coords=1.5),
}
DINOV3_SIZES = ((224, 224), (384, 576))
#: the seed of torch's default generator before the training-mode forward
TRAIN_SEED = 7


def rule_values(name: str, shape: Tuple[int, ...]) -> torch.Tensor:
    """Uniform-looking values in ``[-0.5, 0.5)`` from the name and the
    element index only (float64 arithmetic, the same on every machine):
    the fractional part of ``43758.5453 sin(12.9898 i + 78.233 s)``,
    ``s`` the name's CRC-32."""
    seed = zlib.crc32(name.encode()) % 100003
    idx = torch.arange(math.prod(shape), dtype=torch.float64)
    val = torch.sin(idx * 12.9898 + seed * 78.233) * 43758.5453
    return (val - val.floor() - 0.5).reshape(shape)


def rule_weights(
        shapes: Dict[str, Tuple[int, ...]]) -> Dict[str, torch.Tensor]:
    """float32 weights for a state dict's names and shapes: linear and
    conv weights of variance ``1 / fan_in``, norm weights near 1, biases,
    tokens, tables and LayerScale of a few tenths."""
    out = {}
    for name, shape in shapes.items():
        u = rule_values(name, shape)
        leaf = name.rsplit('.', 1)[-1]
        if 'norm' in name and leaf == 'weight':
            value = 1 + 0.4 * u
        elif leaf == 'weight' and len(shape) >= 2:
            fan_in = math.prod(shape[1:])
            value = u * 2 * math.sqrt(3 / fan_in)
        elif leaf == 'gamma':
            value = 0.5 + 0.6 * u
        else:  # biases, tokens, position tables
            value = 0.4 * u
        out[name] = value.float()
    return out


def rule_input(height: int, width: int) -> torch.Tensor:
    """The ``(1, 3, H, W)`` float32 image of a size, in ``[-1, 1)``."""
    return (2 * rule_values(f'input_{height}x{width}',
                            (1, 3, height, width))).float()


def import_authors(repo: str, package: str, module: str):
    """``package.module`` of the authors' checkout ``repo``, the package
    registered under its own name (the import path is left as it is)."""
    if package not in sys.modules:
        root = osp.join(repo, package)
        spec = importlib.util.spec_from_file_location(
            package, osp.join(root, '__init__.py'),
            submodule_search_locations=[root])
        sys.modules[package] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[package])
    return importlib.import_module(f'{package}.{module}')


def _dinov2_model(repo: str, settings: dict) -> torch.nn.Module:
    """The authors' ``DinoVisionTransformer`` as their hub builds it
    (``_make_dinov2_model``: LayerScale 1.0, MLP FFN, no block chunks,
    ``MemEffAttention`` blocks), small."""
    layers = import_authors(repo, 'dinov2', 'layers')
    vits = import_authors(repo, 'dinov2', 'models.vision_transformer')
    return vits.DinoVisionTransformer(
        **DINOV2_ARCH, init_values=1.0, ffn_layer='mlp', block_chunks=0,
        block_fn=partial(layers.NestedTensorBlock,
                         attn_class=layers.MemEffAttention),
        **settings).eval()


def record_dinov2(repo: str, out_dir: str) -> None:
    os.environ.setdefault('XFORMERS_DISABLED', '1')
    for name, settings in DINOV2_MODELS.items():
        model = _dinov2_model(repo, settings)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        model.load_state_dict(rule_weights(shapes), strict=True)
        arrays = dict(arch=np.array(json.dumps(dict(DINOV2_ARCH,
                                                    **settings))))
        with torch.no_grad():
            for height, width in DINOV2_SIZES:
                feats = model.forward_features(rule_input(height, width))
                tokens = torch.cat([
                    feats['x_norm_clstoken'][:, None],
                    feats['x_norm_regtokens'], feats['x_norm_patchtokens']
                ], dim=1)
                arrays[f'tokens_{height}x{width}'] = tokens.numpy()
        path = osp.join(out_dir, f'{name}.npz')
        np.savez_compressed(path, **arrays)
        print(f'{path}: {osp.getsize(path) / 1e6:.2f} MB')


def _dinov3_model(repo: str, settings: dict) -> torch.nn.Module:
    """The authors' ``DinoVisionTransformer`` as their hub builds it
    (``_make_dinov3_vit``), small; its buffers (RoPE periods, the k-bias
    mask) from their ``init_weights``."""
    vits = import_authors(repo, 'dinov3', 'models.vision_transformer')
    model = vits.DinoVisionTransformer(**DINOV3_ARCH, **settings)
    model.init_weights()
    return model.eval()


def _load_rule_parameters(model: torch.nn.Module) -> None:
    """The rule's values for every parameter; buffers stay the model's."""
    buffers = {k for k, _ in model.named_buffers()}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
              if k not in buffers}
    missing, unexpected = model.load_state_dict(rule_weights(shapes),
                                                strict=False)
    assert set(missing) == buffers and not unexpected, (missing, unexpected)


def record_dinov3(repo: str, out_dir: str) -> None:
    for name, settings in DINOV3_MODELS.items():
        model = _dinov3_model(repo, settings)
        _load_rule_parameters(model)
        arch = dict(DINOV3_ARCH, **settings)
        arrays = dict(arch=np.array(json.dumps(arch)))
        sizes = DINOV3_SIZES if name == 'dinov3_small' else ()
        with torch.no_grad():
            for height, width in sizes:
                feats = model.forward_features(rule_input(height, width))
                tokens = torch.cat([
                    feats['x_norm_clstoken'][:, None],
                    feats['x_storage_tokens'], feats['x_norm_patchtokens']
                ], dim=1)
                arrays[f'tokens_{height}x{width}'] = tokens.numpy()
            # training mode: the coordinate augmentations draw from torch's
            # default generator (drop path is 0: nothing else draws)
            height, width = DINOV3_SIZES[1]
            model.train()
            torch.manual_seed(TRAIN_SEED)
            feats = model.forward_features(rule_input(height, width))
            arrays[f'train_tokens_{height}x{width}'] = torch.cat([
                feats['x_norm_clstoken'][:, None], feats['x_storage_tokens'],
                feats['x_norm_patchtokens']
            ], dim=1).numpy()
        path = osp.join(out_dir, f'{name}.npz')
        np.savez_compressed(path, **arrays)
        print(f'{path}: {osp.getsize(path) / 1e6:.2f} MB')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('family', choices=('dinov2', 'dinov3'))
    parser.add_argument('repo', help="the authors' checkout")
    parser.add_argument('out_dir', help='where the .npz files go')
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.set_num_threads(1)
    record = dict(dinov2=record_dinov2, dinov3=record_dinov3)[args.family]
    record(args.repo, args.out_dir)


if __name__ == '__main__':
    main()
