"""Install mmpe: position encodings for vision transformers in MMDetection 3.x."""
import os.path as osp

from setuptools import find_packages, setup


def get_extensions() -> tuple:
    """mmpe's compiled CPU kernel (``mmpe._ext``), built against the
    installed torch (``pip install --no-build-isolation``, as
    tools/setup_env.sh does). Optional: without a compiler mmpe installs
    and its attention uses the pure-PyTorch backends.

    ``-fno-math-errno -fno-trapping-math`` (torch's own flags) let the
    compiler vectorise the kernel's exp. No ``-march``: one build runs on
    every CPU of its architecture. The row loops are compiled once per
    instruction set (``kernel_rows_{baseline,avx2,avx512}.cpp``, each
    setting its own target for its functions only; AVX2 / AVX-512 on x86-64
    alone) and the variant is picked at run time from the CPU's features
    (or ``MMPE_KERNEL_ISA``; ``kernel_variants.cpp``), as PyTorch's own CPU
    kernels are.
    """
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # no torch at build time: pure Python
        return [], {}
    flags = ['-O3', '-fopenmp', '-fno-math-errno', '-fno-trapping-math']
    sources = [
        'mmpe/csrc/fused_attention_cpu.cpp', 'mmpe/csrc/kernel_variants.cpp'
    ] + [
        f'mmpe/csrc/kernel_rows_{isa}.cpp'
        for isa in ('baseline', 'avx2', 'avx512')
    ]  # the x86 variants compile to nothing elsewhere
    ext = CppExtension(
        'mmpe._ext', sources,
        depends=['mmpe/csrc/kernel_rows.h', 'mmpe/csrc/kernel_rows_impl.h',
                 'mmpe/csrc/kernel_variants.h'],
        extra_compile_args=flags, extra_link_args=['-fopenmp'],
        optional=True)
    return [ext], {'build_ext': BuildExtension}


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


ext_modules, cmdclass = get_extensions()

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
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
