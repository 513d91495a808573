"""The integer check of every user-facing argument of mmpe.

One definition of "an int" for the whole package (layers, backbones,
necks, detectors): a Python ``int``, never a ``bool`` although ``bool`` is
a subclass of ``int`` (``depth=True`` is a mistake, not the depth 1). The
error is a ``ValueError`` naming the field, the value and what to choose
instead. Grid sizes that may be symbolic while tracing are checked by
:func:`mmpe.models.layers.common.arg_checks.check_grid` instead.
"""
from typing import Optional


def is_int(value, minimum: Optional[int] = None) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) ``>= minimum``.

    Args:
        value: Anything.
        minimum (int, optional): The smallest value accepted; None: any.

    Returns:
        bool: True for an accepted int.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return minimum is None or value >= minimum


def check_int(name: str,
              value,
              minimum: int = 1,
              hint: str = '',
              allow_none: bool = False) -> None:
    """Raise unless ``value`` is an int ``>= minimum`` (bools refused).

    Args:
        name (str): The field, as the user wrote it (e.g.
            ``'decoder_pe.hidden'``).
        value: The value given.
        minimum (int): The smallest value accepted. Defaults to 1 (an int
            > 0).
        hint (str): What the values mean, appended in parentheses (e.g.
            ``'0: global'``).
        allow_none (bool): Accept None (then ``hint`` should say what it
            means). Defaults to False.

    Raises:
        ValueError: ``Unsupported `name` value, please choose an int > 0``
        (``>= minimum``; ``or None``; the hint), with ``(a bool)`` after a
        bool.
    """
    if (allow_none and value is None) or is_int(value, minimum):
        return
    bound = '> 0' if minimum == 1 else f'>= {minimum}'
    choice = f'an int {bound}' + (' or None' if allow_none else '')
    kind = ' (a bool)' if isinstance(value, bool) else ''
    raise ValueError(f'Unsupported `{name}` {value!r}{kind}, please choose '
                     f'{choice}' + (f' ({hint})' if hint else ''))
