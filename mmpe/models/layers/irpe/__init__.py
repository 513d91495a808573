"""Floor 2: iRPE: index functions, bucket tables, expansion plans, module."""
