"""tools/experiments/ablation.py: every row builds the model it names, and
the summary computes mean and sample std over seeds."""
import copy
import importlib.util
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config, DictAction

from mmpe.models.layers.irpe import iRPE

ROOT = osp.join(osp.dirname(__file__), '..', '..')
spec = importlib.util.spec_from_file_location(
    'ablation', osp.join(ROOT, 'tools', 'experiments', 'ablation.py'))
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)

ROWS = [(study, *row) for study, rows in ablation.STUDIES.items()
        for row in rows]


def _parse(options):
    action = DictAction(option_strings=['--cfg-options'], dest='opts')
    ns = type('NS', (), {})()
    action(None, ns, options)
    return ns.opts


@pytest.mark.parametrize('study,name,config,options', ROWS,
                         ids=[f'{r[0]}:{r[1]}' for r in ROWS])
def test_row_builds_what_it_says(study, name, config, options):
    cfg = Config.fromfile(osp.join(ROOT, config))
    if options:
        cfg.merge_from_dict(_parse(options))
    model = MODELS.build(copy.deepcopy(cfg.model))
    rpes = [m for m in model.modules() if isinstance(m, iRPE)]
    if study == 'irpe_tab6':
        assert bool(rpes) == (name not in ('#2 no PE', '#1 sine (DETR)'))
        has_abs = getattr(model, 'use_abs_pe', True)
        assert has_abs == ('sine' in name)
        if 'bias' in name:
            assert all(r.mode == 'bias' for r in rpes)
        if 'clip' in name:
            assert all(r.index == 'clip' for r in rpes)
    elif study == 'irpe_tab1':
        method = name.split()[-1]
        assert rpes and all(r.method == method for r in rpes)
    else:
        assert model.backbone.pos_encoding == name.split()[-1]


def test_summary_mean_and_std():
    results = [
        dict(study='irpe_tab6', row='#6 sine + ctx piecewise', seed=s,
             train_seconds=10.0 + s,
             metrics={'coco/bbox_mAP': ap, 'coco/bbox_mAP_50': ap50})
        for s, ap, ap50 in [(0, 0.1, 0.3), (1, 0.2, 0.4), (2, 0.3, 0.5)]
    ]
    table = ablation.summarise(results)
    assert '| #6 sine + ctx piecewise | 0.200 ± 0.100 | 0.400 ± 0.100 | '\
        '11.000 ± 1.000 |' in table
