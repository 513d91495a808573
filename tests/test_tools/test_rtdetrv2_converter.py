"""tools/model_converters/rtdetrv2_to_mmpe.py: the RT-DETR authors'
checkpoints -> mmpe's RT-DETR.

The checkpoints are made here in the layout the authors' code saves
(``tests/data/rtdetr_authors/checkpoint_layout.json``, recorded from their
model by ``tools/analysis/rtdetr_checkpoint_layout.py``: every state-dict
name, shape and dtype of the released R18vd and R50vd models, the solver's
top-level keys, ``ModelEMA.state_dict``'s), with weights made by a rule from
each key; the converted file must load strictly into the model of the
matching config, every tensor where the key maps put it.
"""
import copy
import functools
import importlib.util
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmdet.registry import MODELS

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
TOOL = osp.join(ROOT, 'tools', 'model_converters', 'rtdetrv2_to_mmpe.py')
LAYOUT = osp.join(ROOT, 'tests', 'data', 'rtdetr_authors',
                  'checkpoint_layout.json')
CONFIGS = {
    'r18': 'configs/rtdetr/rtdetrv2_r18vd_120e_coco.py',
    'r50': 'configs/rtdetr/rtdetrv2_r50vd_6x_coco.py',
}
spec = importlib.util.spec_from_file_location('rtdetrv2_to_mmpe', TOOL)
cli = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli)


def _layout():
    with open(LAYOUT) as f:
        return json.load(f)


def _weights(name):
    """The authors' state dict of model ``name`` with rule-made values:
    entry k holds k + (0, 1, 2, ...) / numel, so every tensor differs."""
    state = {}
    for k, (key, shape, dtype) in enumerate(
            _layout()['models'][name]['state_dict']):
        numel = int(torch.Size(shape).numel())
        values = (k + torch.arange(numel, dtype=torch.float64) /
                  max(numel, 1)).reshape(shape)
        state[key] = values.to(getattr(torch, dtype)) if dtype != 'bool' \
            else values.reshape(shape) > k + 0.5
    return state


def _solver_checkpoint(name, ema_offset=0.5):
    """A checkpoint as the authors' solver writes it: model, EMA (other
    values), optimizer and schedulers' states, epoch, date."""
    layout = _layout()
    model = _weights(name)
    ema = {k: v + ema_offset if v.is_floating_point() else v
           for k, v in model.items()}
    checkpoint = dict(
        date='2024-07-24T00:00:00',
        last_epoch=71,
        model=model,
        criterion={},
        postprocessor={},
        ema=dict(module=ema, updates=531000),
        optimizer=dict(state={}, param_groups=[dict(lr=1e-4, params=[0])]),
        lr_scheduler=dict(last_epoch=72, milestones={1000: 1}),
        lr_warmup_scheduler=dict(last_step=2000, warmup_duration=2000))
    assert sorted(checkpoint) == sorted(layout['solver_keys'])
    assert sorted(checkpoint['ema']) == sorted(layout['ema_keys'])
    return checkpoint


@functools.lru_cache(maxsize=None)
def _model_state(name):
    cfg = Config.fromfile(osp.join(ROOT, CONFIGS[name]))
    cfg.model.backbone.init_cfg = None
    return MODELS.build(cfg.model).state_dict()


def _run(capsys, *args):
    """The tool's main in this process: (exit status, stderr)."""
    try:
        cli.main(list(args))
        status = 0
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize('name', ['r18', 'r50'])
def test_solver_checkpoint_loads_strictly_ema_first(name, tmp_path):
    checkpoint = _solver_checkpoint(name)
    src = tmp_path / 'authors.pth'
    torch.save(checkpoint, src)
    dst = tmp_path / 'mmpe.pth'
    meta = cli.convert_file(str(src), str(dst))
    assert meta['weights'] == 'ema'
    converted = torch.load(dst, weights_only=True)['state_dict']
    model_state = _model_state(name)
    cli.check_keys(converted, model_state)  # keys and shapes, strictly
    ema = checkpoint['ema']['module']
    # a tensor of each part where the key maps put it
    torch.testing.assert_close(
        converted['backbone.stem.0.weight'],
        ema['backbone.conv1.conv1_1.conv.weight'])
    torch.testing.assert_close(
        converted['neck.input_proj.2.conv.weight'],
        ema['encoder.input_proj.2.conv.weight'])
    torch.testing.assert_close(
        converted['bbox_head.dec_score_head.0.weight'],
        ema['decoder.dec_score_head.0.weight'])
    # every authors' tensor arrives once, unchanged (derived buffers and
    # added BN counters aside)
    values = {round(float(v.flatten()[0]), 6) for k, v in ema.items()
              if v.numel() and v.is_floating_point() and
              not k.endswith(('anchors', 'num_points_scale'))}
    got = {round(float(v.flatten()[0]), 6) for v in converted.values()
           if v.numel() and v.is_floating_point()}
    assert values <= got


