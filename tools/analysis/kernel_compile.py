"""Compile a Triton launch for a CUDA target on a machine without a GPU.

Triton picks its target from the active driver. :class:`StandInDriver`
answers ``GPUTarget('cuda', arch, 32)`` and device 0 / stream 0, and
:func:`compile_launch` calls ``kernel.run(*args, grid=..., warmup=True,
**meta)`` -- what ``kernel[grid](...)`` does, minus the launch -- on the
very (CPU) tensors the launch code passes: block sizes, warps, stages and
the arguments' specialisation (16-byte alignment, values equal to 1) are
those of a CUDA call of the same shapes. The wheel's ``ptxas``,
``cuobjdump`` and ``nvdisasm`` (``triton/backends/nvidia/bin``) then give
the registers, the ``ptxas -v`` log (spills, warnings) and the SASS.

The driver is set active for the duration of :func:`compiling` and
restored after it; a process that runs the kernels must not use it.
"""
import contextlib
import io
import os
import subprocess
import tempfile
from typing import Optional

import torch

#: Triton's CUDA tools, under ``triton/backends/nvidia/bin``
TOOLS = ('ptxas', 'cuobjdump', 'nvdisasm')


class CompileUnavailable(RuntimeError):
    """This Triton cannot compile for CUDA here (the message says why)."""


def _nvidia_bin() -> str:
    try:
        import triton
    except ImportError as e:
        raise CompileUnavailable(f'Triton is not installed ({e})') from e
    folder = os.path.join(os.path.dirname(triton.__file__), 'backends',
                          'nvidia', 'bin')
    missing = [t for t in TOOLS
               if not os.path.exists(os.path.join(folder, t))]
    if missing:
        raise CompileUnavailable(
            f'Triton {triton.__version__} has no CUDA compiler here: '
            f'{", ".join(missing)} missing in {folder} (a Triton built '
            f'without the NVIDIA backend cannot compile for CUDA)')
    return folder


def unavailable_reason() -> Optional[str]:
    """Why kernels cannot be compiled for CUDA here, or None."""
    if os.environ.get('TRITON_INTERPRET', '0') not in ('', '0'):
        return ('TRITON_INTERPRET is set: Triton interprets the kernels '
                'instead of compiling them (unset it)')
    try:
        _nvidia_bin()
    except CompileUnavailable as e:
        return str(e)
    return None


class StandInDriver:
    """The driver Triton asks for its target while compiling: a CUDA GPU
    of compute capability ``arch`` (90: Hopper, 80: Ampere), warp size 32;
    device 0, stream 0. It launches nothing."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget('cuda', arch, 32)

    @staticmethod
    def is_active() -> bool:
        return False

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def set_current_device(self, device) -> None:
        pass

    def get_active_torch_device(self):
        return torch.device('cpu')

    def get_device_interface(self):
        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_benchmarker(self):
        raise CompileUnavailable('the stand-in driver runs nothing')


@contextlib.contextmanager
def compiling(arch: int):
    """Triton's active driver is a :class:`StandInDriver` of ``arch``
    inside the block."""
    reason = unavailable_reason()
    if reason:
        raise CompileUnavailable(reason)
    import sys

    import triton.runtime.driver  # noqa: F401  (the module, not the object)
    config = sys.modules['triton.runtime.driver'].driver
    # the driver before (None until Triton made its default: on a machine
    # without a GPU it has none to make)
    before = getattr(config, '_active', None)
    config.set_active(StandInDriver(arch))
    try:
        yield
    finally:
        config.set_active(before)


def _run(args) -> str:
    return subprocess.run(args, check=True, capture_output=True,
                          text=True).stdout


def _ptxas_rerun(ptx: str, arch: int, folder: str) -> str:
    """``ptxas -v`` of the PTX with Triton's flags (when Triton kept no
    log of its own run)."""
    ptxas = os.path.join(folder, 'ptxas-blackwell' if arch >= 90 and
                         os.path.exists(os.path.join(
                             folder, 'ptxas-blackwell')) else 'ptxas')
    suffix = 'a' if arch >= 90 else ''
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, 'k.ptx')
        with open(src, 'w') as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, '-lineinfo', '-v', '--regAllocOptLevel=2',
             f'--gpu-name=sm_{arch}{suffix}', src, '-o',
             os.path.join(tmp, 'k.o')], capture_output=True, text=True)
        return out.stdout + out.stderr


def compile_launch(launch, arch: int) -> dict:
    """Compile ``launch`` (:class:`~mmpe.models.layers.attention.
    triton_launch.Launch`) for ``sm_<arch>`` and return its artefacts:
    ``sass`` (``nvdisasm -c``), ``resource_usage`` (``cuobjdump
    --dump-resource-usage``), ``ptxas_log`` (``ptxas -v``), ``shared``
    (bytes of shared memory the launch asks for), ``num_warps``,
    ``num_stages``."""
    import triton
    folder = _nvidia_bin()
    log = io.StringIO()
    knobs = getattr(triton, 'knobs', None)
    nvidia = getattr(knobs, 'nvidia', None)
    has_log = nvidia is not None and hasattr(nvidia, 'dump_ptxas_log')
    with tempfile.TemporaryDirectory() as cache, compiling(arch):
        # a fresh cache: ptxas runs (and logs) for every compilation
        env = {'TRITON_CACHE_DIR': cache}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        saved_log = nvidia.dump_ptxas_log if has_log else None
        if has_log:
            nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(log):
                kernel = launch.kernel.run(*launch.args, grid=launch.grid,
                                           warmup=True, **launch.meta)
        finally:
            if has_log:
                nvidia.dump_ptxas_log = saved_log
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    ptxas_log = log.getvalue()
    if 'Used' not in ptxas_log:
        ptxas_log = _ptxas_rerun(kernel.asm['ptx'], arch, folder)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, 'k.cubin')
        with open(cubin, 'wb') as f:
            f.write(kernel.asm['cubin'])
        sass = _run([os.path.join(folder, 'nvdisasm'), '-c', cubin])
        usage = _run([os.path.join(folder, 'cuobjdump'),
                      '--dump-resource-usage', cubin])
    return dict(sass=sass, resource_usage=usage, ptxas_log=ptxas_log,
                shared=int(kernel.metadata.shared),
                num_warps=int(kernel.metadata.num_warps),
                num_stages=int(kernel.metadata.num_stages),
                triton=triton.__version__,
                ptxas=_tool_version(folder, arch))


def _tool_version(folder: str, arch: int) -> str:
    name = ('ptxas-blackwell' if arch >= 90 and os.path.exists(
        os.path.join(folder, 'ptxas-blackwell')) else 'ptxas')
    out = _run([os.path.join(folder, name), '--version']).strip()
    return f'{name} {out.splitlines()[-1]}' if out else name

