"""Floor 0 of the layers: tracing state, bounded caches, argument checks."""
