"""Read an image file as the config's ``LoadImageFromFile`` would, and say
why it cannot be read.

:class:`ImageReadSettings` takes ``color_type``, ``imdecode_backend`` and
``backend_args`` from the data set's pipeline, and
:func:`check_image_file` reads the bytes with ``mmengine.fileio.get`` and
decodes them with ``mmcv.imfrombytes``, the two calls of mmcv's
``LoadImageFromFile.transform``, so a file passes exactly when training
would read it. A file that does not decode is named by what it is: missing,
empty, not an image (its first bytes are no known image signature), a JPEG
that only lacks its end-of-image marker, a JPEG cut off in its image data,
or another image that does not decode.

A JPEG without its end-of-image marker (``FF D9``) is cut off somewhere.
OpenCV 4.11 refuses such a file, also when the image data before the marker
is complete. Which case it is: the data with the marker appended decodes,
and decodes to the same pixels when junk bytes are put before the marker
(a complete scan ignores them; a cut-off scan decodes them as image data).
These probes use PIL, which reports nothing on stderr; for a progressive
JPEG cut exactly between two scans the probe cannot tell the missing
refinement scans, and calls the data complete.
"""
import io
import shlex
from dataclasses import dataclass
from typing import Optional

import mmcv
import numpy as np
from mmengine import fileio
from PIL import Image

#: First bytes of the image formats mmcv's decoders read.
SIGNATURES = ((b'\xff\xd8\xff', 'JPEG'), (b'\x89PNG\r\n\x1a\n', 'PNG'),
              (b'GIF87a', 'GIF'), (b'GIF89a', 'GIF'), (b'BM', 'BMP'),
              (b'II*\x00', 'TIFF'), (b'MM\x00*', 'TIFF'))
JPEG_EOI = b'\xff\xd9'
#: Bytes put before the end marker by the completeness probe.
PROBE_PADDINGS = (b'\x00' * 64, b'\x55' * 64)


@dataclass
class ImageReadSettings:
    """How the pipeline's ``LoadImageFromFile`` reads an image.

    Attributes:
        color_type (str): ``flag`` of ``mmcv.imfrombytes``.
        imdecode_backend (str): ``backend`` of ``mmcv.imfrombytes``.
        backend_args (dict | None): ``backend_args`` of
            ``mmengine.fileio.get``.
        found (bool): Whether the pipeline has a ``LoadImageFromFile``
            (False: mmcv's defaults are used).
    """

    color_type: str = 'color'
    imdecode_backend: str = 'cv2'
    backend_args: Optional[dict] = None
    found: bool = True

    def key(self) -> str:
        """What a cached result depends on besides the file itself."""
        return f'image:{self.color_type}:{self.imdecode_backend}'

    @classmethod
    def from_pipeline(cls, pipeline) -> 'ImageReadSettings':
        """The settings of the first ``LoadImageFromFile`` of ``pipeline``.

        Args:
            pipeline: A built ``Compose`` (its ``transforms``) or a list of
                transforms or their config dicts.
        """
        for name, get in _transforms(pipeline):
            if name == 'LoadImageFromFile':
                return cls(
                    color_type=get('color_type', 'color'),
                    imdecode_backend=get('imdecode_backend', 'cv2'),
                    backend_args=get('backend_args', None))
        return cls(found=False)


def _transforms(pipeline) -> list:
    """(class name, attribute getter) of each transform of a built
    ``Compose`` or a list of transforms or config dicts."""
    found = []
    for t in getattr(pipeline, 'transforms', pipeline) or []:
        if isinstance(t, dict):
            found.append((str(t.get('type', '')).split('.')[-1], t.get))
        else:
            found.append((type(t).__name__,
                          lambda key, default=None, t=t: getattr(
                              t, key, default)))
    return found


def loads_masks(pipeline) -> bool:
    """Whether the pipeline's ``LoadAnnotations`` loads instance masks."""
    return any(name == 'LoadAnnotations' and get('with_mask', False)
               for name, get in _transforms(pipeline))


def image_format(data: bytes) -> Optional[str]:
    """``'JPEG'``, ``'PNG'``, ... from the first bytes, None if unknown."""
    for signature, name in SIGNATURES:
        if data.startswith(signature):
            return name
    if data[:4] == b'RIFF' and data[8:12] == b'WEBP':
        return 'WebP'
    return None


def _pil_pixels(data: bytes) -> Optional[np.ndarray]:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.asarray(img)
    except Exception:  # noqa: BLE001  (any failure: it does not decode)
        return None


def jpeg_data_complete(data: bytes) -> bool:
    """Whether a JPEG that ends without its end-of-image marker holds its
    whole image data (see the module docstring for the probe)."""
    pixels = _pil_pixels(data + JPEG_EOI)
    if pixels is None:
        return False
    for padding in PROBE_PADDINGS:
        probe = _pil_pixels(data + padding + JPEG_EOI)
        if probe is None or not np.array_equal(probe, pixels):
            return False
    return True


def eoi_repair_command(path: str) -> str:
    """Shell command that appends the two missing bytes to ``path``."""
    return f"printf '\\377\\331' >> {shlex.quote(path)}"


def check_image_file(path: str, settings: ImageReadSettings) -> dict:
    """Read and decode ``path`` as ``LoadImageFromFile`` does.

    Args:
        path (str): The image file.
        settings (ImageReadSettings): The pipeline's reading settings.

    Returns:
        dict: ``{'shape': [h, w]}`` of the decoded image, or ``{'kind':
        str, 'reason': str}`` saying why it cannot be read.
    """
    try:
        data = fileio.get(path, backend_args=settings.backend_args)
    except FileNotFoundError:
        return dict(kind='missing file', reason='the file does not exist')
    except OSError as err:
        return dict(kind='unreadable file', reason=f'cannot be read: {err}')
    if not data:
        return dict(kind='not an image', reason='the file is empty (0 bytes)')
    error = ''
    try:
        img = mmcv.imfrombytes(
            data, flag=settings.color_type, backend=settings.imdecode_backend)
    except Exception as err:  # noqa: BLE001  (each backend raises its own)
        img, error = None, f' ({type(err).__name__}: {err})'
    if img is not None:
        return dict(shape=[int(img.shape[0]), int(img.shape[1])])
    backend = settings.imdecode_backend
    fmt = image_format(data)
    if fmt is None:
        return dict(
            kind='not an image',
            reason=f'not an image file (it starts with {data[:8]!r}); '
            f'mmcv ({backend}) cannot decode it')
    if fmt == 'JPEG' and not data.rstrip(b'\x00').endswith(JPEG_EOI):
        if jpeg_data_complete(data):
            return dict(
                kind='JPEG lacks its end marker',
                reason='JPEG without its end-of-image marker (FF D9) at the '
                'end; the image data before it is complete, but mmcv '
                f'({backend}) cannot decode the file as it is. To repair '
                'it (your choice: it appends the 2 missing bytes): '
                f'{eoi_repair_command(path)}')
        return dict(
            kind='truncated JPEG',
            reason=f'JPEG cut off in its image data ({len(data)} bytes, no '
            f'end-of-image marker); mmcv ({backend}) cannot decode it. '
            'Copy the file again from its source (appending the marker '
            'would not bring back the missing part)')
    return dict(
        kind='corrupt image',
        reason=f'{fmt} file that mmcv ({backend}) cannot decode{error}')
