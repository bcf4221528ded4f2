"""Dispatch from Python with the standard library only.

    d = Dispatch("https://dispatch.example.com", token=os.environ["DISPATCH_TOKEN"])
    a = d.start("Nightly export", machine="db1", state="processing")
    d.update(a["activityId"], progress=0.5, status="Halfway")
    d.end(a["activityId"])
    for seq, event, snapshot in d.follow(a["activityId"]):
        print(seq, event, snapshot["progress"])

Publishing retries what may pass (no connection, 5xx, 429 rate_limited) with the same
Idempotency-Key, so the server applies each publish once; any other 4xx raises at once.
follow() reconnects after a dropped connection with Last-Event-ID: no event lost or repeated.
"""
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

TERMINAL = {"completed", "error", "cancelled", "rejected"}


class DispatchError(Exception):
    def __init__(self, status, code, message):
        super().__init__(f"{message} ({code}, HTTP {status})")
        self.status, self.code = status, code


class Dispatch:
    def __init__(self, url, token, retry_for=30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.retry_for = retry_for

    def start(self, task_name, activity_id=None, **fields):
        body = dict(fields, taskName=task_name)
        if activity_id:
            body["activityId"] = activity_id
        return self._publish("/v1/activities/start", body)

    def update(self, activity_id, **fields):
        return self._publish(f"/v1/activities/{urllib.parse.quote(activity_id, safe='')}/update", fields)

    def end(self, activity_id, **fields):
        return self._publish(f"/v1/activities/{urllib.parse.quote(activity_id, safe='')}/end", fields)

    def _publish(self, path, body, idempotency_key=None):
        key = idempotency_key or uuid.uuid4().hex  # one per publish, the same on every retry
        data = json.dumps(body).encode()
        deadline = time.monotonic() + self.retry_for
        delay = 0.1
        while True:
            request = urllib.request.Request(self.url + path, data=data, method="POST", headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                "Idempotency-Key": key})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return json.load(answer)
            except urllib.error.HTTPError as e:
                try:
                    error = json.load(e).get("error", {})
                except ValueError:
                    error = {}
                code = error.get("code")
                again = e.code >= 500 or (e.code == 429 and code in (None, "rate_limited")) \
                    or (e.code == 409 and code == "concurrent_changes")
                if not again or time.monotonic() + delay > deadline:
                    raise DispatchError(e.code, code, error.get("message", e.reason)) from None
                delay = max(delay, float(e.headers.get("Retry-After") or 0))
            except (urllib.error.URLError, OSError):
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def follow(self, activity_id, last_event_id=None):
        """Yields (seq, event, snapshot) until the activity ends; resumes after a drop."""
        target = urllib.parse.urlsplit(self.url)
        connection_class = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        path = f"{target.path}/v1/activities/{urllib.parse.quote(activity_id, safe='')}/status"
        retry = 3.0
        while True:
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
            if last_event_id is not None:
                headers["Last-Event-ID"] = str(last_event_id)
            connection = connection_class(target.hostname, target.port, timeout=60)  # > 3 heartbeats
            try:
                connection.request("GET", path, headers=headers)
                answer = connection.getresponse()
                if answer.status == 204:  # nothing after last_event_id: it had ended
                    return
                if answer.status != 200:
                    raise DispatchError(answer.status, None, answer.read().decode(errors="replace"))
                event, data, seq = None, [], None
                for raw in answer:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith(":"):
                        continue  # heartbeat
                    if line:
                        field, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
                        elif field == "id":
                            seq = int(value)
                        elif field == "retry":
                            retry = int(value) / 1000
                        continue
                    if data:
                        snapshot = json.loads("\n".join(data))
                        if seq is not None:
                            last_event_id = seq
                        yield seq, event, snapshot
                        if event == "not_found" or snapshot.get("state") in TERMINAL:
                            return
                    event, data, seq = None, [], None
            except (OSError, http.client.HTTPException):
                pass  # dropped: come back with Last-Event-ID
            finally:
                connection.close()
            time.sleep(retry)
