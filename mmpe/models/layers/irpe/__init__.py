"""Floor 2: iRPE: index functions, bucket tables, expansion plans, module."""
# transitional (issue 36): the old module path of iRPE, until the last
# test importing it uses the new one
from .irpe import iRPE  # noqa: F401
