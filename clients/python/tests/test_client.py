"""dispatch_client against a real dispatchd (contract §2, §2.1, §3, §4, §6)."""
from __future__ import annotations

import threading

import pytest

from dispatch_client import Client, DispatchError, Event

# -- the activity block -------------------------------------------------------------------------


def test_block_ends_completed_and_reports_progress(client: Client) -> None:
    with client.activity("nightly backup", machine="xerxes") as job:
        assert job.snapshot["state"] == "processing"
        assert job.snapshot["machine"] == "xerxes"
        job.progress(0.4, "copying")
        job.progress(0.9)
    done = client.get(job.id)
    assert (done["state"], done["progress"], done["status"], done["seq"]) == ("completed", 1, "copying", 4)


def test_block_that_raises_ends_error_with_the_message_and_reraises(client: Client) -> None:
    with pytest.raises(RuntimeError, match="disk full"):
        with client.activity("nightly backup") as job:
            job.progress(0.2)
            raise RuntimeError("disk full\non /backup")
    done = client.get(job.id)
    assert done["state"] == "error"
    assert done["error"] == "disk full on /backup"  # one line: the contract refuses control characters


def test_keyboard_interrupt_ends_cancelled(client: Client) -> None:
    with pytest.raises(KeyboardInterrupt):
        with client.activity("interactive job") as job:
            raise KeyboardInterrupt
    assert client.get(job.id)["state"] == "cancelled"


def test_an_explicit_end_is_not_repeated_and_an_activity_ended_elsewhere_is_left_alone(client: Client, new_id: str) -> None:
    with client.activity("ends itself", activity_id=new_id) as job:
        job.end("cancelled", status="nothing to do")
    assert client.get(new_id)["state"] == "cancelled"
    assert client.get(new_id)["seq"] == 2
    with client.activity("ended by someone else") as other:
        client.end(other.id, state="error", error="killed")
    assert client.get(other.id)["state"] == "error", "leaving the block does not fail on a finished job"


def test_touch_keeps_the_job_fresh_without_an_event(client: Client) -> None:
    with client.activity("quiet phase", stale_after=60) as job:
        job.touch()
        assert client.get(job.id)["seq"] == 1


