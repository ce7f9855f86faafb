"""``python -m tests.held_job HOLD ARGS...``: the ``specdec`` CLI (``ARGS``) whose job
holds for good once it has written ``HOLD`` part files, a fault for the resume test.

The process sleeps instead of writing the next part, so a test that kills it once a
given number of parts exists kills it mid-run on any machine, however fast the job;
what is decoded while it sleeps is never written. Nothing else in the job changes.
"""

import sys
import time

from pipelines import cli, part_files


def hold_after(parts: int) -> None:
    """Make ``part_files.write_part`` sleep for good after its ``parts``-th file."""
    write = part_files.write_part
    written = 0

    def held(folder, items):
        nonlocal written
        path = write(folder, items)
        written += 1
        while written >= parts:
            time.sleep(3600)
        return path

    part_files.write_part = held


if __name__ == "__main__":
    hold_after(int(sys.argv[1]))
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    cli.entry()
