"""Floor 4: ViTDet's non-overlapping window layout (pure tensor ops)."""
