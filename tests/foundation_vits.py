"""What the foundation-ViT converter and config tests share: the fixture
script's weight rule and inputs (``tools/model_converters/
record_authors_vits.py``), the recorded tokens (tests/data/foundation_vits/),
the authors' state-dict layouts (DINOv2's names and shapes, DINOv3's with
its buffers; written from their ``vision_transformer.py`` and ``layers/``),
a CPVT built from a converted config, its normed tokens, and a converter's
CLI run in-process.
"""
import importlib.util
import json
import os.path as osp
import sys

import numpy as np
import torch

from mmpe.models.backbones import CPVT

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..'))
FIXTURES = osp.join(ROOT, 'tests', 'data', 'foundation_vits')
CONVERTERS = osp.join(ROOT, 'tools', 'model_converters')


def load_tool(name):
    """A script of tools/model_converters/ as a module."""
    spec = importlib.util.spec_from_file_location(
        name, osp.join(CONVERTERS, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = load_tool('record_authors_vits')


def fixture(name):
    """The recorded model's settings (dict) and arrays (npz)."""
    data = np.load(osp.join(FIXTURES, f'{name}.npz'))
    return json.loads(str(data['arch'])), data


def build(config, state_dict, **overrides):
    """CPVT of a converted ``config`` (``overrides`` on top), the converted
    weights loaded strictly, in eval mode."""
    args = {k: v for k, v in dict(config, **overrides).items()
            if k != 'type'}
    model = CPVT(**args).eval()
    model.load_state_dict(state_dict, strict=True)
    return model


def normed_tokens(model, images, padding_mask=None):
    """The last block's tokens after the final norm (skip tokens first)."""
    with torch.no_grad():
        tokens, _ = model.forward_tokens(images, padding_mask)
        return model.norm(tokens[-1])


def run_tool(tool, tmp_path, state_dict, monkeypatch, capsys, *args):
    """``tool.main()`` on ``state_dict`` saved to a file: (exit status,
    stdout, stderr) and the output path."""
    src, dst = tmp_path / 'src.pth', tmp_path / 'dst.pth'
    torch.save(state_dict, src)
    monkeypatch.setattr(sys, 'argv', ['tool', str(src), str(dst), *args])
    status = 0
    try:
        tool.main()
    except SystemExit as exc:
        status = exc.code
    out = capsys.readouterr()
    return (status, out.out, out.err), dst


def dinov2_shapes(embed_dim, depth, registers, grid=37, patch=14,
                  mlp_ratio=4):
    """The authors' state-dict names and shapes (their
    ``DinoVisionTransformer`` with MLP blocks and LayerScale, no chunks)."""
    c, hidden = embed_dim, int(embed_dim * mlp_ratio)
    shapes = {'cls_token': (1, 1, c), 'pos_embed': (1, 1 + grid * grid, c)}
    if registers:
        shapes['register_tokens'] = (1, registers, c)
    shapes['mask_token'] = (1, c)
    shapes.update({'patch_embed.proj.weight': (c, 3, patch, patch),
                   'patch_embed.proj.bias': (c, )})
    for i in range(depth):
        p = f'blocks.{i}.'
        shapes.update({
            p + 'norm1.weight': (c, ), p + 'norm1.bias': (c, ),
            p + 'attn.qkv.weight': (3 * c, c), p + 'attn.qkv.bias': (3 * c, ),
            p + 'attn.proj.weight': (c, c), p + 'attn.proj.bias': (c, ),
            p + 'ls1.gamma': (c, ), p + 'norm2.weight': (c, ),
            p + 'norm2.bias': (c, ), p + 'mlp.fc1.weight': (hidden, c),
            p + 'mlp.fc1.bias': (hidden, ), p + 'mlp.fc2.weight': (c, hidden),
            p + 'mlp.fc2.bias': (c, ), p + 'ls2.gamma': (c, )})
    shapes.update({'norm.weight': (c, ), 'norm.bias': (c, )})
    return shapes


def dinov3_state_dict(embed_dim, depth, num_heads, storage=4, patch=16,
                      ffn_ratio=4, rule=True):
    """The authors' state dict: parameters by the fixture rule (or, all
    tensors, on the meta device), buffers as their ``init_weights`` sets
    them (periods
    ``base ** (2 j / (D / 2))``, the k third of ``bias_mask`` 0)."""
    c, hidden = embed_dim, int(embed_dim * ffn_ratio)
    d = embed_dim // num_heads
    shapes = {'cls_token': (1, 1, c), 'storage_tokens': (1, storage, c),
              'mask_token': (1, c), 'patch_embed.proj.weight':
              (c, 3, patch, patch), 'patch_embed.proj.bias': (c, )}
    for i in range(depth):
        p = f'blocks.{i}.'
        shapes.update({
            p + 'norm1.weight': (c, ), p + 'norm1.bias': (c, ),
            p + 'attn.qkv.weight': (3 * c, c), p + 'attn.qkv.bias': (3 * c, ),
            p + 'attn.proj.weight': (c, c), p + 'attn.proj.bias': (c, ),
            p + 'ls1.gamma': (c, ), p + 'norm2.weight': (c, ),
            p + 'norm2.bias': (c, ), p + 'mlp.fc1.weight': (hidden, c),
            p + 'mlp.fc1.bias': (hidden, ), p + 'mlp.fc2.weight': (c, hidden),
            p + 'mlp.fc2.bias': (c, ), p + 'ls2.gamma': (c, )})
    shapes.update({'norm.weight': (c, ), 'norm.bias': (c, )})
    if rule:
        sd = record.rule_weights(shapes)
    else:
        sd = {k: torch.empty(s, device='meta') for k, s in shapes.items()}
    sd['rope_embed.periods'] = 100.**(
        2 * torch.arange(d // 4, dtype=torch.float32) / (d // 2))
    mask = torch.ones(3 * c)
    mask[c:2 * c] = 0
    for i in range(depth):
        sd[f'blocks.{i}.attn.qkv.bias_mask'] = mask.clone()
    if not rule:  # shapes only
        sd = {k: v.to('meta') for k, v in sd.items()}
    return sd


def padded_pair(image, padded_hw, other_hw):
    """``image`` (1, 3, H, W) at the top-left of a batch padded to
    ``padded_hw`` beside a flat image of ``other_hw``; the pixel mask."""
    (ph, pw), (h, w) = padded_hw, image.shape[-2:]
    images = torch.zeros(2, 3, ph, pw)
    images[0, :, :h, :w] = image[0]
    images[1] = 0.5
    mask = torch.ones(2, ph, pw, dtype=torch.bool)
    mask[0, :h, :w] = False
    mask[1, :other_hw[0], :other_hw[1]] = False
    return images, mask


def crop_tokens(tokens, skip, padded_grid, grid):
    """An image's skip tokens and its ``grid`` of a padded grid's tokens."""
    (ph, pw), (h, w) = padded_grid, grid
    patches = tokens[skip:].reshape(ph, pw, -1)[:h, :w].reshape(h * w, -1)
    return torch.cat([tokens[:skip], patches])
