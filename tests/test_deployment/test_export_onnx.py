"""ONNX export (PyTorch's dynamo exporter, dynamic batch / height / width):
onnxruntime equals PyTorch for the quick-start DETR-family detectors with
mmpe's encoder position encodings (iRPE in DETR / Conditional DETR /
DAB-DETR, RoPE-Mixed with integer or normalised coordinates, Swin-V2's
log-CPB and LookHere; BoxRPB in the decoders of DAB-DETR and Conditional
DETR), a
padding-aware DETR with the CPVT backbone, and
the CPVT / DeiT-iRPE / windowed (ViTDet) CPVT backbones alone (PEG, iRPE,
RoPE-Mixed, ViTDet's learnable table + decomposed relative position, 2D
ALiBi, log-CPB), at the
export size and at two others
(one a batch with padded images); unsupported detectors are refused by
name.

The detectors' PyTorch reference is mmdet's own tensor forward with data
samples (``forward(images, samples, mode='tensor')``: the padding mask
built by mmdet's loop over the samples), not the export wrapper, so the
wrapper's tensor-op mask and mmpe's encoder inputs are checked against
mmdet as well as the graph against PyTorch.
"""
import contextlib
import os.path as osp

import mmdet
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.config import Config

from mmpe.deployment import (check_exportable, export_backbone_onnx,
                             export_detector_onnx, max_abs_diff,
                             onnxruntime_session, run_onnxruntime)

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
QUICKSTART = osp.join(ROOT, 'configs', 'quickstart')
MMDET_CONFIGS = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs')

DETECTORS = {
    'detr-irpe': 'detr_irpe_r18_synthetic.py',
    'conditional-detr-irpe': 'conditional-detr_irpe_r18_synthetic.py',
    'dab-detr-irpe': 'dab-detr_irpe_r18_synthetic.py',
    # BoxRPB in the decoder (decoder_pe): the memory grid and each image's
    # valid extent (from the mask built from `img_shapes`) in the graph
    'dab-detr-box-rpb': 'dab-detr_box-rpb_r18_synthetic.py',
    'conditional-detr-point-rpb': 'conditional-detr_point-rpb_r18_synthetic.py',
    'detr-rope-mixed': 'detr_rope-mixed_r18_synthetic.py',
    # DINOv3's normalised coordinates: each image's valid extent read from
    # the padding mask that the graph builds from `img_shapes`
    'detr-rope-mixed-normalized': 'detr_rope-mixed_r18_synthetic.py',
    # the plain DETR with mmpe's padding-aware detector and the tiny CPVT
    # backbone: the pixel mask goes into the backbone inside the graph
    'padding-aware-detr-cpvt': 'detr_r18_synthetic.py',
    # offset biases: log-CPB's MLP of the grid's offsets, LookHere's masks
    # of the grid, in the graph
    'detr-log-cpb': 'detr_log-cpb_r18_synthetic.py',
    'detr-lookhere': 'detr_lookhere_r18_synthetic.py',
}
BACKBONES = {
    'cpvt-tiny': 'mask-rcnn_cpvt-tiny_synthetic.py',
    'deit-tiny-irpe': 'mask-rcnn_deit-tiny-irpe_synthetic.py',
    # ViTDet's layout: 4 x 4 windows in blocks 0 and 2; the grids of the
    # cases below (4 x 6, 4 x 5, 5 x 7) are not whole windows
    'cpvt-tiny-vitdet': 'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
    'cpvt-tiny-vitdet-irpe': 'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
    'cpvt-tiny-vitdet-rope-mixed':
    'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
    'cpvt-tiny-vitdet-rel-pos': 'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
    'cpvt-tiny-vitdet-alibi-2d':
    'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
    'cpvt-tiny-vitdet-log-cpb': 'mask-rcnn_vit-tiny-peg_vitdet_synthetic.py',
}
#: backbone arguments over the config's (windowed iRPE: the window grid's
#: plan in the graph; RoPE-Mixed: full-grid tables cut into windows;
#: rel-pos, ViTDet's backbone: the window blocks' (4, 4) tables as they are,
#: the global blocks' made for (5, 5) and resized to each grid in the graph)
BACKBONE_OPTIONS = {
    'cpvt-tiny-vitdet-irpe': dict(pos_encoding='irpe'),
    'cpvt-tiny-vitdet-rope-mixed': dict(pos_encoding='rope-mixed'),
    'cpvt-tiny-vitdet-rel-pos': dict(
        pos_encoding=('learnable', 'rel-pos'),
        rel_pos_cfg=dict(input_size=5)),
    'cpvt-tiny-vitdet-alibi-2d': dict(pos_encoding='alibi-2d'),
    'cpvt-tiny-vitdet-log-cpb': dict(pos_encoding='log-cpb'),
}
#: tables drawn after init_weights (std 0.5, as after training): ViTDet's
#: zero init would make the relative term vanish from the comparison (and
#: log-CPB's init gives a near-constant bias)
RANDOM_TABLES = {'cpvt-tiny-vitdet-rel-pos': '.rel_pos.',
                 'cpvt-tiny-vitdet-log-cpb': '.grid_bias.',
                 'detr-log-cpb': '.grid_bias.'}
