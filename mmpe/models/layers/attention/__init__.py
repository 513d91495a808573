"""Floor 7: the attention core (PEAttention) and its backends."""
