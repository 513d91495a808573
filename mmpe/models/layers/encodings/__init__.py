"""Floor 1: absolute, rotary and convolutional position encodings."""
