"""Floor 6: ViTDet's decomposed relative position (per-axis tables)."""
