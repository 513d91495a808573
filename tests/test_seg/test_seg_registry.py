"""mmpe in MMSegmentation's registries, and the version guard over mmseg.

``import mmpe`` registers CPVT and ViTSimpleFPN (and the hooks
``tools/train.py`` adds) in mmseg's registries too, as the same classes;
mmdet's registries keep them; an mmseg outside 1.2.x is refused at import
and an absent one leaves detection working."""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.registry import DefaultScope

import mmpe.seg
from mmdet.registry import MODELS as DET_MODELS
from mmpe.models import CPVT
from mmpe.models.necks import ViTSimpleFPN
from mmpe.utils.version_check import check_versions
from mmseg.registry import HOOKS as SEG_HOOKS
from mmseg.registry import MODELS as SEG_MODELS

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
GOOD = dict(mmcv='2.1.0', mmengine='0.10.7', mmdet='3.3.0')


def test_mmseg_builds_cpvt_and_the_neck_by_plain_name():
    with DefaultScope.overwrite_default_scope('mmseg'):
        backbone = SEG_MODELS.build(
            dict(type='CPVT', arch=dict(embed_dims=32, depth=1, num_heads=2,
                           mlp_ratio=2.),
                 out_indices=(-1, ), init_cfg=None))
        neck = SEG_MODELS.build(
            dict(type='ViTSimpleFPN', in_channels=32, out_channels=16))
    assert type(backbone) is CPVT and type(neck) is ViTSimpleFPN
    out = neck(backbone(torch.rand(1, 3, 64, 96)))
    assert [tuple(o.shape[-2:]) for o in out] == [(16, 24), (8, 12), (4, 6),
                                                  (2, 3)]
    assert SEG_MODELS.get('PaddingAwareEncoderDecoder') is \
        mmpe.seg.PaddingAwareEncoderDecoder
    for name in ('PlainCheckpointHook', 'RNGStateHook', 'SegLabelCheckHook'):
        assert SEG_HOOKS.get(name) is not None, name


def test_detection_registry_unchanged():
    assert DET_MODELS.get('CPVT') is CPVT
    assert DET_MODELS.get('ViTSimpleFPN') is ViTSimpleFPN
    # the segmentation-only modules stay out of mmdet's registry
    assert 'PaddingAwareEncoderDecoder' not in DET_MODELS.module_dict


def test_registration_is_idempotent_and_refuses_a_foreign_class():
    mmpe.seg.register_in_mmseg()
    assert SEG_MODELS.get('CPVT') is CPVT

    class CPVT2(torch.nn.Module):
        pass

    CPVT2.__name__ = 'CPVT'
    SEG_MODELS._module_dict['CPVT'] = CPVT2
    try:
        with pytest.raises(KeyError, match="already has a 'CPVT'"):
            mmpe.seg.register_in_mmseg()
    finally:
        SEG_MODELS._module_dict['CPVT'] = CPVT


@pytest.mark.parametrize('version', ['1.2.0', '1.2.2', '1.2.99'])
def test_supported_mmseg_passes(version):
    check_versions(dict(GOOD, mmsegmentation=version))


@pytest.mark.parametrize('version', ['1.1.2', '1.3.0', '0.30.0'])
def test_unsupported_mmseg_is_refused(version):
    with pytest.raises(ImportError) as err:
        check_versions(dict(GOOD, mmsegmentation=version))
    assert (f'found mmsegmentation {version}, supported: '
            'mmsegmentation>=1.2.0, <1.3.0') in str(err.value)


def test_absent_mmseg_passes_the_guard():
    check_versions(dict(GOOD, mmsegmentation=None))
    check_versions(dict(GOOD))


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                          capture_output=True, text=True)


def test_import_mmpe_without_mmseg_keeps_detection():
    """A fresh Python where mmseg is neither installed (metadata) nor
    importable: ``import mmpe`` works, registers the detection modules and
    imports no mmseg."""
    proc = _python(
        'import sys\n'
        'from importlib import metadata\n'
        'real = metadata.version\n'
        'def version(name):\n'
        "    if name == 'mmsegmentation':\n"
        '        raise metadata.PackageNotFoundError(name)\n'
        '    return real(name)\n'
        'metadata.version = version\n'
        "sys.modules['mmseg'] = None  # import mmseg raises ImportError\n"
        'import mmpe\n'
        'from mmdet.registry import MODELS\n'
        "assert MODELS.get('PaddingAwareMaskRCNN') is not None\n"
        "assert 'mmpe.seg' not in sys.modules\n"
        "print('ok')\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'ok'


def test_import_mmpe_refuses_an_unsupported_mmseg():
    proc = _python(
        'from importlib import metadata\n'
        'real = metadata.version\n'
        "metadata.version = lambda n: '1.3.0' if n == 'mmsegmentation' "
        'else real(n)\n'
        'import mmpe\n')
    assert proc.returncode != 0
    assert ('found mmsegmentation 1.3.0, supported: '
            'mmsegmentation>=1.2.0, <1.3.0') in proc.stderr
