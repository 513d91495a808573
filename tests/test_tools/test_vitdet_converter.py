"""tools/model_converters/vitdet_d2_to_mmpe.py (key map in
mmpe/models/utils/vitdet_detectron2.py): detectron2 ViTDet checkpoints.

The checkpoints are made here in detectron2's key layout and shapes
(``tests/vitdet_d2_reference.py``, written from ``modeling/backbone/vit.py``
and the ViTDet configs); the model-zoo sizes as meta tensors (no memory).
The converted CPVT + ViTSimpleFPN compute what detectron2's ViT + simple
feature pyramid compute, written out from its equations in the same file.
"""
import importlib.util
import os.path as osp
import pickle

import numpy as np
import pytest
import torch

from mmpe.models.backbones import CPVT
from mmpe.models.necks import ViTSimpleFPN
from mmpe.models.utils.vitdet_detectron2 import (infer_vitdet_config,
                                                 vitdet_d2_to_mmpe)

from vit_layout import timm_vit_shapes
from vitdet_d2_reference import (random_weights, simfp_forward,
                                 vit_forward, vitdet_d2_shapes)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
spec = importlib.util.spec_from_file_location(
    'vitdet_d2_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'vitdet_d2_to_mmpe.py'))
cli = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli)

#: detectron2's ViTDet backbones (configs/common/models/mask_rcnn_vitdet.py
#: and projects/ViTDet/configs/COCO/*_vitdet_{b,l,h}_*.py; the Cascade
#: configs change only the ROI heads): dims, depth, heads, global blocks
MODEL_ZOO = {
    'ViT-B': (768, 12, 12, (2, 5, 8, 11)),
    'ViT-L': (1024, 24, 16, (5, 11, 17, 23)),
    'ViT-H': (1280, 32, 16, (7, 15, 23, 31)),
}
# float64: detectron2's order of sums against mmpe's (q . R computed as
# (q / sqrt(d)) . (sqrt(d) R); the terms summed in another order)
_F64_ATOL = 1e-12
SMALL = dict(dims=32, depth=3, num_heads=2, window_blocks=(0, 2),
             window_size=4, img_grid=8, pretrain_grid=7, patch=8,
             out_channels=16)


def _zoo_state_dict(name):
    dims, depth, heads, global_blocks = MODEL_ZOO[name]
    shapes = vitdet_d2_shapes(
        dims, depth, heads,
        window_blocks=[i for i in range(depth) if i not in global_blocks])
    return {k: torch.empty(s, device='meta') for k, s in shapes.items()}


