"""Floor 4: the attention core (PEAttention) and its backends."""
