"""The progress line of a run, on standard error, shown from its first instant.

``main`` puts it up before torch is imported (about two seconds), and a background thread
redraws it twice a second, so that a phase of unknown length (loading, drawing data, the first
chunk, which builds the tree's tables) shows its time running instead of a frozen line.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["Progress"]

#: Seconds between two redraws by the background thread.
TICK_S = 0.5


def _stderr_is_tty() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


def _terminal_columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class Progress:
    """A progress bar on standard error: tqdm when installed, else a plain counter.  Silent unless
    standard error is a terminal, so that logs and pipes stay clean.

    ``stage(desc, total)`` starts the next phase (loading, drawing data, decoding, ...); ``update(n)``
    advances it; ``write(text)`` prints a line above the bar; ``close()`` removes the bar.
    """

    def __init__(self, desc: str, total: int | None = None, enabled: bool = True, unit: str = "sample"):
        self.enabled = enabled and _stderr_is_tty()
        self.desc, self.total, self.done, self.unit = desc, total, 0, unit
        self._bar = None
        self._last = 0.0
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None
        if not self.enabled:
            return
        try:
            self._start_drawing()
        except BaseException:  # Ctrl-C right after the first draw: take the line down again
            self.__exit__(*sys.exc_info())
            raise

    def _start_drawing(self) -> None:
        try:
            from tqdm import tqdm

            # A terminal that reports no size (a bare pseudo-terminal) would get no bar from tqdm at all.
            width = {"dynamic_ncols": True} if _terminal_columns() > 0 else {"ncols": 80, "nrows": 24}
            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, file=sys.stderr,
                             mininterval=0.2, bar_format=self._format(self.total), **width)
        except ImportError:
            self._draw(force=True)
        # Known to close() once started only: a Ctrl-C inside start() leaves a thread that stops at its
        # first tick (_stop is set), never one that close() would join before it started.
        ticker = threading.Thread(target=self._tick, name="hdecode-progress", daemon=True)
        ticker.start()
        self._ticker = ticker

    @staticmethod
    def _format(total):
        # A phase of unknown length (loading, drawing data) shows its name and the time spent.
        return None if total else "{desc}: {elapsed}"

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if not self.enabled:
                    return
                if self._bar is not None:
                    self._bar.refresh()
                else:
                    self._draw(force=True)

    def stage(self, desc: str, total: int | None = None, unit: str | None = None) -> None:
        with self._lock:
            self.desc, self.total, self.done = desc, total, 0
            self.unit = unit or self.unit
            self._start = time.monotonic()
            if not self.enabled:
                return
            if self._bar is not None:
                self._bar.bar_format = self._format(total)
                self._bar.unit = self.unit
                self._bar.set_description(desc, refresh=False)
                self._bar.reset(total=total)
            else:
                self._draw(force=True)

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if not self.enabled:
                return
            if self._bar is not None:
                self._bar.update(n)
            else:
                self._draw()

    def write(self, text: str) -> None:
        """A line on standard error that does not garble the bar."""
        with self._lock:
            if self._bar is not None and self.enabled:
                self._bar.write(text, file=sys.stderr)
                return
            if self.enabled:
                sys.stderr.write("\r" + " " * 70 + "\r")
            print(text, file=sys.stderr)
            if self.enabled:
                self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < TICK_S:
            return
        self._last = now
        count = f"{self.done}/{self.total} {self.unit}s ({100 * self.done / max(self.total, 1):.0f}%)" \
            if self.total else f"{now - self._start:.0f} s"
        sys.stderr.write(f"\r{self.desc}: {count}".ljust(70)[:100])
        sys.stderr.flush()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None and self._ticker.is_alive() and self._ticker is not threading.current_thread():
            self._ticker.join()
        with self._lock:
            if not self.enabled:
                return
            if self._bar is not None:
                self._bar.close()
            else:
                sys.stderr.write("\r" + " " * 70 + "\r")
                sys.stderr.flush()
            self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:
            # A Ctrl-C can land while tqdm holds only some of its write locks; closing the bar then raises
            # "release unlocked lock", which must not replace the interrupt (or error) being reported.
            if exc_type is None:
                raise
