"""Every segmentation config builds and trains one step (losses, backward)
on a batch of two images of different sizes and aspect ratios.

The backbone is shrunk through the config (as a user would with
``--cfg-options``); necks and heads are the configs' own. Nothing loads the
ImageNet checkpoints the ADE20K configs point to."""
import copy
import os.path as osp

import pytest
import torch
from config_steps import TWO_SIZES, weight_decays
from mmengine.config import Config
from mmengine.model.utils import revert_sync_batchnorm
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData

from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
QUICKSTART = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'
ADE = [
    'configs/fpn_cpvt-s_4xb4-80k_ade20k-512x512.py',
    'configs/fpn_deit-s-irpe_4xb4-80k_ade20k-512x512.py',
    'configs/upernet_cpvt-s_8xb2-160k_ade20k-512x512.py',
    'configs/upernet_deit-s-irpe_8xb2-160k_ade20k-512x512.py',
]
CONFIGS = [QUICKSTART] + ADE
EMBED = 32


def _load(name):
    cfg = Config.fromfile(osp.join(REPO, name))
    assert cfg.custom_imports['imports'] == ['mmpe']
    assert cfg.default_scope == 'mmseg'
    assert cfg.model.type == 'PaddingAwareEncoderDecoder'
    assert cfg.model.backbone.type == 'CPVT'
    return cfg


def _shrink(model):
    """A small CPVT through the config, the rest adapted to its width."""
    model = copy.deepcopy(model)
    backbone = model.backbone
    backbone.arch = dict(embed_dims=EMBED, depth=4, num_heads=2,
                         mlp_ratio=2.)
    backbone.init_cfg = None
    if len(backbone.out_indices) > 1:  # UperNet: four blocks, four levels
        backbone.out_indices = (0, 1, 2, 3)
        model.neck.in_channels = [EMBED] * 4
        model.neck.out_channels = EMBED
        model.decode_head.in_channels = [EMBED] * 4
        model.auxiliary_head.in_channels = EMBED
        # the heads' 512 (UperNet) / 256 (FPN) channels at stride 4 of a
        # 512 x 512 crop dominate the step on CPU; the structure is the
        # config's
        model.decode_head.channels = 64
        model.auxiliary_head.channels = 32
    else:  # Semantic FPN: the simple pyramid from the last block
        model.neck.in_channels = EMBED
        if model.neck.out_channels > 64:  # ADE20K: 256 / 128 -> 64
            model.neck.out_channels = 64
            model.decode_head.in_channels = [64] * 4
            model.decode_head.channels = 64
    return model


def _seg_batch(num_classes, crop):
    """Two images of :data:`TWO_SIZES`, at most ``crop`` (as RandomCrop
    leaves them), padded by the data preprocessor to ``crop``."""
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for c, h, w in TWO_SIZES:
        h, w = min(h, crop[0]), min(w, crop[1])
        inputs.append(torch.randint(0, 256, (c, h, w), generator=g,
                                    dtype=torch.uint8))
        label = torch.randint(0, num_classes, (1, h, w), generator=g)
        label[:, :4] = 255  # some ignored pixels
        sample = SegDataSample(gt_sem_seg=PixelData(data=label))
        sample.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


@pytest.mark.parametrize('name', CONFIGS)
def test_seg_config_trains_one_step_on_two_sizes(name):
    cfg = _load(name)
    with DefaultScope.overwrite_default_scope('mmseg'):
        torch.manual_seed(0)
        model = revert_sync_batchnorm(MODELS.build(_shrink(cfg.model)))
        model.train()
        num_classes = cfg.model.decode_head.num_classes
        crop = tuple(cfg.model.data_preprocessor.size)
        batch = _seg_batch(num_classes, crop)
        shapes = {tuple(img.shape[-2:]) for img in batch['inputs']}
        assert len(shapes) == 2 and crop not in shapes
        data = model.data_preprocessor(batch, True)
        assert tuple(data['inputs'].shape[-2:]) == crop
        losses = model(**data, mode='loss')
    assert 'decode.loss_ce' in losses
    if 'upernet' in name:
        assert 'aux.loss_ce' in losses
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss), log_vars
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

    decay = weight_decays(model, cfg)
    base = cfg.optim_wrapper.optimizer.weight_decay
    assert decay['backbone.blocks.0.attn.qkv.weight'] == base
    for key, value in decay.items():
        if key.endswith('.bias') or 'norm' in key or 'pos_embed' in key \
                or 'cls_token' in key or 'rpe_' in key:
            assert value == 0, key


@pytest.mark.parametrize('name', ADE)
def test_ade20k_configs_follow_the_published_protocols(name):
    cfg = _load(name)
    assert cfg.train_dataloader.dataset.data_root == \
        'data/ade/ADEChallengeData2016'
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'
    load, = [t for t in cfg.train_pipeline if t.type == 'LoadAnnotations']
    assert load.reduce_zero_label  # label 0 ("other") ignored
    assert cfg.crop_size == (512, 512)
    assert cfg.model.decode_head.num_classes == 150
    assert cfg.model.backbone.arch == 'small'
    gpus, per_gpu = (4, 4) if name.split('/')[-1].startswith('fpn') \
        else (8, 2)
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == gpus * per_gpu
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW'
    iters = cfg.train_cfg.max_iters
    if 'fpn_' in name:  # PVT / Twins: 80k, lr 1e-4, poly 0.9
        assert (iters, opt.lr, opt.weight_decay) == (80000, 1e-4, 1e-4)
        assert cfg.model.decode_head.type == 'FPNHead'
    else:  # Swin: 160k, lr 6e-5, wd 0.01, warm-up 1500, aux head
        assert (iters, opt.lr, opt.weight_decay) == (160000, 6e-5, 0.01)
        assert cfg.model.decode_head.type == 'UPerHead'
        assert cfg.param_scheduler[0].end == 1500
    assert cfg.param_scheduler[-1].end == iters
    # label maps checked before the first step (the runtime base's hook)
    assert any(h.type == 'DatasetCheckHook' for h in cfg.custom_hooks)
    checkpoint = cfg.model.backbone.init_cfg.checkpoint
    assert checkpoint.startswith('checkpoints/')
    assert checkpoint in open(osp.join(REPO, name)).read()  # in the header
    if 'irpe' in name:
        assert cfg.model.backbone.pos_encoding == ('learnable', 'irpe')
        assert cfg.model.backbone.use_cls_token
