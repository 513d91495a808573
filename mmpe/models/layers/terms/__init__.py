"""Floor 4: the relative-term interface every attention backend reads."""
