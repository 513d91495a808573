"""The compiled FlexAttention path over the C5 grids of the 150-epoch DETR
recipe: a few compilations, never the uncompiled path, outputs equal to the
explicit backend.

The sizes come from the recipe itself: the config's ``train_pipeline``
resize / crop transforms (mmdet's, built from the config) on COCO-like
image sizes, batches of the config's ``batch_size`` padded to their largest
image, and the C5 grid of the config's own ResNet-50 (run on the meta
device: shapes only). FlexAttention's forward compiles on CPU (its backward
does not in PyTorch 2.13; the CUDA tests of test_irpe_flex.py check it).
"""
import warnings

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS, TRANSFORMS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmpe.models.layers import PEMultiheadAttention

CONFIG = 'configs/detr_irpe_ctx_r50_150e.py'
#: batches drawn; the compiled test runs every fifth by length (20,
#: spanning the sample up to its longest)
NUM_BATCHES = 100
#: compilations the 20 batches may cost: the shape policy pads to powers of
#: two, the recipe's C5 grids hold 256 to 2048 tokens (four sizes), and the
#: batch size is the config's
MAX_COMPILATIONS = 4
# float32 softmax over up to ~2000 keys, summed in FlexAttention's blocks
# and in one matmul by the explicit backend
_F32_ATOL = 5e-5


def _coco_like_size(rng: np.random.Generator):
    """(height, width) of a COCO-like image: long side 640 (most COCO
    images) or 480-640, short / long from the common ratios, 3 in 4
    landscape."""
    long_side = 640 if rng.random() < 0.7 else int(rng.integers(480, 641))
    ratio = rng.choice([3 / 4, 2 / 3, 9 / 16, 1.0], p=[0.5, 0.25, 0.15, 0.1])
    short = int(round(long_side * ratio))
    return (short, long_side) if rng.random() < 0.75 else (long_side, short)


def recipe_batches(num_batches: int = NUM_BATCHES, seed: int = 0):
    """[(images in the batch, C5 grid (h, w), valid C5 extent per image)]
    of ``num_batches`` batches through the config's resize pipeline."""
    cfg = Config.fromfile(CONFIG)
    init_default_scope('mmdet')
    steps = [TRANSFORMS.build(t) for t in cfg.train_pipeline
             if t['type'] not in ('LoadImageFromFile', 'LoadAnnotations',
                                  'PackDetInputs')]
    assert any(t['type'] == 'RandomChoice' for t in cfg.train_pipeline)
    with torch.device('meta'):
        backbone = MODELS.build(cfg.model.backbone)
    for module in list(backbone.modules()):  # shapes only: norms are slow
        for name, child in module.named_children():  # on meta, change none
            if isinstance(child, torch.nn.modules.batchnorm._BatchNorm):
                setattr(module, name, torch.nn.Identity())

    def c5(height, width):
        with torch.no_grad():
            feat = backbone(torch.empty(1, 3, height, width, device='meta'))
        return tuple(feat[-1].shape[-2:])

    rng = np.random.default_rng(seed)
    state = np.random.get_state()  # mmcv's transforms draw from it
    np.random.seed(seed)
    try:
        batches = []
        for _ in range(num_batches):
            shapes = []
            for _ in range(cfg.train_dataloader.batch_size):
                h, w = _coco_like_size(rng)
                results = dict(img=np.zeros((h, w, 3), np.uint8),
                               img_shape=(h, w), ori_shape=(h, w))
                for step in steps:
                    results = step(results)
                shapes.append(results['img'].shape[:2])
            # DetDataPreprocessor pads the batch bottom / right to its max
            pad = (max(s[0] for s in shapes), max(s[1] for s in shapes))
            batches.append((len(shapes), c5(*pad), [c5(*s) for s in shapes]))
    finally:
        np.random.set_state(state)
    return batches


def _modules():
    cfg = Config.fromfile(CONFIG)
    rpe_cfg = cfg.model.encoder.layer_cfg.self_attn_cfg.rpe_cfg.to_dict()
    mods = []
    for impl in ('explicit', 'flex'):
        torch.manual_seed(0)
        # small channels and heads: the sizes under test are the tokens
        m = PEMultiheadAttention(16, 2, batch_first=True, rpe_cfg=rpe_cfg,
                                   rpe_on='k', attn_impl=impl).eval()
        with torch.no_grad():
            m.rpe_k.table.normal_()
        mods.append(m)
    return mods


@pytest.fixture(scope='module')
def batches():
    return recipe_batches()


def test_recipe_sizes_straddle_the_old_threshold(batches):
    """The issue's premise: the recipe's grids lie on both sides of 1024
    tokens and take many shapes (one compilation each without the
    policy)."""
    lengths = [h * w for _, (h, w), _ in batches]
    assert min(lengths) < 1024 <= max(lengths), lengths
    assert len({grid for _, grid, _ in batches}) > 10 * MAX_COMPILATIONS


