"""The Activities view in a real browser: headless Chromium driven by Selenium.

Run by BrowserToolsTests (XCTest) against a live dispatchd:
    browser_test.py BASE_URL ADMIN_KEY SCREENSHOT_PATH CONTROL_DIR
A server restart is asked of the harness through CONTROL_DIR: this script writes
`restart`, the harness restarts dispatchd and writes `restarted`.
Prints one line per check and exits non-zero on the first failure.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

BASE, KEY, SHOT, CONTROL = sys.argv[1:5]
passed = 0


def check(name, ok, detail=""):
    global passed
    if not ok:
        print(f"FAIL {name} {detail}", flush=True)
        print(f"browser: {passed} passed, 1 failed")
        sys.exit(1)
    passed += 1
    print(f"ok   {name}", flush=True)


def api(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def wait(what, predicate, timeout):
    """Polls `predicate` until it is truthy; returns (value, seconds taken) or fails."""
    start = time.monotonic()
    while True:
        try:
            v = predicate()
        except Exception:  # an element replaced mid-read: try again
            v = None
        if v:
            return v, time.monotonic() - start
        if time.monotonic() - start > timeout:
            check(what, False, f"(not within {timeout}s)")
        time.sleep(0.02)


options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900", "--disable-gpu"]:
    options.add_argument(arg)
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
driver.set_script_timeout(30)


def row(aid):
    return driver.find_element(By.CSS_SELECTOR, f'li.row[data-id="{aid}"]')


def in_list(aid, list_id):
    r = driver.find_elements(By.CSS_SELECTOR, f'#{list_id} li.row[data-id="{aid}"]')
    return r[0] if r else None


def part(aid, cls):
    return row(aid).find_element(By.CSS_SELECTOR, "." + cls).text


try:
    api("POST", "/v1/activities/start", {"activityId": "iso", "taskName": "Debian 13 Trixie ISO", "machine": "shodan",
                                         "systemImage": "arrow.down.circle.fill", "state": "processing", "initialProgress": 0.42,
                                         "status": "Downloading at 18.4 MB/s"})
    api("POST", "/v1/activities/start", {"activityId": "train", "taskName": "Training run 7", "machine": "xerxes", "systemImage": "cpu"})
    api("POST", "/v1/activities/start", {"activityId": "old", "taskName": "Nightly backup", "machine": "xerxes"})
    api("POST", "/v1/activities/old/end", {"status": "Backed up 12 GB"})

    driver.get(BASE + "/")
    wait("the page loads", lambda: driver.find_elements(By.ID, "login"), 10)
    check("the page asks for a key", driver.find_element(By.ID, "login").is_displayed())
    driver.find_element(By.ID, "key").send_keys(KEY)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait("rows appear", lambda: in_list("iso", "active") and in_list("train", "active") and in_list("old", "finished"), 10)
    wait("connected", lambda: driver.find_element(By.ID, "conn").text == "Live", 10)
    check("badge per state", part("iso", "badge").lower() == "processing" and part("train", "badge").lower() == "queued")
    check("progress bar and percent", row("iso").find_element(By.CSS_SELECTOR, ".bar").get_attribute("aria-valuenow") == "42"
          and part("iso", "pct") == "42%")
    check("machine tag and status line", part("iso", "machine") == "shodan" and "18.4 MB/s" in part("iso", "status"))
    check("finished shows the end state and duration", part("old", "badge").lower() == "completed" and part("old", "time").startswith("took"))

    api("POST", "/v1/activities/iso/update", {"progress": 0.75, "status": "Downloading at 20.1 MB/s"})
    _, t = wait("update reaches the bar", lambda: part("iso", "pct") == "75%" and "20.1" in part("iso", "status"), 1.0)
    check(f"bar updated in {t:.2f}s", t < 1.0)
    api("POST", "/v1/activities/train/update", {"state": "processing"})
    api("POST", "/v1/activities/train/update", {"state": "retrying", "status": "GPU lost"})
    _, t = wait("retrying badge and attempt", lambda: part("train", "badge").lower() == "retrying" and part("train", "attempt") == "attempt 2", 1.0)
    check(f"badge and attempt updated in {t:.2f}s", t < 1.0)
    api("POST", "/v1/activities/train/update", {"state": "processing"})
    api("POST", "/v1/activities/train/update", {"state": "idle", "status": "waiting for a GPU"})
    wait("idle badge", lambda: part("train", "badge").lower() == "idle", 1.0)
    api("POST", "/v1/activities/iso/end", {"status": "Done"})
    _, t = wait("an ended job moves to the finished list", lambda: in_list("iso", "finished"), 1.0)
    check(f"moved to finished in {t:.2f}s", part("iso", "badge").lower() == "completed" and part("iso", "pct") == "100%")
    api("POST", "/v1/activities/start", {"activityId": "enc", "taskName": "Transcode trailer", "machine": "xerxes", "systemImage": "film",
                                         "state": "processing", "initialProgress": 0.1})
    wait("a new job appears", lambda: in_list("enc", "active"), 1.0)
    api("POST", "/v1/activities/start", {"activityId": "refused", "taskName": "Deploy to prod"})
    api("POST", "/v1/activities/refused/end", {"state": "rejected", "error": "freeze in effect"})
    wait("rejected", lambda: in_list("refused", "finished") and part("refused", "badge").lower() == "rejected", 1.0)

    # Details, history and the cancel button (remote cancel may not exist on this server yet).
    row("train").find_element(By.CSS_SELECTOR, "button.open").click()
    wait("detail panel with history", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#history tr")) >= 5, 5)
    cancel = driver.find_element(By.ID, "cancel")
    check("cancel button for a live job", cancel.is_displayed())
    cancel.click()
    # The page says "Asking the job to stop…" while the request is out; wait for the answer.
    answered = lambda: (lambda t: t if t and not t.endswith("…") else None)(driver.find_element(By.ID, "cancel-msg").text)
    msg, _ = wait("cancel answered", answered, 5)
    check("cancel answer shown", any(w in msg for w in ["requested", "may not", "cannot", "finished"]), msg)
    driver.find_element(By.ID, "detail-close").click()

    # Filters.
    Select(driver.find_element(By.ID, "f-machine")).select_by_value("xerxes")
    wait("machine filter", lambda: not row("iso").is_displayed() and row("train").is_displayed(), 1.0)
    Select(driver.find_element(By.ID, "f-state")).select_by_value("active")
    wait("state filter", lambda: not driver.find_element(By.ID, "finished-section").is_displayed(), 1.0)
    Select(driver.find_element(By.ID, "f-machine")).select_by_value("")
    Select(driver.find_element(By.ID, "f-state")).select_by_value("")

    driver.save_screenshot(SHOT)
    check("screenshot saved", os.path.getsize(SHOT) > 10_000)

    # A server restart: a banner while it is down, then the page resumes with no duplicate rows.
    open(os.path.join(CONTROL, "restart"), "w").close()
    seen_banner = False
    def banner_or_log():
        global seen_banner
        seen_banner = seen_banner or driver.find_element(By.ID, "banner").is_displayed()
        return seen_banner
    try:
        wait("disconnected banner", banner_or_log, 10)
    except SystemExit:
        print("connection log:", driver.execute_script("return JSON.stringify(window.dispatchConnectionLog)"))
        raise
    check("a banner while disconnected", seen_banner)
    wait("server restarted", lambda: os.path.exists(os.path.join(CONTROL, "restarted")), 30)
    api("POST", "/v1/activities/train/update", {"state": "processing", "progress": 0.9, "status": "after the restart"})
    api("POST", "/v1/activities/enc/end", {"state": "error", "error": "disk full"})
    wait("changes after the restart arrive", lambda: "after the restart" in part("train", "status") and in_list("enc", "finished"), 15)
    wait("banner gone", lambda: not driver.find_element(By.ID, "banner").is_displayed(), 5)
    ids = [li.get_attribute("data-id") for li in driver.find_elements(By.CSS_SELECTOR, "li.row")]
    check("no duplicate rows after the restart", len(ids) == len(set(ids)) == 5, str(ids))
    check("failed job shows its error", part("enc", "badge").lower() == "error" and "disk full" in part("enc", "status"))

    # Contract §9: an EventSource on a mistyped id gets not_found (id 0), reconnects once, gets 204, stops.
    result = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const es = new EventSource('/v1/activities/no-such-job/status?access_token=' + encodeURIComponent(arguments[0]));
        let notFound = 0, errors = 0;
        es.addEventListener('not_found', (e) => { notFound++; });
        es.onerror = () => { errors++; };
        setTimeout(() => done({notFound, errors, state: es.readyState}), 8000);
    """, KEY)
    check("mistyped status stream stops after one reconnect", result["notFound"] == 1 and result["state"] == 2, str(result))

    # Contract §9: a job that fails sends the event named `error`, which EventSource also uses
    # for connection errors. The browser example in docs/api.md, run as printed, must show the
    # job's snapshots (not a connection error) and close on the final event.
    docs = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../docs/api.md")).read()
    example = docs.split("In a browser (the event named `error`", 1)[1].split("```js", 1)[1].split("```", 1)[0]
    api("POST", "/v1/activities/start", {"activityId": "doomed", "taskName": "Doomed job", "state": "processing"})
    driver.execute_script("""
        window.shown = []; window.connectionErrors = 0;
        const show = (snapshot) => window.shown.push(snapshot.state);
        const id = 'doomed', key = arguments[0];
        """ + example + """
        window.exampleSource = es;
        // A source left open after the final event would see the end of the stream as a
        // connection error (and reconnect): count those.
        es.addEventListener('error', (e) => { if (!(e instanceof MessageEvent)) window.connectionErrors++; });
    """, KEY)
    wait("the example shows the live snapshot", lambda: driver.execute_script("return window.shown.length") >= 1, 5)
    api("POST", "/v1/activities/doomed/end", {"state": "error", "error": "out of memory"})
    shown, _ = wait("the example shows the failure", lambda: (lambda v: v if v and v[-1] == "error" else None)(
        driver.execute_script("return window.shown")), 5)
    time.sleep(4)  # longer than the stream's retry: a source left open would reconnect and show it again
    result = driver.execute_script(
        "return {shown: window.shown, state: window.exampleSource.readyState, connectionErrors: window.connectionErrors}")
    check("the docs' EventSource example tells a failed job from a connection error and closes",
          result == {"shown": ["processing", "error"], "state": 2, "connectionErrors": 0}, str(result))

    # Many live activities: rows stay unique and current while 200 jobs update at once.
    for i in range(200):
        api("POST", "/v1/activities/start", {"activityId": f"bulk-{i}", "taskName": f"Bulk job {i}", "machine": "farm", "state": "processing"})
    for i in range(200):
        api("POST", f"/v1/activities/bulk-{i}/update", {"progress": 0.5})
    _, t = wait("200 more rows, all current", lambda: len(driver.find_elements(By.CSS_SELECTOR, '#active li.row[data-machine="farm"]')) == 200
                and driver.execute_script("return [...document.querySelectorAll('#active li[data-machine=farm] .pct')].every(e => e.textContent === '50%')"), 10)
    check(f"200 live rows rendered in {t:.2f}s after the last publish", True)
    print(f"browser: {passed} passed, 0 failed")
finally:
    driver.quit()