@pytest.mark.parametrize('name', MODEL_ZOO)
def test_model_zoo_layouts_convert_every_key(name):
    dims, depth, heads, global_blocks = MODEL_ZOO[name]
    sd = _zoo_state_dict(name)
    out, config, report = vitdet_d2_to_mmpe(sd)
    backbone, neck = config['backbone'], config['neck']
    assert backbone['arch'] == dict(embed_dims=dims, depth=depth,
                                    num_heads=heads, mlp_ratio=4.0)
    assert backbone['global_blocks'] == global_blocks
    assert (backbone['window_size'], backbone['patch_size'],
            backbone['img_size']) == (14, 16, 224)
    assert backbone['rel_pos_cfg'] == dict(input_size=(64, 64))
    assert backbone['pos_encoding'] == ('learnable', 'rel-pos')
    assert backbone['window_padding'] == 'zeros'
    assert backbone['pos_embed_interp'] == 'detectron2'
    assert backbone['final_norm'] is False and backbone['qkv_bias'] is True
    assert neck['scale_factors'] == (4.0, 2.0, 1.0, 0.5)
    assert (neck['out_channels'], neck['num_outs']) == (256, 5)
    assert neck['norm_cfg'] == dict(type='LayerNorm2d', eps=1e-6)
    heads_keys = [k for k in sd if k.startswith(('proposal_generator.',
                                                 'roi_heads.'))]
    assert report['dropped'] == heads_keys
    assert len(out) == len(sd) - len(heads_keys)
    assert out['backbone.pos_embed'].shape == (1, 196, dims)
    assert out['backbone.blocks.0.attn.rel_pos.table_h'].shape == (27,
                                                                   dims //
                                                                   heads)
    g = global_blocks[0]
    assert out[f'backbone.blocks.{g}.attn.rel_pos.table_w'].shape == (
        127, dims // heads)
    assert out['neck.stages.0.1.norm.weight'].shape == (dims // 2, )
    assert out['neck.lateral_convs.3.conv.weight'].shape == (256, dims, 1,
                                                             1)


def _small_checkpoint(seed=0, **kwargs):
    args = dict(SMALL, **kwargs)
    return random_weights(vitdet_d2_shapes(**args), seed=seed)


def _build(config, state_dict):
    """CPVT and ViTSimpleFPN of ``config`` loaded (strictly) with the
    converted weights."""
    models = []
    for prefix, cls in (('backbone', CPVT), ('neck', ViTSimpleFPN)):
        args = {k: v for k, v in config[prefix].items() if k != 'type'}
        model = cls(**args).double().eval()
        own = {k[len(prefix) + 1:]: v for k, v in state_dict.items()
               if k.startswith(prefix + '.')}
        model.load_state_dict(own, strict=True)
        models.append(model)
    return models


def test_converted_model_computes_detectron2s_features():
    """Random weights in detectron2's layout, a 10 x 14 grid (4 x 4 windows
    that need padding, a 7 x 7 table resized, global tables made for 8 x 8
    resized): the pyramid equals detectron2's, forward and input
    gradient."""
    sd = _small_checkpoint()
    out, config, _ = vitdet_d2_to_mmpe(sd)
    backbone, neck = _build(config, out)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 80, 112, generator=g, dtype=torch.float64)
    x_ref = x.clone().requires_grad_()
    x.requires_grad_()
    levels = neck(backbone(x))
    feat = vit_forward(sd, x_ref, SMALL['num_heads'], SMALL['window_size'],
                       SMALL['window_blocks'])
    want = simfp_forward(sd, feat, SMALL['patch'])
    assert [tuple(t.shape[-2:]) for t in levels] == [(40, 56), (20, 28),
                                                     (10, 14), (5, 7),
                                                     (3, 4)]
    for got, ref in zip(levels, want):
        torch.testing.assert_close(got, ref, atol=_F64_ATOL, rtol=0)
    weights = [torch.randn(t.shape, generator=g, dtype=t.dtype)
               for t in levels]
    sum((t * w).sum() for t, w in zip(levels, weights)).backward()
    sum((t * w).sum() for t, w in zip(want, weights)).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=_F64_ATOL, rtol=0)
    # the setting matters: the defaults compute other features
    args = {k: v for k, v in config['backbone'].items()
            if k not in ('type', 'window_padding', 'pos_embed_interp')}
    plain = CPVT(**args).double().eval()
    plain.load_state_dict(backbone.state_dict())
    with torch.no_grad():
        assert (plain(x)[-1] - feat).abs().amax() > 1e-2


def test_unknown_keys_are_listed():
    sd = _small_checkpoint()
    sd['backbone.net.blocks.1.residual.conv1.weight'] = torch.zeros(4, 4)
    sd['backbone.net.norm.weight'] = torch.zeros(32)
    sd['backbone.simfp_3.7.weight'] = torch.zeros(1)
    with pytest.raises(ValueError) as err:
        vitdet_d2_to_mmpe(sd)
    msg = str(err.value)
    assert '3 keys with no CPVT / ViTSimpleFPN counterpart' in msg
    for key in ('backbone.net.blocks.1.residual.conv1.weight',
                'backbone.net.norm.weight', 'backbone.simfp_3.7.weight'):
        assert key in msg


def test_wrong_shapes_are_named():
    sd = _small_checkpoint()
    sd['backbone.net.blocks.1.mlp.fc2.weight'] = torch.zeros(32, 48)
    with pytest.raises(ValueError,
                       match=r'blocks\.1\.mlp\.fc2\.weight: \(32, 48\) != '
                       r'\(32, 128\)'):
        vitdet_d2_to_mmpe(sd)
    sd = _small_checkpoint()
    del sd['backbone.net.blocks.2.norm2.bias']
    with pytest.raises(ValueError, match=r"missing \['backbone\.blocks\.2"
                       r"\.norm2\.bias'\]"):
        vitdet_d2_to_mmpe(sd)


