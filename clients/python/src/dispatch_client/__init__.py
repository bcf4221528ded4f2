"""Dispatch from Python, standard library only.

    from dispatch_client import Client

    client = Client()  # DISPATCH_URL and DISPATCH_TOKEN, as the CLI reads them
    with client.activity("nightly backup", machine="xerxes") as job:
        job.progress(0.4, "copying")
    # ended `completed`, or `error` with the exception's message if the block raised

    for event in client.watch(job.id):
        print(event.seq, event.event, event.snapshot["progress"])

Every publish carries an Idempotency-Key, generated once per call and sent again on each of
its retries, so the server applies it once. A call is retried with backoff after a connection
error or a 5xx answer, never after a 4xx (the server refused it; sending it again would be
refused again): that raises `DispatchError` with the contract's error code at once.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Type

__all__ = ["Client", "Job", "Event", "BatchResult", "DispatchError", "TERMINAL_STATES"]

#: The states after which an activity never changes again (contract §1).
TERMINAL_STATES = frozenset({"completed", "error", "cancelled", "rejected"})

Snapshot = Dict[str, Any]


class DispatchError(Exception):
    """An answer that is not a success, or no answer at all after every retry.

    `status` is the HTTP status (0 when the server could not be reached), `code` the
    contract's error code (`not_found`, `already_finished`, `invalid_field`, ...; `unreachable`
    when no answer came), `body` the whole error answer (a 409 carries the stored snapshot
    under `activity`), `retry_after` the server's `Retry-After` in seconds, if any.
    """

    def __init__(self, status: int, code: str, message: str, body: Optional[Mapping[str, Any]] = None,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(f"{message} ({code}, HTTP {status})" if status else f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message
        self.body: Mapping[str, Any] = body or {}
        self.retry_after = retry_after

    @property
    def snapshot(self) -> Optional[Snapshot]:
        """The stored snapshot a refusal carries (a 409 for a finished activity), if any."""
        value = self.body.get("activity")
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Event:
    """One event of a status stream: `seq` is its id (0 for `not_found`), `event` its name."""
    seq: int
    event: str
    snapshot: Snapshot

    @property
    def final(self) -> bool:
        """True for the last event a stream sends: a terminal state or `not_found`."""
        return self.event == "not_found" or self.snapshot.get("state") in TERMINAL_STATES


@dataclass(frozen=True)
class BatchResult:
    """One change's answer in a batch (contract §2.1), in request order."""
    status: int
    snapshot: Optional[Snapshot]
    error: Optional[DispatchError]

    @property
    def ok(self) -> bool:
        return self.error is None


