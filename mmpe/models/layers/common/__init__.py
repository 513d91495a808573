"""Floor 3: tracing state, bounded caches, argument checks."""