@pytest.mark.parametrize('keys, match', [
    # detectron2's Swin / MViTv2 (projects/ViTDet cascade configs) and
    # ResNet-FPN detectors: backbone.bottom_up.*
    (['backbone.bottom_up.patch_embed.proj.weight',
      'backbone.bottom_up.layers.0.blocks.0.attn.relative_position_bias_'
      'table', 'backbone.fpn_lateral2.weight', 'roi_heads.box_head.fc1.'
      'weight'], r'multi-scale backbone \(backbone\.bottom_up\.\*: Swin, '
     r'MViTv2'),
    (['backbone.bottom_up.blocks.0.attn.rel_pos_h',
      'backbone.bottom_up.patch_embed.proj.weight'],
     r'backbone\.bottom_up'),
    (list(timm_vit_shapes(32, depth=2)), r'a plain timm / DeiT / MAE ViT; '
     r'convert it with tools/model_converters/timm_vit_to_cpvt\.py'),
    (['backbone.conv1.weight'], r'an unknown layout'),
])
def test_other_architectures_are_refused(keys, match):
    sd = {k: torch.zeros(1) for k in keys}
    with pytest.raises(ValueError, match=r'not a detectron2 ViTDet '
                       r'checkpoint.*' + match):
        vitdet_d2_to_mmpe(sd)
    with pytest.raises(ValueError, match='not a detectron2 ViTDet'):
        infer_vitdet_config(sd)


def test_heads_are_read_from_the_tables_or_given():
    sd = _small_checkpoint()
    with pytest.raises(ValueError, match=r'num_heads=4, but the tables are '
                       r'16 wide: 2 heads'):
        infer_vitdet_config(sd, num_heads=4)
    no_rel = {k: v for k, v in sd.items() if 'rel_pos' not in k}
    with pytest.raises(ValueError, match='give num_heads'):
        infer_vitdet_config(no_rel)
    cfg = infer_vitdet_config(no_rel, num_heads=2, window_size=4,
                              global_blocks=(1, ))
    assert cfg['backbone']['pos_encoding'] == ('learnable', )


def _save_pkl(path, sd):
    """A detectron2 model-zoo file: numpy arrays under 'model'."""
    with open(path, 'wb') as f:
        pickle.dump({'model': {k: v.numpy() for k, v in sd.items()},
                     '__author__': 'Detectron2 Model Zoo'}, f)


@pytest.mark.parametrize('suffix', ['.pkl', '.pth'])
def test_cli_converts_and_prints_the_config(tmp_path, monkeypatch, capsys,
                                           suffix):
    sd = _small_checkpoint()
    src = str(tmp_path / f'model_final{suffix}')
    if suffix == '.pkl':
        _save_pkl(src, sd)
    else:
        torch.save({'model': sd, 'iteration': 10}, src)
    dst = str(tmp_path / 'out' / 'vitdet.pth')
    monkeypatch.setattr('sys.argv', ['vitdet_d2_to_mmpe.py', src, dst])
    cli.main()
    printed = capsys.readouterr().out
    assert "window_padding='zeros'" in printed
    assert "pos_embed_interp='detectron2'" in printed
    assert 'not converted: 6 keys' in printed
    saved = torch.load(dst, weights_only=True)
    want, _, _ = vitdet_d2_to_mmpe(sd)
    assert list(saved['state_dict']) == list(want)
    for key, value in want.items():
        assert torch.equal(saved['state_dict'][key], value), key
    # the backbone loads it through init_cfg, with the printed config
    cfg = dict(saved['meta']['config']['backbone'])
    cfg.pop('type')
    model = CPVT(**cfg, init_cfg=dict(type='Pretrained', checkpoint=dst,
                                      prefix='backbone.'))
    model.init_weights()
    for name, value in model.state_dict().items():  # a float32 model
        assert torch.equal(value, want['backbone.' + name].float()), name


