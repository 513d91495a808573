"""Floor 5: the box-to-pixel bias (BoxRPB) of DETR decoder cross-attention."""
