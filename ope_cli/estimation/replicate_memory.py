"""Whether the bootstrap replicates' per-step sums fit in this machine's memory.

With ``--ci percentile`` or ``bootstrap-t``, WPDIS and WDR keep each of their per-step sums
for every bootstrap replicate and every step of the longest episode, for each policy: host
memory that grows with replicates x steps. Past the machine's memory the process would be
killed without a word, after minutes; it is refused with one line as soon as the
evaluation pass reads an episode that long (after a ``--q fit`` or ``--behavior estimate``
pass, which reads the data first).
"""

from __future__ import annotations

import os
from pathlib import Path

from ope_cli.errors import UsageError

# Host bytes per bootstrap replicate, per per-step sum and per step of the longest episode:
# the batch's joined sums, the merged ones and a merge's blocks (7.0 GB measured for 200
# replicates of WPDIS's two sums over a 1,000,000-step episode: 17.5 bytes).
REPLICATE_STEP_BYTES = 18

# a container's limit: cgroup v2's file ("max": none), else cgroup v1's (a huge number: none)
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def machine_memory() -> int | None:
    """Bytes of memory this process can have at most: the physical memory, or a
    container's limit (cgroup v2 or v1) where lower; None where neither is known."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        pass
    for limit in _CGROUP_LIMITS:
        try:
            sizes.append(int(limit.read_text().strip()))
            break
        except (OSError, ValueError):  # no such file, or "max": no limit
            continue
    sizes = [size for size in sizes if size > 0]
    return min(sizes) if sizes else None


def replicate_bytes(steps: int, replicates: int, step_sums: int, policies: int) -> int:
    """Host bytes that ``replicates`` bootstrap replicates of ``step_sums`` per-step sums
    take for each of ``policies`` policies over an episode of ``steps`` steps."""
    return REPLICATE_STEP_BYTES * replicates * step_sums * policies * steps


def check_replicate_memory(
    method: str, steps: int, replicates: int, step_sums: int, policies: int
) -> None:
    """A UsageError when the ``method`` intervals' replicates of the per-step sums need
    more than the machine's memory for an episode of ``steps`` steps."""
    needed = replicate_bytes(steps, replicates, step_sums, policies)
    available = machine_memory()
    if needed == 0 or available is None or needed <= available:
        return
    per_policy = " for each policy" if policies > 1 else ""
    raise UsageError(
        f"--ci {method} keeps {replicates} bootstrap replicates of {step_sums} per-step sums"
        f"{per_policy} for every step of the longest episode: its {steps:,} steps need about "
        f"{needed / 2**30:.1f} GiB, more than this machine's {available / 2**30:.1f} GiB; use "
        "--ci normal, or fewer --bootstrap-samples"
    )