# Export batch, then two other sizes; (B, H, W) and each image's valid (h, w)
# (None: the whole batch). Detector inputs are multiples of 8 as the
# configs' pad_size_divisor makes them; the backbone takes any size.
EXPORT = (2, 64, 96)
DETECTOR_CASES = {
    'export-size': (EXPORT, None),
    'single-48x80': ((1, 48, 80), None),
    'padded-batch': ((3, 72, 104), [(72, 104), (56, 104), (72, 64)]),
}
BACKBONE_CASES = {
    'export-size': (2, 64, 96),
    'single-50x70': (1, 50, 70),
    'batch-80x112': (3, 80, 112),
}
# float32, random weights: onnxruntime's kernels sum in other orders than
# torch's (GEMMs, softmax, layer norms), so six transformer layers on top of
# a ResNet differ by ~1e-6..1e-5 relative; logits of magnitude ~1-10 -> an
# absolute bound of 1e-4. Boxes are sigmoids in [0, 1]: the same bound.
# A wrong mask, grid or position encoding changes outputs by >= 1e-2.
ATOL = 1e-4


def _config(name):
    return Config.fromfile(osp.join(QUICKSTART, name))


def _detector_config(key):
    cfg = _config(DETECTORS[key])
    if key == 'detr-rope-mixed-normalized':
        cfg.model.encoder_pe.relative = dict(
            type='rope-mixed', coords='normalized', normalize='max',
            rescale=2.)
    if key == 'padding-aware-detr-cpvt':
        cfg.model.type = 'PaddingAwareDETR'
        cfg.model.backbone = _config(BACKBONES['cpvt-tiny']).model.backbone
        cfg.model.neck.in_channels = [cfg.model.backbone.arch.embed_dims]
    return cfg


@contextlib.contextmanager
def _one_thread():
    """One intra-op thread for the export (as the sessions run), then the
    process's setting again: fixtures leave no global state behind."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _images(batch, height, width, shapes, seed=0):
    """Normalised images, zero on padding as mmdet's preprocessor pads."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, height, width, generator=gen)
    shapes = shapes or [(height, width)] * batch
    for i, (h, w) in enumerate(shapes):
        images[i, :, h:] = 0
        images[i, :, :, w:] = 0
    return images, torch.tensor(shapes, dtype=torch.long)


def _samples(img_shapes, batch_shape):
    samples = []
    for h, w in img_shapes.tolist():
        sample = DetDataSample()
        sample.set_metainfo(
            dict(img_shape=(h, w), batch_input_shape=tuple(batch_shape)))
        samples.append(sample)
    return samples


