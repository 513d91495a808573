"""Floor 5: per-head biases of the grid offset: log-CPB, 2D ALiBi, LookHere."""
