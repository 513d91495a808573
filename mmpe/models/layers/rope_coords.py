"""Kept old path (docs name it) of :mod:`.encodings.rope_coords`."""
from .encodings.rope_coords import (COORD_DEFAULTS, COORDS_CHOICES,
                                    NORMALIZE_CHOICES, NORMALIZED_SCALE,
                                    ROPE_ARGS, RoPECoords, augment_coords,
                                    check_coord_args, index_coords,
                                    normalized_coords, valid_extent)
