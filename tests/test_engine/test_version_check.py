"""``import mmpe`` refuses OpenMMLab versions it was not built for
(mmpe.utils.version_check). The supported ranges below are the ones the
project states (requirements/runtime.txt, setup.py, issue 11): mmcv >=
2.0.0rc4, < 2.2.0; mmengine 0.10.x; mmdet 3.3.x."""
import os.path as osp
import subprocess
import sys
from importlib import metadata

import pytest

from mmpe.utils import version_check
from mmpe.utils.version_check import check_versions

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
GOOD = dict(mmcv='2.1.0', mmengine='0.10.7', mmdet='3.3.0')


def test_installed_versions_pass():
    found = version_check.installed_versions()
    assert found == {n: metadata.version(n) for n in GOOD}
    check_versions()


@pytest.mark.parametrize('name,version', [
    ('mmcv', '2.0.0rc4'), ('mmcv', '2.1.9'), ('mmengine', '0.10.0'),
    ('mmengine', '0.10.99'), ('mmdet', '3.3.0'), ('mmdet', '3.3.9')
])
def test_supported_edges_pass(name, version):
    check_versions(dict(GOOD, **{name: version}))


@pytest.mark.parametrize('name,version,supported', [
    ('mmcv', '2.2.0', 'mmcv>=2.0.0rc4, <2.2.0'),
    ('mmcv', '1.7.2', 'mmcv>=2.0.0rc4, <2.2.0'),
    ('mmcv', '2.0.0rc3', 'mmcv>=2.0.0rc4, <2.2.0'),
    ('mmengine', '0.9.1', 'mmengine>=0.10.0, <0.11.0'),
    ('mmengine', '0.11.0', 'mmengine>=0.10.0, <0.11.0'),
    ('mmengine', '1.0.0', 'mmengine>=0.10.0, <0.11.0'),
    ('mmdet', '3.2.0', 'mmdet>=3.3.0, <3.4.0'),
    ('mmdet', '3.4.0', 'mmdet>=3.3.0, <3.4.0'),
    ('mmdet', 'not-a-version', 'mmdet>=3.3.0, <3.4.0'),
])
def test_unsupported_version_names_found_and_supported(name, version,
                                                       supported):
    with pytest.raises(ImportError) as err:
        check_versions(dict(GOOD, **{name: version}))
    msg = str(err.value)
    assert f'found {name} {version}' in msg and supported in msg
    others = set(GOOD) - {name}
    assert not any(f'found {n}' in msg for n in others)


def test_missing_package_and_several_problems_in_one_message():
    with pytest.raises(ImportError) as err:
        check_versions(dict(mmcv=None, mmengine='0.9.0', mmdet='3.3.0'))
    msg = str(err.value)
    assert 'mmcv is not installed' in msg
    assert 'found mmengine 0.9.0' in msg


def test_import_mmpe_fails_with_the_message():
    """In a fresh Python whose metadata reports mmengine 0.9.0."""
    code = ('from importlib import metadata\n'
            'real = metadata.version\n'
            "metadata.version = lambda n: '0.9.0' if n == 'mmengine' "
            'else real(n)\n'
            'import mmpe\n')
    proc = subprocess.run([sys.executable, '-c', code],
                          cwd=ROOT,
                          capture_output=True,
                          text=True)
    assert proc.returncode != 0
    assert 'ImportError' in proc.stderr
    assert 'found mmengine 0.9.0, supported: mmengine>=0.10.0, <0.11.0' \
        in proc.stderr
