"""Kept old path (docs name it) of :mod:`.attention.fused`."""
from .attention.fused import (BLOCK_ELEMENTS, FUSED_DTYPES, KERNEL_ISA_ENV,
                              KERNEL_ISAS, MIN_BLOCK_ROWS, choose_kernel_isa,
                              compute_dtype, fused_attention,
                              fused_unavailable_reason, kernel_isa,
                              kernel_layout, runnable_kernel_isas)
