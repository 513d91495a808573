"""tools/model_converters/irpe_detr_to_mmpe.py on a state dict laid out as
the authors' DETR-iRPE checkpoints are (key names and table shapes)."""
import argparse
import copy
import importlib.util
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config

import mmpe  # noqa: F401
from mmpe.models.layers.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
spec = importlib.util.spec_from_file_location(
    'irpe_detr_to_mmpe',
    osp.join(ROOT, 'tools', 'model_converters', 'irpe_detr_to_mmpe.py'))
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)


def _model(method='product', num_classes=80, rpe_on='k', mode='contextual'):
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs/quickstart/detr_irpe_r18_synthetic.py'))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.bbox_head.num_classes = num_classes
    attn = model_cfg.encoder.layer_cfg.self_attn_cfg
    attn.rpe_cfg.method = method
    attn.rpe_cfg.mode = mode
    attn.rpe_on = rpe_on
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def _authors_layout(model):
    """The authors' key names and table layouts, written out by hand."""
    out = {}
    for key, value in model.state_dict().items():
        if key.endswith('num_batches_tracked'):
            continue  # DETR's FrozenBatchNorm2d has no such buffer
        k = key
        if k.endswith('.table'):
            letter = k.split('.')[-2][-1]
            base = k[:-len('.table')].replace('encoder.',
                                              'transformer.encoder.', 1)
            rpe = model.get_submodule(key[:-len('.table')])
            table = value
            if table.dim() == 3 and letter in 'qk':
                table = table.transpose(1, 2)  # (H', head_dim, nb)
            if rpe.method == 'cross':
                half = table.shape[-1] if table.dim() == 3 and \
                    letter in 'qk' else table.shape[1]
                half //= 2
                dim = 2 if (table.dim() == 3 and letter in 'qk') else 1
                rows, cols = table.split(half, dim=dim)
                out[base + '.rp_rows.lookup_table_weight'] = rows.clone()
                out[base + '.rp_cols.lookup_table_weight'] = cols.clone()
            else:
                out[base + '.lookup_table_weight'] = table.clone()
            continue
        k = k.replace('backbone.', 'backbone.0.body.', 1)
        k = k.replace('neck.convs.0.conv.', 'input_proj.')
        k = k.replace('query_embedding.', 'query_embed.')
        k = k.replace('decoder.post_norm.', 'transformer.decoder.norm.')
        for part in ('encoder.', 'decoder.'):
            if k.startswith(part):
                k = 'transformer.' + k
        k = k.replace('.cross_attn.attn.', '.multihead_attn.')
        k = k.replace('.self_attn.attn.', '.self_attn.')
        k = k.replace('.ffn.layers.0.0.', '.linear1.')
        k = k.replace('.ffn.layers.1.', '.linear2.')
        for i in range(3):
            k = k.replace(f'.norms.{i}.', f'.norm{i + 1}.')
        k = k.replace('bbox_head.fc_cls.', 'class_embed.')
        k = k.replace('bbox_head.reg_ffn.layers.0.0.', 'bbox_embed.layers.0.')
        k = k.replace('bbox_head.reg_ffn.layers.1.', 'bbox_embed.layers.1.')
        k = k.replace('bbox_head.fc_reg.', 'bbox_embed.layers.2.')
        out[k] = value.clone()
    return out


def _randomise(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))


@pytest.mark.parametrize('method,rpe_on,mode', [('product', 'k', 'contextual'),
                                                ('cross', 'qkv', 'contextual'),
                                                ('euclidean', 'qk', 'bias')])
def test_round_trip_loads_strictly(method, rpe_on, mode):
    src_model = _model(method, num_classes=4, rpe_on=rpe_on, mode=mode)
    _randomise(src_model)
    authors = _authors_layout(src_model)
    assert any(k.endswith('rpe_k.lookup_table_weight')
               or k.endswith('rpe_k.rp_rows.lookup_table_weight')
               for k in authors)
    converted = conv.convert(authors, num_classes=4)
    dst_model = _model(method, num_classes=4, rpe_on=rpe_on, mode=mode)
    result = dst_model.load_state_dict(converted, strict=False)
    assert not result.unexpected_keys
    assert all(k.endswith('num_batches_tracked') for k in result.missing_keys)
    for key, value in src_model.state_dict().items():
        if not key.endswith('num_batches_tracked'):
            torch.testing.assert_close(dst_model.state_dict()[key], value)


def test_contextual_table_shapes():
    """Authors' (H', head_dim, nb) becomes iRPE's (H', nb, head_dim)."""
    model = _model()
    rpe = next(m for m in model.modules() if isinstance(m, iRPE))
    head_dim = rpe.table.shape[-1]
    key = 'transformer.encoder.layers.0.self_attn.rpe_k.lookup_table_weight'
    authors = {key: torch.randn(1, head_dim, rpe.num_buckets)}
    out = conv.convert(authors)
    table = out['encoder.layers.0.self_attn.rpe_k.table']
    assert table.shape == rpe.table.shape == (1, rpe.num_buckets, head_dim)
    torch.testing.assert_close(table, authors[key].transpose(1, 2))


def test_coco_classifier_reordered():
    weight = torch.arange(92, dtype=torch.float32)[:, None].repeat(1, 3)
    out = conv.convert({'class_embed.weight': weight})
    w = out['bbox_head.fc_cls.weight']
    assert w.shape == (81, 3)
    assert w[0, 0] == 1 and w[11, 0] == 13 and w[79, 0] == 90
    assert w[80, 0] == 91  # "no object" becomes mmdet's background


def test_unknown_key_is_an_error():
    with pytest.raises(KeyError, match='something.weird'):
        conv.convert({'something.weird': torch.zeros(1)})


def test_cli_writes_loadable_checkpoint(tmp_path):
    model = _model(num_classes=4)
    authors = _authors_layout(model)
    src = str(tmp_path / 'authors.pth')
    # The authors' files carry argparse.Namespace: allowed, nothing else.
    torch.save(dict(model=authors, args=argparse.Namespace(lr=1e-4)), src)
    dst = str(tmp_path / 'mmpe.pth')
    conv.main([src, dst, '--num-classes', '4'])
    ckpt = torch.load(dst, weights_only=True)
    result = _model(num_classes=4).load_state_dict(ckpt['state_dict'],
                                                   strict=False)
    assert not result.unexpected_keys
