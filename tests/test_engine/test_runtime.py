"""mmpe's runtime in configs: every config under configs/ inherits
``configs/_base_/runtime_mmpe.py``; :func:`complete_runtime` (what
``MMPERunner`` runs on every config) adds only what is missing, never a
second copy; the names resolve in mmdet's and mmseg's scopes."""
import ast
import glob
import os.path as osp
from collections import Counter

import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import Runner

from mmpe.engine import (RUNTIME_HOOKS, MMPERunner, complete_runtime,
                         use_mmpe_runner)
from mmpe.engine.runtime import type_name

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
RUNTIME_BASE = osp.join(ROOT, 'configs', '_base_', 'runtime_mmpe.py')
CONFIGS = sorted(
    p for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'),
                         recursive=True)
    if '/_base_/' not in p)
# written out here, not taken from the code under test
WANT_HOOKS = ['DatasetCheckHook', 'PlainParamGroupsHook', 'RNGStateHook',
              'PreemptionHook', 'PlainCheckpointHook']


def _bases(path):
    """Local files named by ``_base_`` in ``path`` (``pkg::`` ones are
    another package's)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, 'id', None) == '_base_' for t in node.targets):
            value = ast.literal_eval(node.value)
            names = [value] if isinstance(value, str) else value
            return [
                osp.normpath(osp.join(osp.dirname(path), n)) for n in names
                if '::' not in n
            ]
    return []


def _inherits(path, base, seen=()):
    return any(b == base or (b not in seen and _inherits(b, base, seen +
                                                          (b, )))
               for b in _bases(path))


def test_configs_are_found():
    assert len(CONFIGS) >= 20
    assert osp.join(ROOT, 'configs', 'quickstart',
                    'fpn_cpvt-tiny_synthetic-seg.py') in CONFIGS


@pytest.mark.parametrize('path', CONFIGS,
                         ids=lambda p: osp.relpath(p, ROOT))
def test_every_config_inherits_the_runtime_base(path):
    assert _inherits(path, RUNTIME_BASE), (
        f'{osp.relpath(path, ROOT)} does not inherit '
        "configs/_base_/runtime_mmpe.py: add it to the `_base_` list of the "
        'config (or of the mmpe config it inherits)')
    cfg = Config.fromfile(path, import_custom_modules=False)
    assert cfg.runner_type == 'MMPERunner'
    assert 'mmpe' in cfg.custom_imports['imports']
    # the declared hooks, each once (a config's own custom_hooks list
    # replaces the base's, so it has to name them again)
    names = Counter(type_name(h) for h in cfg.custom_hooks)
    for name in WANT_HOOKS:
        assert names[name] == 1, (
            f'{name} appears {names[name]} times in custom_hooks; a '
            "config's own custom_hooks list replaces the runtime base's: "
            'name each of its hooks once again')


def test_runtime_base_declares_the_runtime_hooks():
    cfg = Config.fromfile(RUNTIME_BASE)
    assert [h['type'] for h in cfg.custom_hooks] == WANT_HOOKS
    assert [name for name, _ in RUNTIME_HOOKS] == WANT_HOOKS


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_runtime_names_resolve_in_both_scopes(scope):
    import importlib

    import mmpe.seg  # noqa: F401  (mmseg's registries)
    registry = importlib.import_module(f'{scope}.registry')
    cfg = Config.fromfile(RUNTIME_BASE)
    with DefaultScope.overwrite_default_scope(scope):
        for hook in cfg.custom_hooks:
            built = registry.HOOKS.build(dict(hook))
            assert type(built).__name__ == hook['type']
        assert registry.HOOKS.get('AtomicCheckpointHook') is not None
        assert registry.LOOPS.get('ResumableEpochBasedTrainLoop') is not None
        assert registry.RUNNERS.get(cfg.runner_type) is MMPERunner


def _bare():
    """What a user's own mmdet config has: no mmpe piece."""
    return Config(
        dict(default_scope='mmdet',
             default_hooks=dict(
                 logger=dict(type='LoggerHook', interval=50),
                 checkpoint=dict(type='CheckpointHook', interval=1,
                                 max_keep_ckpts=3)),
             train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=12,
                            val_interval=1),
             custom_hooks=[dict(type='EMAHook')]))


