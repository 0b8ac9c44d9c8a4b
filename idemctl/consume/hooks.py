"""What consume tells its middleware of each message's life, as dramatiq's middleware hear
theirs: the lanes and the loop call each hook at its point; a hook decides what to make of
it (``consume.traced``'s spans, ``consume.metrics``' timings). ``Hooks`` itself does
nothing: a consumer with neither tracing nor metrics runs only these no-ops.

Lane threads call every hook but ``lettering``, ``lettered`` and ``end`` for a dead letter
(the loop's, ``consume.mailroom``); ``end`` is called once per message that began.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.consume.item import Item
    from idemctl.runner import RunResult


class Hooks:
    store_call: Callable[[str, float], None] | None = None
    """Told each claim and completion round trip's seconds (``"claim"`` or ``"complete"``),
    by the lanes' batches; None: not timed."""

    def claimed(self, items: list[Item], sent: tuple[int, int] | None) -> None:
        """The claims of ``items`` were answered; ``sent``: when asked and answered (ns)."""

    def begin(self, item: Item, claimed: RunResult | None) -> None:
        """``item`` is taken up: its handler runs, or its claim's answer is acted on."""

    def run(self, item: Item, run: Callable[[], RunResult]) -> RunResult:
        """Around ``item``'s handler run: returns what ``run()`` returns."""
        return run()

    def handler_ran(self, seconds: float) -> None:
        """A handler returned or raised after ``seconds``."""

    def failed(self, item: Item, exc: BaseException) -> None:
        """Taking ``item`` up raised ``exc`` (a store error, a bug); it ends here."""

    def completed(self, item: Item, result: RunResult) -> None:
        """``item``'s completion was answered."""

    def lettering(self, item: Item, reason: str, topic: str) -> Any:
        """``item`` is dead-lettered to ``topic``: a span whose trace the letter carries on
        (its ``traceparent``), or None."""
        return None

    def lettered(self, item: Item, span: Any) -> None:
        """The broker answered ``item``'s dead letter (``span``: what ``lettering`` gave)."""

    def end(self, item: Item, outcome: str | None) -> None:
        """``item`` is done with in this round: ``outcome``, what it came to."""


class Chain(Hooks):
    """Several hooks, each told in turn."""

    def __init__(self, hooks: list[Hooks]) -> None:
        self.hooks = hooks
        timed = [h.store_call for h in hooks if h.store_call is not None]
        if timed:

            def store_call(op: str, seconds: float) -> None:
                for t in timed:
                    t(op, seconds)

            self.store_call = store_call

    def claimed(self, items: list[Item], sent: tuple[int, int] | None) -> None:
        for h in self.hooks:
            h.claimed(items, sent)

    def begin(self, item: Item, claimed: RunResult | None) -> None:
        for h in self.hooks:
            h.begin(item, claimed)

    def run(self, item: Item, run: Callable[[], RunResult]) -> RunResult:
        """The first hook's ``run`` around the next's, around ``run``."""
        return self._run(0, item, run)

    def _run(self, i: int, item: Item, run: Callable[[], RunResult]) -> RunResult:
        if i == len(self.hooks):
            return run()
        return self.hooks[i].run(item, lambda: self._run(i + 1, item, run))

    def handler_ran(self, seconds: float) -> None:
        for h in self.hooks:
            h.handler_ran(seconds)

    def failed(self, item: Item, exc: BaseException) -> None:
        for h in self.hooks:
            h.failed(item, exc)

    def completed(self, item: Item, result: RunResult) -> None:
        for h in self.hooks:
            h.completed(item, result)

    def lettering(self, item: Item, reason: str, topic: str) -> Any:
        spans = [h.lettering(item, reason, topic) for h in self.hooks]
        return next((s for s in spans if s is not None), None)

    def lettered(self, item: Item, span: Any) -> None:
        for h in self.hooks:
            h.lettered(item, span)

    def end(self, item: Item, outcome: str | None) -> None:
        for h in self.hooks:
            h.end(item, outcome)


class Timing(Hooks):
    """Handler runs' and store round trips' seconds, told to two callables (metrics)."""

    def __init__(
        self, handler: Callable[[float], None], store: Callable[[str, float], None]
    ) -> None:
        self._handler, self.store_call = handler, store

    def handler_ran(self, seconds: float) -> None:
        self._handler(seconds)
