"""Floor 5: iRPE: index functions, bucket tables, expansion plans, module."""