def test_client_reads_url_and_token_from_the_environment(server: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DISPATCH_URL", server[0])
    monkeypatch.setenv("DISPATCH_TOKEN", server[1])
    c = Client()
    assert c.start("from env")["state"] == "queued"
    monkeypatch.delenv("DISPATCH_TOKEN")
    key_file = tmp_path / "key"
    key_file.write_text(server[1] + "\n")
    monkeypatch.setenv("DISPATCH_TOKEN_FILE", str(key_file))
    assert Client().start("from a key file")["state"] == "queued"
    monkeypatch.delenv("DISPATCH_TOKEN_FILE")
    with pytest.raises(ValueError):
        Client()


# -- errors and retries -------------------------------------------------------------------------


@pytest.mark.parametrize("call, status, code", [
    (lambda c: c.update("py-nobody-here", progress=0.1), 404, "not_found"),
    (lambda c: c.start(""), 400, None),
    (lambda c: c.start("x", progress_typo=1), 400, None),
    (lambda c: c.get("py-nobody-here"), 404, "not_found"),
])
def test_4xx_raises_the_contract_code_at_once(proxy, server, call, status, code) -> None:
    c = Client(proxy.url, server[1], retry_for=10)
    with pytest.raises(DispatchError) as e:
        call(c)
    assert e.value.status == status
    assert e.value.code and e.value.code != f"http_{status}", "the code comes from the JSON error body"
    if code:
        assert e.value.code == code
    assert len(proxy.seen) == 1, "a 4xx is never retried"


def test_wrong_key_is_401_unauthorized(server: tuple) -> None:
    with pytest.raises(DispatchError) as e:
        Client(server[0], "dsp_wrong").start("x")
    assert e.value.status == 401


def test_finished_activity_refusal_carries_the_stored_snapshot(client: Client) -> None:
    with client.activity("done") as job:
        pass
    with pytest.raises(DispatchError) as e:
        client.update(job.id, progress=0.5)
    assert (e.value.status, e.value.code) == (409, "already_finished")
    assert e.value.snapshot and e.value.snapshot["state"] == "completed"


def test_5xx_is_retried_with_the_same_idempotency_key(proxy, server, new_id: str) -> None:
    c = Client(proxy.url, server[1], retry_for=10)
    c.start("retried", activity_id=new_id, state="processing")
    proxy.seen.clear()
    proxy.script[:] = ["503", "503"]
    snap = c.update(new_id, progress=0.5)
    assert snap["seq"] == 2
    assert [s.action for s in proxy.seen] == ["503", "503", "forward"]
    keys = {s.headers.get("idempotency-key") for s in proxy.seen}
    assert len(keys) == 1 and None not in keys, keys


def test_lost_answer_is_retried_and_applied_once(proxy, server, new_id: str) -> None:
    c = Client(proxy.url, server[1], retry_for=10)
    c.start("lost answer", activity_id=new_id, state="processing")
    proxy.seen.clear()
    proxy.script[:] = ["drop", "lose-answer"]  # no answer at all, then committed but unheard
    snap = c.update(new_id, progress=0.7)
    assert [s.action for s in proxy.seen] == ["drop", "lose-answer", "forward"]
    assert len({s.headers["idempotency-key"] for s in proxy.seen}) == 1
    assert snap["seq"] == 2, "the server applied the update once"
    assert c.get(new_id)["seq"] == 2
    other = c.update(new_id, progress=0.8)
    assert other["seq"] == 3, "a new call gets a new key"


def test_unreachable_server_gives_up_after_retry_for() -> None:
    import socket
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    waits: list = []
    c = Client(f"http://127.0.0.1:{port}", "dsp_x", retry_for=2, sleep=waits.append)
    with pytest.raises(DispatchError) as e:
        c.start("x")
    assert e.value.code == "unreachable"
    assert len(waits) >= 2 and waits == sorted(waits) and sum(waits) <= 2, waits  # backoff within retry_for


# -- the batch call (§2.1) ----------------------------------------------------------------------


def test_batch(client: Client, new_id: str) -> None:
    try:
        results = client.batch([
            {"op": "start", "activityId": new_id, "taskName": "batched", "state": "processing"},
            {"op": "update", "activityId": new_id, "progress": 0.5},
            {"op": "update", "activityId": new_id, "progress": 7},
            {"op": "end", "activityId": new_id},
        ])
    except DispatchError as e:
        if e.status in (404, 405):
            pytest.skip(f"this server has no POST /v1/changes yet (answered {e.status} {e.code})")
        raise
    assert [r.status for r in results] == [201, 200, 400, 200]
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[1].snapshot and results[1].snapshot["seq"] == 2
    assert results[2].error and results[2].error.code != "unknown"
    assert results[3].snapshot and results[3].snapshot["state"] == "completed"
    assert client.get(new_id)["seq"] == 3


# -- watching (§4) ------------------------------------------------------------------------------


def _publish_in_background(client: Client, activity_id: str, steps: int) -> threading.Thread:
    def run() -> None:
        for i in range(1, steps + 1):
            client.update(activity_id, progress=i / (steps + 1), status=f"step {i}")
        client.end(activity_id, state="error", error="boom")
    t = threading.Thread(target=run)
    t.start()
    return t


def test_watch_follows_to_the_final_event(client: Client, new_id: str) -> None:
    client.start("watched", activity_id=new_id, state="processing")
    events = client.watch(new_id)
    first = next(events)
    assert (first.seq, first.event) == (1, "processing")
    t = _publish_in_background(client, new_id, 3)
    rest = list(events)
    t.join()
    assert [e.seq for e in rest] == [2, 3, 4, 5]
    assert rest[-1].event == "error" and rest[-1].final, "the failed job's `error` event ends the iterator"


def test_watch_resumes_after_a_dropped_connection_with_last_event_id(proxy, server, new_id: str) -> None:
    c = Client(proxy.url, server[1], retry_for=10)
    c.start("dropped", activity_id=new_id, state="processing")
    for i in range(4):
        c.update(new_id, progress=i / 10)
    proxy.seen.clear()
    proxy.script[:] = ["cut-after:2", "drop"]  # two events, then cut; one failed reconnect
    got = []
    events = c.watch(new_id, last_event_id=1, reconnect_delay=0.05)
    for e in events:
        got.append(e.seq)
        if e.seq == 5:
            c.end(new_id)
    assert got == [2, 3, 4, 5, 6], "consecutive across the drop: nothing lost, nothing twice"
    streams = [s for s in proxy.seen if s.method == "GET"]
    assert [s.headers.get("last-event-id") for s in streams] == ["1", "3", "3"]


def test_watch_unknown_id_stops_on_not_found(client: Client) -> None:
    assert [(e.event, e.seq) for e in client.watch("py-no-such-job")] == [("not_found", 0)]


def test_watch_of_a_finished_activity(client: Client) -> None:
    with client.activity("short") as job:
        job.progress(0.5)
    assert [e.event for e in client.watch(job.id)] == ["completed"], "only the final event"
    assert list(client.watch(job.id, last_event_id=3)) == [], "204: nothing after the final seq"
    assert [e.seq for e in client.watch(job.id, last_event_id=1)] == [2, 3], "the history after it"


def test_event_final() -> None:
    assert Event(0, "not_found", {"activityId": "x"}).final
    assert Event(3, "cancel_requested", {"state": "processing"}).final is False
    assert Event(3, "error", {"state": "error"}).final
