"""Compile the compile report's negative controls for sm_90 (run by
test_kernel_report.py in a process of its own: the test suite interprets
Triton kernels, this compiles them).

    PYTHONPATH=tools/analysis python tests/test_tools/kernel_controls.py \
        OUT.json

Writes, per control, what ``tools/analysis/kernel_report.py`` reads of a
kernel (``kernel_row``): a loop of atomic adds with Triton's default
ordering (acq_rel) and the same loop relaxed, and the first Triton kernels
of mmpe (tests/data/kernel_v1) for ViT-S heads, contextual product on k,
bfloat16. Exit status 2 (the reason on stderr) where Triton cannot compile
for CUDA here.
"""
import importlib.util
import json
import os
import sys

os.environ.pop('TRITON_INTERPRET', None)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernel_compile import unavailable_reason  # noqa: E402
from kernel_report import kernel_row, op_inputs  # noqa: E402

from mmpe.models.layers.attention.triton_launch import Launch  # noqa: E402


@triton.jit
def atomic_loop(X, Out, N, RELAXED: tl.constexpr, BLOCK: tl.constexpr):
    """``Out[:BLOCK] += X[n0:n0 + BLOCK]`` for every block: an atomic add
    in a loop, with the default ordering or relaxed."""
    offs = tl.arange(0, BLOCK)
    for n0 in range(0, N, BLOCK):
        x = tl.load(X + n0 + offs)
        if RELAXED:
            tl.atomic_add(Out + offs, x, sem='relaxed')
        else:
            tl.atomic_add(Out + offs, x)


def _v1_backward_q() -> Launch:
    """The first kernels' backward-q launch (their launch code's arguments:
    int64 bucket tables, float32 values) of the report's ViT-S call."""
    spec = importlib.util.spec_from_file_location(
        'triton_kernels_v1',
        os.path.join(ROOT, 'tests', 'data', 'kernel_v1',
                     'triton_kernels_v1.py'))
    v1 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(v1)
    (q, k, v, mask, values_k, _, _, _, rows, cols, layout, _,
     _) = op_inputs('vit-s', 'ctx product k', 'bfloat16')
    product, _, sx, offset, skip, e0, e1, _ = layout
    values_k = values_k.float()
    b, h, length, d = q.shape
    lse = torch.empty(b, h, length)
    dq = torch.empty_like(q)
    dvk = torch.zeros(b, h, length, values_k.shape[-1])

    def s3(x):
        return tuple(x.stride()[:3])

    args = (q, k, v, q, lse, lse, lse, values_k, lse, lse, dq, dvk, rows,
            cols, *s3(q), *s3(k), *s3(v), *s3(q), 0, 0, 0, 0, *s3(values_k),
            0, 0, 0, 0, 0, 0, *s3(dq), *s3(dvk), h, length, length, d, d,
            skip, cols.shape[1], rows.shape[1], cols.shape[1], sx, offset,
            e0, e1, 0, 0.0)
    meta = dict(HAS_MASK=False, HAS_K=True, HAS_Q=False, WITH_SUMS=False,
                PRODUCT=bool(product), QGRID=True, IEEE=False,
                HAS_DROPOUT=False, BM=64, BN=64, BD=d, BDV=d)
    return Launch('v1 backward_q', v1.fused_backward_q_kernel,
                  (length // 64, b * h), args, meta)


def main(out: str) -> int:
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    x = torch.zeros(4096)
    rows = {}
    for relaxed in (False, True):
        launch = Launch('atomic loop', atomic_loop, (1, ), (x, x, 4096),
                        dict(RELAXED=relaxed, BLOCK=128))
        rows['relaxed' if relaxed else 'acq_rel'] = kernel_row(launch, 90)
    rows['v1 backward_q'] = kernel_row(_v1_backward_q(), 90)
    with open(out, 'w') as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