def test_pkl_with_code_is_refused(tmp_path):
    path = str(tmp_path / 'evil.pkl')
    with open(path, 'wb') as f:
        pickle.dump({'model': {'x': np.zeros(2)}, 'hook': print}, f)
    with pytest.raises(pickle.UnpicklingError, match='builtins.print'):
        cli.load_d2_state_dict(path)


def _equal_grid_checkpoint():
    """Window blocks 0 and 2 of 4 x 4 and a global block 1 whose grid is
    also 4 x 4: every block's tables have 7 rows."""
    return _small_checkpoint(img_grid=SMALL['window_size'])


def test_layout_of_equal_tables_is_refused_unless_given():
    sd = _equal_grid_checkpoint()
    with pytest.raises(ValueError, match=r'every block has tables of 7 rows '
                       r'\(4 x 4\).*give window_size=0 \(--window-size 0.*'
                       r'or global_blocks \(--global-blocks'):
        infer_vitdet_config(sd)
    with pytest.raises(ValueError, match='every block has tables of 7 rows'):
        infer_vitdet_config(sd, window_size=4)  # which blocks are global?
    cfg = infer_vitdet_config(sd, global_blocks=(1, ))['backbone']
    assert (cfg['window_size'], cfg['global_blocks']) == (4, (1, ))
    assert cfg['rel_pos_cfg'] == dict(input_size=(4, 4))
    cfg = infer_vitdet_config(sd, window_size=0)['backbone']
    assert (cfg['window_size'], cfg['global_blocks']) == (0, (0, 1, 2))
    # tables of two sizes tell the layout, as before
    cfg = infer_vitdet_config(_small_checkpoint())['backbone']
    assert (cfg['window_size'], cfg['global_blocks']) == (4, (1, ))
    # no tables: the layout must be given
    no_rel = {k: v for k, v in sd.items() if 'rel_pos' not in k}
    with pytest.raises(ValueError, match=r'no relative tables to read the '
                       r'window layout from.*give window_size'):
        infer_vitdet_config(no_rel, num_heads=2)
    with pytest.raises(ValueError, match='global_blocks=None'):
        infer_vitdet_config(no_rel, num_heads=2, window_size=4)
    cfg = infer_vitdet_config(no_rel, num_heads=2, window_size=0)['backbone']
    assert (cfg['window_size'], cfg['global_blocks']) == (0, (0, 1, 2))


def test_given_layout_computes_detectron2s_features():
    """The layout given for tables of one size: windows of 4 x 4 in blocks
    0 and 2 on a 10 x 14 grid, as detectron2 computes them."""
    sd = _equal_grid_checkpoint()
    config = infer_vitdet_config(sd, global_blocks=(1, ))
    out, config, _ = vitdet_d2_to_mmpe(sd, config)
    backbone, neck = _build(config, out)
    x = torch.randn(1, 3, 80, 112, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        levels = neck(backbone(x))
        feat = vit_forward(sd, x, SMALL['num_heads'], SMALL['window_size'],
                           SMALL['window_blocks'])
        want = simfp_forward(sd, feat, SMALL['patch'])
    for got, ref in zip(levels, want):
        torch.testing.assert_close(got, ref, atol=_F64_ATOL, rtol=0)


def test_cli_takes_the_layout(tmp_path, monkeypatch, capsys):
    sd = _equal_grid_checkpoint()
    src, dst = str(tmp_path / 'model.pth'), str(tmp_path / 'out.pth')
    torch.save({'model': sd}, src)
    monkeypatch.setattr('sys.argv', ['vitdet_d2_to_mmpe.py', src, dst])
    with pytest.raises(ValueError, match='--window-size 0'):
        cli.main()
    monkeypatch.setattr('sys.argv', [
        'vitdet_d2_to_mmpe.py', src, dst, '--window-size', '4',
        '--global-blocks', '1'
    ])
    cli.main()
    assert "'window_size': 4" in capsys.readouterr().out
    backbone = torch.load(dst, weights_only=True)['meta']['config'][
        'backbone']
    assert (backbone['window_size'], backbone['global_blocks']) == (4, (1, ))
