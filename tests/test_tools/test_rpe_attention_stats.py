"""tools/analysis/rpe_attention_stats.py: zero tables add no attention (the
paper's reason for zero init), and a known shift of the tables is measured
as that shift."""
import importlib.util
import os.path as osp

import mmcv
import numpy as np
import pytest
import torch

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG = osp.join(ROOT, 'configs', 'quickstart', 'detr_irpe_r18_synthetic.py')
RPE = 'model.encoder.layer_cfg.self_attn_cfg.rpe_cfg'
SHIFT = 0.01
_F32_ATOL = 1e-7  # |x + 0.01 - x| in float32 for |x| < 0.2


def _tool():
    path = osp.join(ROOT, 'tools', 'analysis', 'rpe_attention_stats.py')
    spec = importlib.util.spec_from_file_location('mmpe_tool_rpe_stats', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def img_dir(tmp_path):
    folder = tmp_path / 'imgs'
    folder.mkdir()
    for i, (h, w) in enumerate([(72, 104), (96, 40)]):
        img = np.full((h, w, 3), 30, np.uint8)
        img[10:40, 5:30] = (0, 0, 220)
        mmcv.imwrite(img, str(folder / f'{i}.png'))
    return str(folder)


def test_zero_tables_add_nothing(img_dir):
    (res, ) = _tool().main([
        CONFIG, '--img-dir', img_dir, '--cfg-options', f'{RPE}.init=zeros'
    ])
    assert res['table_mean_abs'] == 0 and res['table_max_abs'] == 0
    assert res['extra_mean'] == 0 and res['extra_peak'] == 0


def test_known_shift_is_measured(img_dir, tmp_path):
    from mmpe.models.layers import iRPE
    tool = _tool()
    model = tool.build(tool.Config.fromfile(CONFIG), seed=3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, iRPE):
                m.table.add_(SHIFT)
    ckpt = str(tmp_path / 'epoch_1.pth')
    torch.save(dict(meta=dict(epoch=1), state_dict=model.state_dict()), ckpt)
    (res, ) = tool.main(
        [CONFIG, ckpt, '--seeds', '3', '--img-dir', img_dir, '--images', '1'])
    assert res['shift_mean'] == pytest.approx(SHIFT, abs=_F32_ATOL)
    assert res['shift_max'] == pytest.approx(SHIFT, abs=_F32_ATOL)
    assert res['extra_mean'] > 0 and res['extra_peak'] >= res['extra_mean']


def test_one_seed_per_checkpoint(img_dir):
    with pytest.raises(ValueError, match='one each'):
        _tool().main([CONFIG, 'a.pth', 'b.pth', '--seeds', '0',
                      '--img-dir', img_dir])
