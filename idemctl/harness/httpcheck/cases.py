"""The cases of ``verify --http``, each a method that sends its requests and judges what
came back (the package's docstring says what each checks)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from idemctl.harness.httpcheck.client import REPLAYED, Answer, Requester, difference
from idemctl.harness.httpcheck.report import FAIL, PASS, SEVERITY, SKIP, WARN, Point
from idemctl.harness.httpcheck.target import HttpTarget, merged

PLACEHOLDER = b"{uuid}"
LONG_KEY = 256
"""A key this long is refused: 255 is Stripe's limit and idemctl's."""


@dataclass
class _Points:
    """A point being judged: what it saw, in order."""

    id: str
    statuses: list[int | None] = field(default_factory=list)

    def saw(self, *answers: Answer) -> None:
        self.statuses.extend(answer.status for answer in answers)

    def verdict(self, verdict: str, reason: str) -> Point:
        return Point(self.id, verdict, reason, tuple(self.statuses))


class Checker(Requester):
    """The cases, each a method returning its Point."""

    def __init__(self, target: HttpTarget) -> None:
        super().__init__(target)
        self.marks_replays: bool | None = None
        """Whether the API marks a replay (``Idempotent-Replayed``); None: none seen yet."""

    def key(self) -> str:
        return self.wire(f"verify-{uuid.uuid4()}")

    def wire(self, key: str) -> str:
        return key if self.target.bare_key else f'"{key}"'

    def body(self, template: bytes | None = None) -> bytes:
        chosen = self.target.body if template is None else template
        return chosen.replace(PLACEHOLDER, uuid.uuid4().hex.encode())

    def first(self, point: _Points, answer: Answer, who: str = "the first request") -> str | None:
        """Why ``answer`` (a new request's) is no base to judge on, or None when it is a 2xx."""
        point.saw(answer)
        if answer.status is None:
            return f"{who} got {answer.shown()}"
        if not answer.ok:
            return (
                f"{who} got {answer.status}, not a 2xx: check the URL, --method, --data and "
                "--header"
            )
        return None

    # The cases ------------------------------------------------------------------------

    def missing_key(self) -> Point:
        point = _Points("missing-key")
        answer = self.send(None, self.body())
        point.saw(answer)
        if answer.status is None:
            return point.verdict(FAIL, f"without a key: {answer.shown()}")
        if answer.status == 400:
            shape = " (application/problem+json)" if answer.problem else ""
            return point.verdict(PASS, f"400 without a key{shape}")
        if answer.ok:
            return point.verdict(
                WARN, f"{answer.status}: not required, the request ran without a key"
            )
        if answer.status >= 500:
            return point.verdict(FAIL, f"{answer.status} without a key, not 400")
        return point.verdict(WARN, f"{answer.status} without a key; the draft's is 400")

    def replay(self) -> Point:
        point = _Points("replay")
        key, body = self.key(), self.body()
        first = self.send(key, body)
        unusable = self.first(point, first)
        if unusable:
            return point.verdict(FAIL, unusable)
        again = self.send(key, body)
        point.saw(again)
        changed = difference(first, again)
        if changed is None:
            self.marks_replays = again.replayed
            marked = f"{REPLAYED}: true" if again.replayed else f"no {REPLAYED} header"
            return point.verdict(PASS, f"{again.status} again, byte for byte ({marked})")
        if again.status == 409:
            return point.verdict(
                FAIL, "the retry after the first answer got 409: the key is still held"
            )
        if again.status == first.status and first.body != again.body:
            return point.verdict(
                FAIL, f"the retry got {changed}: the request ran again, not replayed"
            )
        return point.verdict(FAIL, f"the retry got {changed}")

    def other_body(self) -> bytes | None:
        """The body with another payload, or None when verify cannot make one."""
        template = self.target.body
        if PLACEHOLDER in template:
            return self.body(template)
        if not template:
            return None
        types = [v.lower() for n, v in self.target.headers if n.lower() == "content-type"]
        if any("multipart/" in t for t in types):
            return None
        try:
            doc = json.loads(template)
        except ValueError:
            if any("x-www-form-urlencoded" in t for t in types):
                return template + b"&idemctl_verify=another"
            return template + b"\nidemctl-verify: another payload"
        if isinstance(doc, dict):
            return json.dumps({**doc, "idemctl_verify": "another payload"}).encode()
        return json.dumps([doc, "idemctl_verify"]).encode()

    def other_payload(self) -> Point:
        point = _Points("other-payload")
        other = self.other_body()
        if other is None:
            why = "no --data to vary" if not self.target.body else "a multipart body"
            return point.verdict(
                SKIP, f"{why}: put {{uuid}} in --data where the API takes any value"
            )
        key, body = self.key(), self.body()
        first = self.send(key, body)
        unusable = self.first(point, first)
        if unusable:
            return point.verdict(FAIL, unusable)
        second = self.send(key, other)
        point.saw(second)
        status = second.status
        if status is None:
            return point.verdict(FAIL, f"another payload got {second.shown()}")
        if status == 422:
            shape = " (application/problem+json)" if second.problem else ""
            return point.verdict(PASS, f"422 for another payload with the key{shape}")
        if status == 409:
            return point.verdict(
                WARN, "409 for another payload with a completed key; the draft's is 422"
            )
        if 400 <= status < 500:
            alone = self.send(self.key(), other)
            point.saw(alone)
            if alone.status is not None and 400 <= alone.status < 500:
                return point.verdict(
                    WARN,
                    f"{status}, but the other payload gets {alone.status} with a new key too: "
                    "put {uuid} in --data where the API takes any value",
                )
            return point.verdict(
                PASS, f"{status} for another payload with the key (the draft's is 422)"
            )
        if second.replayed or difference(first, second) is None:
            return point.verdict(
                FAIL, f"the first answer ({first.status}) was replayed to another payload"
            )
        if second.ok:
            return point.verdict(FAIL, f"{status}: another payload ran with a used key")
        return point.verdict(FAIL, f"{status} for another payload with the key, not 422")

    def concurrent(self) -> Point:
        point = _Points("concurrent")
        count = self.target.concurrency
        key, body = self.key(), self.body()
        answers = self.at_once(count, key, body)
        point.saw(*answers)
        after = self.send(key, body)
        point.saw(after)
        lost = [answer for answer in answers if answer.status is None]
        if lost:
            return point.verdict(FAIL, f"{len(lost)} of {count} got {lost[0].shown()}")
        busy = [answer for answer in answers if answer.status == 409]
        answered = [answer for answer in answers if answer.status != 409]
        if not answered:
            return point.verdict(FAIL, f"all {count} got 409: not one was answered")
        originals = [answer for answer in answered if not answer.replayed] or answered[:1]
        original = originals[0]
        if not original.ok:
            return point.verdict(
                FAIL, f"the original got {original.status}, not a 2xx: check the request"
            )
        kinds = {(answer.status, answer.body) for answer in answered}
        if len(kinds) > 1:
            created = sum(answer.ok for answer in answered)
            return point.verdict(
                FAIL,
                f"{len(kinds)} different answers to {count} at once ({created} of them 2xx, "
                f"{len(busy)} x 409): the request ran more than once",
            )
        marking = self.marks_replays or any(answer.replayed for answer in [*answered, after])
        if marking and len(originals) > 1:
            return point.verdict(
                FAIL, f"{len(originals)} of {count} were answered as originals (no {REPLAYED})"
            )
        if after.status == 409:
            return point.verdict(FAIL, "a request after them all got 409: the key is still held")
        changed = difference(original, after)
        if changed is not None:
            return point.verdict(FAIL, f"a request after them all got {changed}")
        replays = len(answered) - 1
        parts = [f"1 original {original.status}"]
        if busy:
            told = sum(answer.header("retry-after") is not None for answer in busy)
            later = " with Retry-After" if told == len(busy) else f" ({told} with Retry-After)"
            parts.append(f"{len(busy)} x 409{later}")
        if replays:
            parts.append(f"{replays} replay{'s' if replays > 1 else ''}")
        return point.verdict(
            PASS, f"{count} at once: {', '.join(parts)}; one sent after them: a replay"
        )

    def server_error(self) -> Point:
        point = _Points("server-error")
        target = self.target
        if target.fault_path is None and target.fault_body is None:
            return point.verdict(
                SKIP, "no request known to get a 5xx: give --fault-path or --fault-data"
            )
        path = target.fault_path or self.path
        body = self.body(target.body if target.fault_body is None else target.fault_body)
        key = self.key()
        first = self.send(key, body, path=path)
        point.saw(first)
        if first.status is None:
            return point.verdict(FAIL, f"the fault request got {first.shown()}")
        if first.status < 500:
            return point.verdict(
                WARN,
                f"the fault request got {first.status}, not a 5xx: nothing to check "
                "(--fault-path, --fault-data)",
            )
        again = self.send(key, body, path=path)
        point.saw(again)
        status = again.status
        if status is None:
            return point.verdict(FAIL, f"the retry after {first.status} got {again.shown()}")
        if status == 409:
            return point.verdict(
                FAIL, f"the retry after {first.status} got 409: the key stayed held"
            )
        if again.replayed:
            changed = difference(first, again)
            if changed is not None:
                return point.verdict(
                    FAIL, f"the retry was replayed {changed}, after {first.status}"
                )
            return point.verdict(PASS, f"{first.status} stored and replayed (as Stripe does)")
        if 400 <= status < 500:
            return point.verdict(FAIL, f"the retry after {first.status} was refused with {status}")
        if status >= 500:
            return point.verdict(
                PASS,
                f"{status} again: the key released and run again, or its {first.status} stored",
            )
        return point.verdict(
            PASS, f"the key was released after {first.status}: the retry ran and got {status}"
        )

    def two_callers(self) -> Point:
        point = _Points("two-callers")
        target = self.target
        if not target.second_caller:
            return point.verdict(
                SKIP,
                "give --second-caller-header 'Authorization: ...' with another caller's "
                "credentials",
            )
        theirs = merged(target.headers, target.second_caller)
        key, body = self.key(), self.body()
        first = self.send(key, body)
        unusable = self.first(point, first, "the first caller")
        if unusable:
            return point.verdict(FAIL, unusable)
        second = self.send(key, body, headers=theirs)
        point.saw(second)
        status = second.status
        if status is None:
            return point.verdict(FAIL, f"the second caller got {second.shown()}")
        if status in (401, 403):
            return point.verdict(
                WARN, f"the second caller got {status}: check --second-caller-header"
            )
        if status in (409, 422):
            return point.verdict(
                FAIL, f"the second caller got {status} for the first caller's key: their keys meet"
            )
        if second.replayed:
            return point.verdict(
                FAIL, "the second caller was answered the first caller's response (a replay)"
            )
        if not second.ok:
            return point.verdict(FAIL, f"the second caller got {status}, not a 2xx")
        mine, yours = self.send(key, body), self.send(key, body, headers=theirs)
        point.saw(mine, yours)
        if difference(first, mine) is not None or difference(second, yours) is not None:
            return point.verdict(
                WARN, "a caller's retry did not get its first answer: no replay to tell them apart"
            )
        if difference(first, second) is None and not (self.marks_replays or mine.replayed):
            return point.verdict(
                WARN,
                "both callers got one answer byte for byte, and the API marks no replays: "
                "cannot tell whether their keys met",
            )
        return point.verdict(PASS, "each caller got an answer of its own, and its own again")

    def invalid_key(self) -> Point:
        point = _Points("invalid-key")
        tag = uuid.uuid4().hex
        probes = (
            ("a tab in the key", f"verify\t{tag}"),
            (f"{LONG_KEY} characters", (f"verify-{tag}" * 8)[:LONG_KEY]),
        )
        verdicts, reasons = [], []
        for what, key in probes:
            answer = self.send(self.wire(key), self.body())
            point.saw(answer)
            status = answer.status
            if status == 400:
                verdicts.append(PASS)
                reasons.append(f"{what}: 400")
            elif status is not None and 400 <= status < 500:
                verdicts.append(WARN)
                reasons.append(f"{what}: {status} (the draft's is 400)")
            elif answer.ok:
                verdicts.append(FAIL)
                reasons.append(f"{what}: accepted ({status})")
            else:
                verdicts.append(FAIL)
                reasons.append(f"{what}: {answer.shown()}, not 400")
        return point.verdict(max(verdicts, key=SEVERITY.__getitem__), "; ".join(reasons))