@pytest.fixture(scope='module', params=list(DETECTORS))
def exported_detector(request, tmp_path_factory):
    """(detector, onnxruntime session): exported once per module."""
    cfg = _detector_config(request.param)
    # one encoder and one decoder layer: every op of the 3 + 3 of the
    # config, at a fraction of the export time (which grows with the ops)
    cfg.model.encoder.num_layers = cfg.model.decoder.num_layers = 1
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)
        model = MODELS.build(cfg.model)
        model.init_weights()
        if cfg.model.get('decoder_pe'):
            # BoxRPB's MLPs at a trained size (their init, std 0.02, moves
            # the outputs by ~1e-3 only)
            for p in model.decoder.box_rpb.parameters():
                p.data.normal_(std=0.3)
        for name, p in model.named_parameters():
            if RANDOM_TABLES.get(request.param, '//') in name:
                p.data.normal_(std=0.5)
        model.eval()
        out = str(tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')
        images, img_shapes = _images(*EXPORT, [(64, 96), (64, 48)])
        # optimize=False: faster; the optimised graph is tested end to end
        export_detector_onnx(model, out, images, img_shapes, optimize=False)
    return model, onnxruntime_session(out, num_threads=1)


@pytest.mark.parametrize('case', list(DETECTOR_CASES))
def test_detector_onnxruntime_equals_mmdet_forward(exported_detector, case):
    model, session = exported_detector
    (batch, height, width), shapes = DETECTOR_CASES[case]
    images, img_shapes = _images(batch, height, width, shapes, seed=1)
    with torch.no_grad():
        all_scores, all_boxes = model(
            images, _samples(img_shapes, (height, width)), mode='tensor')
    want = (all_scores[-1], all_boxes[-1])
    got = run_onnxruntime(session, dict(images=images, img_shapes=img_shapes))
    assert got[0].shape == want[0].shape and got[1].shape == (batch, 10, 4)
    assert max_abs_diff(got, want) < ATOL
    if shapes is not None:
        # the mask is an input: the whole-batch mask changes the outputs
        full = torch.tensor([(height, width)] * batch)
        other = run_onnxruntime(session, dict(images=images, img_shapes=full))
        assert max_abs_diff(other, got) > 100 * ATOL


@pytest.fixture(scope='module', params=list(BACKBONES))
def exported_backbone(request, tmp_path_factory):
    cfg = _config(BACKBONES[request.param])
    cfg.model.backbone.update(BACKBONE_OPTIONS.get(request.param, {}))
    with _one_thread(), torch.random.fork_rng():
        torch.manual_seed(0)
        backbone = MODELS.build(cfg.model.backbone)
        backbone.init_weights()
        backbone.eval()
        if request.param in RANDOM_TABLES:
            with torch.no_grad():
                for name, param in backbone.named_parameters():
                    if RANDOM_TABLES[request.param] in name:
                        param.normal_(0, 0.5)
        out = str(tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')
        images, _ = _images(*BACKBONE_CASES['export-size'], None)
        export_backbone_onnx(backbone, out, images, optimize=False)
    return backbone, onnxruntime_session(out, num_threads=1)


@pytest.mark.parametrize('case', list(BACKBONE_CASES))
def test_backbone_onnxruntime_equals_pytorch(exported_backbone, case):
    backbone, session = exported_backbone
    images, _ = _images(*BACKBONE_CASES[case], None, seed=2)
    with torch.no_grad():
        want = tuple(backbone(images))
    got = run_onnxruntime(session, dict(images=images))
    p = backbone.patch_size
    batch, _, height, width = images.shape
    assert got[0].shape[0] == batch and got[0].shape[-2:] == (
        -(-height // p), -(-width // p))
    assert max_abs_diff(got, want) < ATOL


@pytest.mark.parametrize(
    'config, name, reason',
    [(osp.join(MMDET_CONFIGS, 'deformable_detr',
               'deformable-detr_r50_16xb2-50e_coco.py'), 'DeformableDETR',
      'deformable attention'),
     (osp.join(MMDET_CONFIGS, 'dino', 'dino-4scale_r50_8xb2-12e_coco.py'),
      'DINO', 'deformable attention'),
     (osp.join(MMDET_CONFIGS, 'retinanet', 'retinanet_r18_fpn_1x_coco.py'),
      'RetinaNet', 'not a DETR-family detector'),
     (osp.join(QUICKSTART, 'mask-rcnn_cpvt-tiny_synthetic.py'), 'MaskRCNN',
      'not a DETR-family detector')],
    ids=['deformable-detr', 'dino', 'retinanet', 'mask-rcnn'])
def test_unsupported_detector_is_named(config, name, reason):
    cfg = Config.fromfile(config)
    cfg.model.backbone.init_cfg = None  # no downloads
    model = MODELS.build(cfg.model)
    with pytest.raises(ValueError) as err:
        check_exportable(model)
    message = str(err.value)
    assert f'Unsupported detector {name} ' in message and reason in message
    for supported in ('DETR', 'ConditionalDETR', 'DABDETR', 'PEDETR',
                      'PEConditionalDETR', 'PEDABDETR'):
        assert f"'{supported}'" in message


def test_export_tool_refuses_unsupported_without_traceback(capsys, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'mmpe_tool_export_onnx',
        osp.join(ROOT, 'tools', 'deployment', 'export_onnx.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    main = tool.main
    config = osp.join(QUICKSTART, 'mask-rcnn_cpvt-tiny_synthetic.py')
    code = main([config, 'none', '--out', str(tmp_path / 'x.onnx')])
    err = capsys.readouterr().err
    assert code == 2
    assert 'Unsupported detector MaskRCNN for ONNX export' in err
    assert 'Traceback' not in err and not (tmp_path / 'x.onnx').exists()
