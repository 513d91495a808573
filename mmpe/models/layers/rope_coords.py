"""Moved to :mod:`mmpe.models.layers.encodings.rope_coords` (path kept)."""
from .encodings.rope_coords import (COORD_DEFAULTS, COORDS_CHOICES,
                                    NORMALIZE_CHOICES, NORMALIZED_SCALE,
                                    ROPE_ARGS, RoPECoords, augment_coords,
                                    check_coord_args, index_coords,
                                    normalized_coords, valid_extent)