class Client:
    """A connection to one Dispatch server with one API key.

    `url` and `token` default to the environment's `DISPATCH_URL` and `DISPATCH_TOKEN` (or
    the file named by `DISPATCH_TOKEN_FILE`), as the CLI's do; the url to
    http://127.0.0.1:8080, `make run`'s server. `retry_for` bounds how long one
    call keeps retrying (seconds); `timeout` is one request's socket timeout.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, retry_for: float = 30.0,
                 timeout: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> None:
        url = url or os.environ.get("DISPATCH_URL") or "http://127.0.0.1:8080"
        token = token or os.environ.get("DISPATCH_TOKEN")
        if not token and os.environ.get("DISPATCH_TOKEN_FILE"):
            with open(os.environ["DISPATCH_TOKEN_FILE"]) as f:
                token = f.read().strip()
        if not token:
            raise ValueError("no API key: pass token= or set DISPATCH_TOKEN (or DISPATCH_TOKEN_FILE)")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.retry_for = retry_for
        self.timeout = timeout
        self._parts = parts
        self._sleep = sleep

    # -- publishing (contract §2) ------------------------------------------------------------

    def start(self, task_name: str, *, activity_id: Optional[str] = None, **fields: Any) -> Snapshot:
        """Starts an activity (`201`, or `200` for an identical repeat); returns its snapshot.
        Fields are the contract's, in camelCase or snake_case (`machine`, `system_image`,
        `cancel_url`, `initial_progress`, `status`, `state`, `stale_after`, `live_activity`)."""
        body = _camel(fields)
        body["taskName"] = task_name
        if activity_id is not None:
            body["activityId"] = activity_id
        return self._publish("/v1/activities/start", body)

    def update(self, activity_id: str, **fields: Any) -> Snapshot:
        """One change: `progress`, `status`, `state` (`processing` by default)."""
        return self._publish(self._path(activity_id, "update"), _camel(fields))

    def end(self, activity_id: str, **fields: Any) -> Snapshot:
        """The terminal change: `state` (`completed` by default, `error`, `cancelled`,
        `rejected`), `progress`, `status`, `error`."""
        return self._publish(self._path(activity_id, "end"), _camel(fields))

    def touch(self, activity_id: str) -> None:
        """Keeps a quiet activity from being ended as stale (`204`, no event)."""
        self._call("POST", self._path(activity_id, "touch"), b"{}", idempotency_key=None)

    def cancel(self, activity_id: str, reason: Optional[str] = None) -> Snapshot:
        """Asks the activity's publisher to stop (`202`); the state does not change."""
        return self._publish(self._path(activity_id, "cancel"), {} if reason is None else {"reason": reason})

    def batch(self, changes: Iterable[Mapping[str, Any]]) -> List[BatchResult]:
        """Many changes in one request (`POST /v1/changes`, contract §2.1).

        Each change is a dict with `op` (`start`, `update`, `end`), `activityId` and that
        call's fields. A change without `idempotencyKey` gets one, so a retried request
        applies each change once. Refused changes come back with their error; they do not
        stop the others. A body the server refuses as a whole raises `DispatchError`.
        """
        prepared = []
        for change in changes:
            c = _camel(change)
            c.setdefault("idempotencyKey", uuid.uuid4().hex)
            prepared.append(c)
        answer = self._call("POST", "/v1/changes", json.dumps({"changes": prepared}).encode(), idempotency_key=None)
        results = []
        for item in (answer or {}).get("results", []):
            status = int(item.get("status", 0))
            if "error" in item:
                e = item.get("error") or {}
                error = DispatchError(status, str(e.get("code", "unknown")), str(e.get("message", "")), item)
                results.append(BatchResult(status, None, error))
            else:
                results.append(BatchResult(status, item.get("snapshot"), None))
        return results

    # -- reading (contract §3) ---------------------------------------------------------------

    def get(self, activity_id: str) -> Snapshot:
        """The activity's snapshot (`DispatchError` with code `not_found` when unknown)."""
        return self._call("GET", self._path(activity_id, None), None, idempotency_key=None)

    def list(self, *, state: Optional[str] = None, machine: Optional[str] = None, q: Optional[str] = None,
             limit: Optional[int] = None, cursor: Optional[str] = None) -> Dict[str, Any]:
        """One page of activities, newest first: `{"activities": [...], "nextCursor": ...}`."""
        query = {k: v for k, v in (("state", state), ("machine", machine), ("q", q), ("limit", limit),
                                   ("cursor", cursor)) if v is not None}
        path = "/v1/activities" + ("?" + urllib.parse.urlencode(query) if query else "")
        return self._call("GET", path, None, idempotency_key=None)

    def activity(self, task_name: str, *, activity_id: Optional[str] = None, **fields: Any) -> "Job":
        """A context manager around one job: starts it `processing` on entry, ends it
        `completed` when the block finishes, `error` (with the exception's message) when it
        raises, `cancelled` on KeyboardInterrupt. Nothing is left hanging."""
        return Job(self, task_name, activity_id, fields)

    def watch(self, activity_id: str, *, last_event_id: Optional[int] = None,
              reconnect_delay: Optional[float] = None) -> Iterator[Event]:
        """The status stream as an iterator of `Event`s (contract §4).

        It ends after the final event (a terminal state), after `not_found`, or when the
        server answers `204` (nothing after `last_event_id`: the activity had ended). A
        dropped connection is resumed with `Last-Event-ID`, so no event is lost or repeated;
        it waits the server's `retry:` (or `reconnect_delay`) before reconnecting, and gives
        up with `DispatchError` after `retry_for` seconds without a connection.
        """
        delay = reconnect_delay
        failing_since: Optional[float] = None
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = str(last_event_id)
            conn = self._connection(timeout=max(self.timeout, 60.0))  # longer than 3 heartbeats
            try:
                conn.request("GET", self._full(self._path(activity_id, "status")), headers=self._headers(headers))
                answer = conn.getresponse()
                if answer.status == 204:
                    return
                if answer.status != 200:
                    error = _error(answer.status, answer.read(), answer.getheader("Retry-After"))
                    if answer.status < 500:
                        raise error
                    raise _Retryable(error)
                failing_since = None
                for seq, name, data, retry in _sse(answer):
                    if retry is not None and reconnect_delay is None:
                        delay = retry
                    if data is None:
                        continue
                    event = Event(seq if seq is not None else -1, name or "message", json.loads(data))
                    if seq is not None:
                        last_event_id = seq
                    yield event
                    if event.final:
                        return
                # The server closed the stream without a final event (shutdown, too slow): resume.
            except (OSError, http.client.HTTPException, _Retryable) as e:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self.retry_for:
                    raise (e.error if isinstance(e, _Retryable) else
                           DispatchError(0, "unreachable", f"{self.url}: {e}")) from None
            finally:
                conn.close()
            self._sleep(3.0 if delay is None else delay)

    # -- the wire ------------------------------------------------------------------------------

    def _path(self, activity_id: str, action: Optional[str]) -> str:
        path = "/v1/activities/" + urllib.parse.quote(activity_id, safe="")
        return path + "/" + action if action else path

    def _full(self, path: str) -> str:
        return self._parts.path.rstrip("/") + path

    def _headers(self, extra: Mapping[str, str]) -> Dict[str, str]:
        return dict(extra, Authorization=f"Bearer {self.token}", **{"User-Agent": "dispatch-client-python/0.1"})

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        return cls(self._parts.hostname or "", self._parts.port, timeout=timeout)

    def _publish(self, path: str, body: Mapping[str, Any]) -> Snapshot:
        return self._call("POST", path, json.dumps(body).encode(), idempotency_key=uuid.uuid4().hex)

    def _call(self, method: str, path: str, body: Optional[bytes], idempotency_key: Optional[str]) -> Any:
        """One call, retried on connection errors and 5xx (same body, same Idempotency-Key)
        with exponential backoff and jitter until `retry_for` has passed."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        started, slept = time.monotonic(), 0.0
        delay = 0.2
        while True:
            conn = self._connection(self.timeout)
            try:
                conn.request(method, self._full(path), body=body, headers=self._headers(headers))
                answer = conn.getresponse()
                data = answer.read()
                if 200 <= answer.status < 300:
                    return json.loads(data) if data else None
                error = _error(answer.status, data, answer.getheader("Retry-After"))
                if answer.status < 500:
                    raise error
                last: DispatchError = error
            except (OSError, http.client.HTTPException) as e:
                last = DispatchError(0, "unreachable", f"{self.url}: {e}")
            finally:
                conn.close()
            wait = max(delay * random.uniform(0.5, 1.0), last.retry_after or 0)
            if max(time.monotonic() - started, slept) + wait > self.retry_for:
                raise last
            self._sleep(wait)
            slept += wait
            delay = min(delay * 2, 5.0)


class Job:
    """One activity inside a `with client.activity(...)` block. `id` is its activity id."""

    def __init__(self, client: Client, task_name: str, activity_id: Optional[str], fields: Mapping[str, Any]) -> None:
        self._client = client
        self._task_name = task_name
        self._activity_id = activity_id
        self._fields = dict(fields)
        self.snapshot: Snapshot = {}
        self.ended = False

    @property
    def id(self) -> str:
        return str(self.snapshot["activityId"])

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel (as of the last answer from the server)."""
        return bool(self.snapshot.get("cancelRequested"))

    def __enter__(self) -> "Job":
        fields = dict(self._fields)
        fields.setdefault("state", "processing")
        self.snapshot = self._client.start(self._task_name, activity_id=self._activity_id, **fields)
        return self

    def progress(self, fraction: Optional[float], status: Optional[str] = None) -> Snapshot:
        """Reports progress in [0, 1] (None: unknown) and, optionally, a one-line status."""
        fields: Dict[str, Any] = {"progress": fraction}
        if status is not None:
            fields["status"] = status
        return self.update(**fields)

    def update(self, **fields: Any) -> Snapshot:
        self.snapshot = self._client.update(self.id, **fields)
        return self.snapshot

    def touch(self) -> None:
        """Keeps the job fresh through a long quiet phase (no event, no new seq)."""
        self._client.touch(self.id)

    def end(self, state: str = "completed", **fields: Any) -> Snapshot:
        """Ends the job now; leaving the block then does nothing more."""
        self.snapshot = self._client.end(self.id, state=state, **fields)
        self.ended = True
        return self.snapshot

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self.ended or not self.snapshot:
            return
        try:
            if exc is None:
                self.end("completed")
            elif isinstance(exc, KeyboardInterrupt):
                self.end("cancelled", status="interrupted")
            else:
                self.end("error", error=_one_line(str(exc) or type(exc).__name__, 500))
        except DispatchError as e:
            if e.code == "already_finished":  # ended meanwhile (stale, or by another publisher)
                self.ended = True
                self.snapshot = e.snapshot or self.snapshot
                return
            if exc is None:
                raise
            if hasattr(exc, "add_note"):  # Python 3.11+: the block's own exception stays the one raised
                exc.add_note(f"dispatch: ending activity {self.id} failed: {e}")


