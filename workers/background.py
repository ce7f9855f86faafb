"""Start-up work that runs while the job does something else.

A job's first record waits on several slow starts that do not depend on each other: a
local Ray instance (its daemons start in other processes while this one waits), the
MLflow store (imports, the database's schema check), the pipeline's own imports and
model resolution. :class:`Background` starts one of them in a thread at once, and the
job waits for it (:meth:`Background.wait`) only where it needs the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """``fn()`` started now in a daemon thread.

    :meth:`wait` returns its result, or raises its exception, in the caller's thread.
    ``hold`` (given ``fn``'s result): the thread lives on after ``fn`` returns, until
    the process exits. A local Ray instance needs it: Ray binds the lives of the
    daemons it starts to the thread that started them (Linux ``PR_SET_PDEATHSIG``), so
    they would die with a thread that ended.
    """

    def __init__(
        self,
        fn: Callable[[], Any],
        *,
        name: str,
        hold: Callable[[Any], bool] = lambda result: False,
    ):
        self.name, self._fn, self._hold = name, fn, hold
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as error:  # re-raised by wait(), in the waiting thread
            self._error = error
        self._done.set()
        if self._error is None and self._hold(self._result):
            threading.Event().wait()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> Any:
        """``fn``'s result once it has returned (its exception raised here)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result
