"""Read a kernel's SASS (``nvdisasm -c``) and ``ptxas -v`` log: the loops
and what each iteration executes.

A loop is a backward branch: ``BRA`` at address ``a`` to a label at
``t <= a`` spans the instructions from ``t`` to ``a``. Each loop of the
fused kernels walks the key (or query) tiles once, so the instructions of
its body are the instructions per tile per warp (every thread of a warp
issues the same stream). Counted per loop:

* ``instructions``: every SASS instruction of the body;
* ``tensor_core``: ``HGMMA`` (Hopper warpgroup MMA) and ``HMMA`` (Ampere
  MMA) instructions;
* ``global_loads``: ``LDG`` (a thread's own loads: the gathers of the
  term); ``async_copies``: ``LDGSTS`` / ``UTMALDG`` (the pipelined tile
  copies);
* ``global_atomics``: ``RED`` / ``ATOMG`` / ``ATOM`` on global memory;
* ``fences``: ``MEMBAR`` of GPU / system scope (a memory fence, e.g.
  before an acq_rel atomic) and ``CCTL`` (the cache invalidation after
  one); ``cta_fences``: ``MEMBAR`` of the block (Triton's shared-memory
  hand-over of a product's operand, in the kernels without a term too);
* ``spills``: ``STL`` / ``LDL`` (local memory: spilled registers).
"""
import re
from typing import Dict, List, NamedTuple, Optional

#: One SASS line of ``nvdisasm -c``: ``/*addr*/  [@P] OPCODE... ;``
_INSTR = re.compile(r'/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;')
_LABEL = re.compile(r'^\s*\.?(L_x_\d+|\.L_\w+):')
_TARGET = re.compile(r'BRA\s+`?\(?\.?(L_x_\d+|\.L_\w+)\)?`?')

#: opcode (before the first '.') -> the counter it adds to
CATEGORIES: Dict[str, str] = {
    'HGMMA': 'tensor_core',
    'HMMA': 'tensor_core',
    'LDG': 'global_loads',
    'LDGSTS': 'async_copies',
    'UTMALDG': 'async_copies',
    'RED': 'global_atomics',
    'REDG': 'global_atomics',
    'ATOMG': 'global_atomics',
    'ATOM': 'global_atomics',
    'STL': 'spills',
    'LDL': 'spills',
}
COUNTERS = ('instructions', 'tensor_core', 'global_loads', 'async_copies',
            'global_atomics', 'fences', 'cta_fences', 'spills')


def category(opcode: str) -> str:
    """The counter an instruction adds to besides ``instructions`` (or
    ''): :data:`CATEGORIES` by its opcode; ``MEMBAR`` of GPU or system
    scope and ``CCTL`` (the L1 invalidation that follows an acq_rel
    atomic) are ``fences``, ``MEMBAR`` of the block (the shared-memory
    hand-over of Triton's own pipeline, present without any term)
    ``cta_fences``."""
    base = opcode.split('.')[0]
    if base == 'MEMBAR':
        return 'cta_fences' if opcode.endswith('.CTA') else 'fences'
    if base == 'CCTL':
        return 'fences'
    return CATEGORIES.get(base, '')


class Instruction(NamedTuple):
    address: int
    opcode: str  # the full opcode with its modifiers, e.g. 'LDG.E.U16'
    text: str


class Loop(NamedTuple):
    start: int  # address of the first instruction of the body
    end: int  # address of the backward branch
    counts: Dict[str, int]
    nested: bool  # it contains another loop


def opcode_of(text: str) -> str:
    """The opcode of an instruction's text, its predicate (``@P0``,
    ``@!PT``) dropped."""
    parts = text.split()
    if parts and parts[0].startswith('@'):
        parts = parts[1:]
    return parts[0] if parts else ''


def parse_sass(sass: str) -> tuple:
    """``(instructions, labels)``: the instructions in order and each
    label's address (the address of the instruction after it)."""
    instructions: List[Instruction] = []
    pending: List[str] = []
    labels: Dict[str, int] = {}
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1).lstrip('.'))
            continue
        m = _INSTR.search(line)
        if not m:
            continue
        address = int(m.group(1), 16)
        for name in pending:
            labels[name] = address
        pending = []
        text = m.group(2).strip()
        instructions.append(Instruction(address, opcode_of(text), text))
    return instructions, labels


def count(instructions: List[Instruction]) -> Dict[str, int]:
    """The counters of :data:`COUNTERS` over ``instructions``."""
    out = dict.fromkeys(COUNTERS, 0)
    for ins in instructions:
        out['instructions'] += 1
        kind = category(ins.opcode)
        if kind:
            out[kind] += 1
    return out


def loops(sass: str) -> List[Loop]:
    """The loops of a kernel's SASS in address order (outermost first
    where they nest)."""
    instructions, labels = parse_sass(sass)
    found = []
    for ins in instructions:
        if ins.opcode.split('.')[0] != 'BRA':
            continue
        target = _TARGET.search(ins.text)
        if not target:
            continue
        start = labels.get(target.group(1).lstrip('.'))
        # start < address: a branch to itself is the idle loop after EXIT
        if start is not None and start < ins.address:
            found.append((start, ins.address))
    result = []
    for start, end in sorted(found, key=lambda se: (se[0], -se[1])):
        body = [x for x in instructions if start <= x.address <= end]
        nested = any(s >= start and e <= end and (s, e) != (start, end)
                     for s, e in found)
        result.append(Loop(start, end, count(body), nested))
    return result


def per_tile(found: List[Loop]) -> Dict[str, int]:
    """The counters per tile: summed over the loops that contain no other
    loop (each walks the tiles once: the forward's main loop and its value
    term's pass, a backward kernel's one loop)."""
    total = dict.fromkeys(COUNTERS, 0)
    for loop in found:
        if not loop.nested:
            for key, value in loop.counts.items():
                total[key] += value
    return total


_SPILL = re.compile(r'(\d+) bytes spill stores, (\d+) bytes spill loads')
_REGS = re.compile(r'Used (\d+) registers')
_NOTE = re.compile(r'\(C\d{4}\)')


def parse_ptxas_log(log: str) -> dict:
    """From ``ptxas -v``'s log: ``registers``, ``spill_stores`` /
    ``spill_loads`` (bytes) and its warnings and numbered notes (``(C7515)
    Potential Performance Loss: wgmma.mma_async instructions are
    serialized``: the tensor-core pipeline broken up, an "info" line)."""
    spill = _SPILL.search(log)
    regs = _REGS.search(log)
    warnings = [line.strip() for line in log.splitlines()
                if 'warning' in line.lower() or _NOTE.search(line)]
    return dict(
        registers=int(regs.group(1)) if regs else None,
        spill_stores=int(spill.group(1)) if spill else None,
        spill_loads=int(spill.group(2)) if spill else None,
        warnings=warnings,
        c7515=sum('C7515' in w for w in warnings))


def registers_of(resource_usage: str) -> Optional[int]:
    """``REG:n`` of ``cuobjdump --dump-resource-usage``."""
    m = re.search(r'REG:(\d+)', resource_usage)
    return int(m.group(1)) if m else None
