"""Floor 1: the relative-term interface every attention backend reads."""
