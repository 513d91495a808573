"""Floor 1: ViTDet's non-overlapping window layout (pure tensor ops)."""
