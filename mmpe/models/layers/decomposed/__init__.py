"""Floor 3: per-axis relative terms: decomposed relative position, BoxRPB."""
