"""Refuse to import mmpe beside OpenMMLab versions it was not built for.

mmpe subclasses MMDetection 3.3's DETR heads and layers, uses MMCV 2.x's
attention layout, and reaches into MMEngine 0.10's internals (the message
hub's ``HistoryBuffer`` layout, ``CheckpointLoader``'s scheme table, the
Runner's checkpoint hooks). Another version would fail later and less
clearly, or load checkpoints wrongly; :func:`check_versions` fails at
``import mmpe`` instead, naming what it found and what is supported.

MMSegmentation (distribution ``mmsegmentation``) is in :data:`OPTIONAL`:
mmpe's segmentation modules subclass mmseg 1.2's ``EncoderDecoder`` and
datasets, so an installed mmseg outside its range is refused the same way,
while an absent one only leaves the mmseg registration out
(:func:`mmseg_installed`; detection works without it).

Versions are read from the installed distributions' metadata, without
importing the packages (mmdet's own import asserts on mmcv first).
"""
from importlib import metadata
from typing import Dict, Mapping, Optional, Tuple

#: Supported ranges: name -> (lowest allowed, first refused).
SUPPORTED: Dict[str, Tuple[str, str]] = {
    'mmcv': ('2.0.0rc4', '2.2.0'),
    'mmengine': ('0.10.0', '0.11.0'),
    'mmdet': ('3.3.0', '3.4.0'),
}
#: Checked only when installed: name -> (lowest allowed, first refused).
OPTIONAL: Dict[str, Tuple[str, str]] = {
    'mmsegmentation': ('1.2.0', '1.3.0'),
}


def supported_range(name: str) -> str:
    """``'>=low, <high'`` for a package in :data:`SUPPORTED` or
    :data:`OPTIONAL`."""
    low, high = {**SUPPORTED, **OPTIONAL}[name]
    return f'>={low}, <{high}'


def mmseg_installed() -> bool:
    """Whether the ``mmsegmentation`` distribution is installed (its
    metadata; nothing is imported)."""
    try:
        metadata.version('mmsegmentation')
    except metadata.PackageNotFoundError:
        return False
    return True


def installed_versions() -> Dict[str, Optional[str]]:
    """Installed version of each package in :data:`SUPPORTED` (None if
    absent)."""
    found: Dict[str, Optional[str]] = {}
    for name in SUPPORTED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_versions(found: Optional[Mapping[str, Optional[str]]] = None
                   ) -> None:
    """Raise if a package is missing or outside its supported range.

    Args:
        found (Mapping, optional): Package name -> version string (None:
            not installed). Defaults to :func:`installed_versions` and the
            installed :data:`OPTIONAL` packages (absent ones pass).

    Raises:
        ImportError: Naming every package found missing or out of range,
            the version found and the supported range.
    """
    from packaging.version import InvalidVersion, Version  # mmcv needs it
    if found is None:
        found = installed_versions()
        for name in OPTIONAL:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    problems = []
    for name, (low, high) in {**SUPPORTED, **OPTIONAL}.items():
        version = found.get(name)
        if version is None and name in OPTIONAL:
            continue
        if version is None:
            problems.append(f'{name} is not installed (supported: '
                            f'{name}{supported_range(name)})')
            continue
        try:
            ok = Version(low) <= Version(version) < Version(high)
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f'found {name} {version}, supported: '
                            f'{name}{supported_range(name)}')
    if problems:
        raise ImportError(
            'mmpe cannot run with the installed OpenMMLab packages: ' +
            '; '.join(problems) + '. Install the supported versions (see '
            "requirements/runtime.txt and tools/setup_env.sh), e.g. pip "
            "install 'mmengine==0.10.7' 'mmdet==3.3.0' "
            "'mmsegmentation==1.2.2' and mmcv 2.1.0 with its ops.")
