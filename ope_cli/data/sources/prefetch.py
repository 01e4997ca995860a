"""Reading ahead on a background thread, with bounded memory."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def _close(iterator) -> BaseException | None:
    """Closes ``iterator`` where it can be (a generator stopped early runs its cleanup now,
    on the thread that ran it); the error its cleanup raised, if any."""
    close = getattr(iterator, "close", None)
    try:
        if close is not None:
            close()
    except BaseException as error:  # noqa: BLE001 - handed to the consumer as it is
        return error
    return None


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items`` in order, produced up to ``depth`` ahead by a background thread.

    pyarrow reads and decodes with the GIL released, so the next record batches are read
    while the caller assembles, pads and evaluates the current ones. Memory stays bounded
    by ``depth`` items. An exception raised by ``items`` is re-raised here, in order; when
    the caller stops early (or fails), the thread stops at its next item and closes
    ``items`` (a generator's ``finally`` blocks run then, not when it is collected).
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    iterator = iter(items)

    def produce() -> None:
        error = None
        try:
            for item in iterator:
                if not put((item, None)):
                    break
        except BaseException as caught:  # noqa: BLE001 - handed to the consumer as it is
            error = caught
        closing = _close(iterator)
        put((_DONE, error or closing))  # returns at once if the consumer stopped

    thread = threading.Thread(target=produce, name="ope-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()