def test_complete_runtime_adds_only_what_is_missing():
    cfg = _bare()
    changes = complete_runtime(cfg)
    assert [h['type'] for h in cfg.custom_hooks] == ['EMAHook'] + WANT_HOOKS
    assert cfg.default_hooks.checkpoint == dict(
        type='AtomicCheckpointHook', interval=1, max_keep_ckpts=3)
    assert cfg.train_cfg == dict(type='ResumableEpochBasedTrainLoop',
                                 max_epochs=12, val_interval=1)
    assert cfg.default_hooks.logger.type == 'LoggerHook'
    assert len(changes) == 2
    assert 'PreemptionHook' in changes[0] and 'custom_hooks' in changes[0]
    assert 'AtomicCheckpointHook in place of CheckpointHook' in changes[1]
    # a second time (the runner after mmpe's tools): nothing to do
    assert complete_runtime(cfg) == []
    assert len(cfg.custom_hooks) == 6


def test_complete_runtime_never_adds_a_second_copy():
    from mmpe.engine import PlainCheckpointHook
    cfg = _bare()
    mine = PlainCheckpointHook()
    cfg.custom_hooks = [
        dict(type='mmdet.PreemptionHook', signals=('SIGUSR1', )), mine,
        dict(type='SegLabelCheckHook')  # the data set check's older name
    ]
    complete_runtime(cfg)
    names = Counter(type_name(h) for h in cfg.custom_hooks)
    assert names.pop('SegLabelCheckHook') == 1
    assert all(names[n] == 1 for n in WANT_HOOKS[1:]), names
    assert 'DatasetCheckHook' not in names
    assert cfg.custom_hooks[0]['signals'] == ('SIGUSR1', )  # kept as given
    assert cfg.custom_hooks[1] is mine


def test_complete_runtime_other_forms():
    # MMEngine's implicit loop (by_epoch) and default checkpoint hook
    cfg = Config(dict(default_scope='mmseg',
                      train_cfg=dict(by_epoch=True, max_epochs=2)))
    complete_runtime(cfg)
    assert cfg.train_cfg == dict(type='ResumableEpochBasedTrainLoop',
                                 max_epochs=2)
    assert cfg.default_hooks.checkpoint == dict(type='AtomicCheckpointHook',
                                                interval=1)
    # iteration-based loops and a disabled checkpoint hook are kept
    cfg = Config(dict(default_scope='mmseg',
                      default_hooks=dict(checkpoint=None),
                      train_cfg=dict(type='IterBasedTrainLoop',
                                     max_iters=10)))
    complete_runtime(cfg)
    assert cfg.default_hooks.checkpoint is None
    assert cfg.train_cfg.type == 'IterBasedTrainLoop'
    # a scope without mmpe's names gets them from mmdet's registries
    cfg = Config(dict(default_scope='mmpretrain'))
    complete_runtime(cfg)
    assert cfg.custom_hooks[0]['type'] == 'mmdet.DatasetCheckHook'


def test_use_mmpe_runner():
    cfg = _bare()
    assert use_mmpe_runner(cfg) == [] and cfg.runner_type == 'MMPERunner'
    assert cfg.custom_hooks == [dict(type='EMAHook')]  # the runner completes

    class MyRunner(MMPERunner):
        pass

    cfg = _bare()
    cfg.runner_type = MyRunner
    assert use_mmpe_runner(cfg) == []
    # another runner does not complete the config: mmpe's tools do
    cfg = _bare()
    cfg.runner_type = Runner
    lines = use_mmpe_runner(cfg)
    assert len(lines) == 2 and lines[0].startswith('mmpe runtime: ')
    assert "runner 'Runner', not MMPERunner" in lines[1]
    assert cfg.train_cfg.type == 'ResumableEpochBasedTrainLoop'
