"""tools/benchmark/train_step.py --dino: the rows of mmdet's R50 DINO and of
DINO on the ViTDet-layout ViT with each encoding, each row its own process
(``--memory``), without ImageNet weights; two rows run here in-process
(``--child``, what each subprocess runs) on tiny images."""
import importlib.util
import json
import os.path as osp

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def _train_step_tool():
    path = osp.join(ROOT, 'tools', 'benchmark', 'train_step.py')
    spec = importlib.util.spec_from_file_location('mmpe_tool_train_step_dino',
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dino_rows_name_every_config():
    tool = _train_step_tool()
    args = tool.parse_args(['--dino', '--quick'])
    assert args.memory  # one process per row
    assert args.cfg_options['model.backbone.init_cfg'] is None
    labels = [label for label, _, _ in tool.variants(args)]
    assert labels[0] == 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'
    want = {f'configs/dino-4scale_vit-b-{pe}_vitdet_12e_coco.py'
            for pe in ('peg', 'irpe', 'rope-mixed', 'rel-pos')}
    want.add('configs/dino-4scale_vit-s-irpe_vitdet_12e_coco.py')
    assert set(labels[1:]) == want
    for path in want:
        assert osp.isfile(osp.join(ROOT, path))


def test_dino_child_rows_step(capsys):
    """What the subprocess of a row prints: step times, memory, grid."""
    tool = _train_step_tool()
    rows = []
    for index in (0, 2):  # R50 DINO and DINO on ViT-B-iRPE
        # 256 x 256: enough tokens for DINO's top 900 of the encoder's
        tool.main(['--dino', '--batch', '1', '--image-size', '256x256',
                   '--threads', '1', '--rounds', '1', '--warmup', '0',
                   '--child', str(index)])
        rows.append(json.loads(capsys.readouterr().out.strip()
                               .splitlines()[-1]))
    for row in rows:
        assert len(row['times_s']) == 1 and row['times_s'][0] > 0
        assert row['peak_mb'] > 0
        assert len(row['grid']) == 2  # the stride-64 level's (h, w)
