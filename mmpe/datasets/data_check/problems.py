"""What a data set check finds, and the report that lists all of it at once.

A :class:`Problem` names the file, the annotation (when one is at fault),
the reason in one line and a short ``kind`` for the summary by reason.
:func:`format_report` lists the first problems and counts them all by kind,
so one run of the check tells the user everything that is wrong.
"""
from collections import Counter
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence


@dataclass
class Problem:
    """One thing wrong with a data set.

    Attributes:
        file (str): The image, label map or annotation file at fault.
        reason (str): What is wrong, one line, without the file name.
        kind (str): Short reason for the summary (e.g. ``'box outside the
            image'``).
        ann_id (int | str | None): The annotation's id, if one is at fault.
        index (int | None): The data set index of the sample it spoils;
            None for a sample the data set leaves out (e.g. by
            ``filter_empty_gt``) and for a problem of the whole data set.
        whole_set (bool): A problem of the data set itself (e.g. a class
            missing from the annotation file): no sample can be skipped for
            it.
        img_id (int | str | None): The image's id in a COCO annotation
            file (which sample it is, before ``index`` is known).
    """

    file: str
    reason: str
    kind: str
    ann_id: Optional[object] = None
    index: Optional[int] = None
    whole_set: bool = False
    img_id: Optional[object] = None

    def line(self) -> str:
        """``file [annotation N]: reason``."""
        where = self.file if self.ann_id is None else \
            f'{self.file} [annotation {self.ann_id}]'
        return f'{where}: {self.reason}'

    def to_dict(self) -> dict:
        return asdict(self)


def summary_by_kind(problems: Sequence[Problem]) -> str:
    """``'3 box outside the image, 1 missing file'``, most frequent first."""
    counts = Counter(p.kind for p in problems)
    return ', '.join(f'{n} {kind}' for kind, n in counts.most_common())


def format_report(problems: Sequence[Problem], max_listed: int) -> List[str]:
    """Lines listing ``problems``: the first ``max_listed`` (all when
    ``max_listed`` is 0 or more than there are), then how many more and the
    count of each kind when some were left out."""
    lines = [f'  {p.line()}' for p in problems]
    if max_listed and len(lines) > max_listed:
        more = len(lines) - max_listed
        lines = lines[:max_listed] + [f'  ... and {more} more']
    if len(problems) > 1:
        lines.append(f'  by reason: {summary_by_kind(problems)}')
    return lines