def test_model_weights_on_request(tmp_path):
    checkpoint = _solver_checkpoint('r18')
    src = tmp_path / 'authors.pth'
    torch.save(checkpoint, src)
    dst = tmp_path / 'mmpe.pth'
    assert cli.convert_file(str(src), str(dst),
                            weights='model')['weights'] == 'model'
    converted = torch.load(dst, weights_only=True)['state_dict']
    torch.testing.assert_close(
        converted['backbone.stem.0.weight'],
        checkpoint['model']['backbone.conv1.conv1_1.conv.weight'])
    # a file with the model only is converted from it
    del checkpoint['ema']
    torch.save(checkpoint, src)
    assert cli.convert_file(str(src), str(dst))['weights'] == 'model'


def test_backbone_file(tmp_path, capsys):
    """The authors' ImageNet PResNet files: a bare PResNet state dict."""
    state = {k[len('backbone.'):]: v for k, v in _weights('r50').items()
             if k.startswith('backbone.')}
    src, dst = tmp_path / 'ResNet50_vd.pth', tmp_path / 'r50vd.pth'
    torch.save(state, src)
    # --config: the backbone's keys and shapes checked, strictly
    status, err = _run(capsys, str(src), str(dst), '--backbone', '--config',
                       osp.join(ROOT, CONFIGS['r50']))
    assert status == 0, err
    converted = torch.load(dst, weights_only=True)['state_dict']
    torch.testing.assert_close(converted['stem.0.weight'],
                               state['conv1.conv1_1.conv.weight'])


@pytest.mark.parametrize('damage,named', [
    ('drop_decoder_key', 'dec_score_head.0.weight'),
    ('other_model', 'transformer.encoder.layers.0.linear1.weight'),
    ('no_decoder', 'no decoder keys'),
])
def test_bad_files_one_line_exit_2_nothing_written(damage, named, tmp_path,
                                                   capsys, monkeypatch):
    # the config's model built once for the file (the real builder)
    monkeypatch.setattr(cli, 'model_state_dict',
                        lambda config, backbone: _model_state('r50'))
    checkpoint = _solver_checkpoint('r50')
    module = checkpoint['ema']['module']
    if damage == 'drop_decoder_key':
        del module['decoder.dec_score_head.0.weight']
        args = ['--config', CONFIGS['r50']]
    elif damage == 'other_model':
        module['transformer.encoder.layers.0.linear1.weight'] = torch.ones(2)
        args = []
    else:
        for key in [k for k in module if k.startswith('decoder.')]:
            del module[key]
        args = []
    src, dst = tmp_path / 'bad.pth', tmp_path / 'out' / 'mmpe.pth'
    torch.save(checkpoint, src)
    status, err = _run(capsys, str(src), str(dst), *args)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], err
    assert 'nothing written' in lines[0]
    assert not dst.exists()


def test_not_a_checkpoint_dict(tmp_path, capsys):
    src = tmp_path / 'list.pth'
    torch.save([torch.ones(1)], src)
    status, err = _run(capsys, str(src), str(tmp_path / 'o.pth'))
    assert status == 2 and 'expected a dict' in err
    with pytest.raises(cli.NotConvertible, match="no 'ema'"):
        cli.authors_state_dict(dict(model={}), weights='ema')


def test_check_keys_names_shapes():
    expected = dict(a=torch.zeros(2), b=torch.zeros(3))
    with pytest.raises(cli.NotConvertible, match=r'b \(4,\) vs \(3,\)'):
        cli.check_keys(dict(a=torch.zeros(2), b=torch.zeros(4)), expected)
    with pytest.raises(cli.NotConvertible, match='1 missing: b'):
        cli.check_keys(dict(a=torch.zeros(2)), copy.deepcopy(expected))
