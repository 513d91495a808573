"""Floor 4: absolute, rotary and convolutional position encodings."""