@pytest.mark.slow  # a C++ build per compilation: about 2 minutes on 2 cores
def test_compiled_flex_over_recipe_sizes_few_compilations(batches):
    by_length = sorted(batches, key=lambda b: b[1][0] * b[1][1])
    batches = by_length[4::5]  # 20, the longest included
    assert len(batches) == 20
    explicit, flex = _modules()
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter('always')
        for batch, (h, w), valid in batches:
            x = torch.randn(batch, h * w, 16, generator=gen)
            pos = torch.randn(batch, h * w, 16, generator=gen)
            mask = torch.ones(batch, h, w, dtype=torch.bool)
            for i, (vh, vw) in enumerate(valid):
                mask[i, :vh, :vw] = False
            kwargs = dict(query_pos=pos, key_padding_mask=mask.flatten(1),
                          spatial_shape=(h, w))
            got = flex(x, **kwargs)
            want = explicit(x, **kwargs)
            torch.testing.assert_close(got, want, atol=_F32_ATOL, rtol=0,
                                       msg=f'grid {(h, w)}')
    messages = [str(w.message) for w in caught]
    # the module falls back with a warning; dynamo past its limit or an
    # uncompiled call of FlexAttention warn too
    assert not flex._warned and not flex._flex_failed, flex._warned
    assert not [m for m in messages
                if 'without torch.compile' in m or 'recompile' in m], messages
    assert not counters['graph_break']
    assert 1 <= counters['stats']['unique_graphs'] <= MAX_COMPILATIONS


@pytest.fixture
def recompile_limit_one(monkeypatch):
    """The compiled wrapper rebuilt with a recompile limit of 1 (and the
    real one again afterwards)."""
    from mmpe.models.layers.attention import flex as irpe_flex
    monkeypatch.setattr(irpe_flex, 'FLEX_RECOMPILE_LIMIT', 1)
    if not irpe_flex._recompile_options():
        # a PyTorch without torch.compile(recompile_limit=...): the wrapper
        # runs under dynamo's own limit (test-scoped here)
        monkeypatch.setattr(torch._dynamo.config, 'recompile_limit', 1)
    irpe_flex.compiled_flex_attention.cache_clear()
    torch._dynamo.reset()
    yield
    irpe_flex.compiled_flex_attention.cache_clear()
    torch._dynamo.reset()


@pytest.mark.slow  # one C++ build
def test_past_the_recompile_limit_the_layer_falls_back(recompile_limit_one):
    """A second size bucket past a limit of one compilation: the call
    raises inside (fullgraph) and the layer runs the explicit backend with
    a warning; FlexAttention never runs uncompiled."""
    explicit, flex = _modules()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for grid in ((10, 12), (15, 20)):  # buckets of 128 and 512 tokens
            n = grid[0] * grid[1]
            x, pos = (torch.randn(1, n, 16, generator=gen) for _ in range(2))
            kwargs = dict(query_pos=pos, spatial_shape=grid)
            if grid == (10, 12):
                got = flex(x, **kwargs)
                assert not flex._warned
            else:
                with pytest.warns(UserWarning, match='falls back to the '
                                  'explicit backend.*FlexAttention failed'):
                    got = flex(x, **kwargs)
            torch.testing.assert_close(got, explicit(x, **kwargs),
                                       atol=_F32_ATOL, rtol=0)
    assert flex._flex_failed


def test_flex_wrapper_compiles_where_torch_compile_has_no_recompile_limit(
        monkeypatch):
    """PyTorch 2.13's ``torch.compile`` takes ``recompile_limit`` /
    ``isolate_recompiles`` and the wrapper uses them; a ``torch.compile``
    without them (PyTorch 2.11, as a CUDA build a user brings) still builds
    the wrapper, ``fullgraph`` and static shapes, under dynamo's own limit
    (with the two arguments passed there, every FlexAttention call raised
    TypeError and fell back to the explicit backend: seen on an H100 with
    torch 2.11)."""
    from mmpe.models.layers.attention import flex as irpe_flex
    if tuple(int(p) for p in torch.__version__.split('.')[:2]) >= (2, 13):
        assert irpe_flex._recompile_options() == dict(
            recompile_limit=irpe_flex.FLEX_RECOMPILE_LIMIT,
            isolate_recompiles=True)
    calls = []

    def compile_of_torch_2_11(model=None, *, fullgraph=False, dynamic=None,
                              backend='inductor', mode=None, options=None,
                              disable=False):
        calls.append(dict(fullgraph=fullgraph, dynamic=dynamic))
        return model

    monkeypatch.setattr(torch, 'compile', compile_of_torch_2_11)
    irpe_flex.compiled_flex_attention.cache_clear()
    try:
        assert irpe_flex._recompile_options() == {}
        assert irpe_flex.compiled_flex_attention() is \
            irpe_flex._flex_attention
    finally:
        irpe_flex.compiled_flex_attention.cache_clear()
    assert calls == [dict(fullgraph=True, dynamic=False)]
