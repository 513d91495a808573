"""The one integer check of the package (``mmpe.utils.arg_checks``) and the
arguments that go through it: bools are refused (``bool`` is a subclass of
``int``), the message names the field and the value."""
import pytest

from mmpe.utils.arg_checks import check_int, is_int


@pytest.mark.parametrize('value,minimum,ok', [
    (1, 1, True), (7, 1, True), (0, 0, True), (0, 1, False), (-1, 0, False),
    (True, 1, False), (False, 0, False), (1.0, 1, False), ('3', 1, False),
    (None, 1, False), (5, 5, True), (4, 5, False)
])
def test_is_int(value, minimum, ok):
    assert is_int(value, minimum) is ok


def test_is_int_without_minimum_takes_negatives_not_bools():
    assert is_int(-3) and is_int(0)
    assert not is_int(True) and not is_int(2.0)


def test_check_int_messages():
    check_int('depth', 12)
    check_int('skip', 0, minimum=0)
    check_int('chunk_size', None, allow_none=True)
    with pytest.raises(ValueError,
                       match=r'^Unsupported `depth` True \(a bool\), please '
                       r'choose an int > 0$'):
        check_int('depth', True)
    with pytest.raises(ValueError,
                       match=r'^Unsupported `skip` -1, please choose an int '
                       r'>= 0$'):
        check_int('skip', -1, minimum=0)
    with pytest.raises(ValueError,
                       match=r'^Unsupported `chunk_size` 0, please choose an '
                       r'int > 0 or None \(automatic\)$'):
        check_int('chunk_size', 0, hint='automatic', allow_none=True)
    with pytest.raises(ValueError, match=r'`hidden` None, .*int > 0$'):
        check_int('hidden', None)


def _build(cfg):
    from mmdet.registry import MODELS

    import mmpe  # noqa: F401  (registers the modules)
    return MODELS.build(cfg)


@pytest.mark.parametrize('cfg,field', [
    (dict(type='CPVT', arch=dict(embed_dims=32, depth=True, num_heads=2,
                                 mlp_ratio=2.0), img_size=32,
          pos_encoding='none'), 'depth'),
    (dict(type='CPVT', arch='deit-tiny', img_size=32, patch_size=True,
          pos_encoding='none'), 'patch_size'),
    (dict(type='iRPE', head_dim=True, num_heads=2), 'head_dim'),
    (dict(type='iRPE', head_dim=8, num_heads=2, index='clip',
          max_distance=True), 'max_distance'),
    (dict(type='iRPE', head_dim=8, num_heads=2, skip=True), 'skip'),
    (dict(type='PEG', embed_dims=True), 'embed_dims'),
    (dict(type='BoxRPB', num_heads=True), 'num_heads'),
    (dict(type='ViTSimpleFPN', in_channels=True, out_channels=8),
     'in_channels'),
])
def test_modules_refuse_bools_for_ints(cfg, field):
    """Every int argument refuses ``True`` by name (the ViT's arch fields
    took it as 1 before)."""
    with pytest.raises(ValueError, match=rf'`{field}` True \(a bool\)'):
        _build(cfg)
