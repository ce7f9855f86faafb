"""The exit statuses of the job commands (``specdec translate``, ``summarize``): what a
script that runs a job can rely on (:mod:`pipelines.cli` documents them in ``--help``)."""

EXIT_OK = 0  # every record came out
EXIT_FAILED = 1  # the job started but did not finish, or lost a record (a bug)
EXIT_CANNOT_START = 2  # bad flags or config, missing checkpoint, unreadable input
EXIT_DEAD_LETTERS = 3  # the job finished, but some records went to the dead letters
EXIT_CODES = {
    EXIT_OK: "every record came out",
    EXIT_FAILED: "the job failed after it started (finished records are kept: rerun to "
    "continue), or a record was lost",
    EXIT_CANNOT_START: "the job could not start: bad flags or config, missing checkpoint, "
    "unreadable input",
    EXIT_DEAD_LETTERS: "the job finished, but some records went to the dead letters (the "
    "summary counts them per reason)",
}