# -- helpers ------------------------------------------------------------------------------------

class _Retryable(Exception):
    def __init__(self, error: DispatchError) -> None:
        super().__init__(str(error))
        self.error = error


def _camel(fields: Mapping[str, Any]) -> Dict[str, Any]:
    """snake_case keyword names to the contract's camelCase (`cancel_url` -> `cancelURL`)."""
    special = {"cancel_url": "cancelURL", "activity_id": "activityId", "idempotency_key": "idempotencyKey"}
    out: Dict[str, Any] = {}
    for k, v in fields.items():
        if k in special:
            out[special[k]] = v
        else:
            head, *rest = k.split("_")
            out[head + "".join(p[:1].upper() + p[1:] for p in rest)] = v
    return out


def _one_line(text: str, limit: int) -> str:
    """The contract refuses control characters in one-line fields: spaces instead, shortened."""
    flat = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _error(status: int, data: bytes, retry_after: Optional[str]) -> DispatchError:
    try:
        body = json.loads(data)
        error = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        body, error = None, None
    if not isinstance(error, dict):
        error = {"code": "http_" + str(status), "message": data.decode(errors="replace")[:200] or f"HTTP {status}"}
        body = {"error": error}
    try:
        after = float(retry_after) if retry_after else None
    except ValueError:
        after = None
    return DispatchError(status, str(error.get("code")), str(error.get("message", "")), body, after)


def _sse(answer: http.client.HTTPResponse) -> Iterator[tuple]:
    """Parses an event stream (WHATWG HTML §9.2): yields (id, event, data, retry) per dispatched
    event, and (None, None, None, retry) for a `retry:` line alone."""
    seq: Optional[int] = None
    name: Optional[str] = None
    data: List[str] = []
    while True:
        raw = answer.readline()
        if not raw:
            return
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield seq, name, "\n".join(data), None
            seq, name, data = None, None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "id":
            seq = int(value) if value.isdigit() else None
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "retry" and value.isdigit():
            yield None, None, None, int(value) / 1000
