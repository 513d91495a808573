"""Install mmpe: position encodings for vision transformers in MMDetection 3.x."""
import os.path as osp

from setuptools import find_packages, setup


def get_version() -> str:
    scope: dict = {}
    with open(osp.join(osp.dirname(__file__), 'mmpe', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def parse_requirements(fname: str) -> list:
    path = osp.join(osp.dirname(__file__), 'requirements', fname)
    with open(path) as f:
        lines = (line.split('#')[0].strip() for line in f)
        return [line for line in lines if line]


setup(
    name='mmpe',
    version=get_version(),
    description='Position encodings for vision transformers (iRPE, CPVT/PEG, '
    'RoPE-2D, ...) as an MMDetection 3.x plugin',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    python_requires='>=3.8',
    packages=find_packages(exclude=('configs', 'tools', 'tests', 'docs')),
    # mmcv 2.1.0 must be built with ops; see tools/setup_env.sh.
    install_requires=parse_requirements('runtime.txt') + ['mmcv>=2.0.0rc4,<2.2.0'],
    extras_require={'tests': parse_requirements('tests.txt')},
    license='Apache License 2.0',
    zip_safe=False,
)
