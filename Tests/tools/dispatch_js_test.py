"""web/dispatch.js in a real browser: headless Chromium driven by Selenium, against a live
dispatchd (BrowserToolsTests.testDispatchModuleInChromium runs it):

    dispatch_js_test.py BASE_URL ADMIN_KEY CONTROL_DIR

The page is the Activities view (same origin, signed in: the session cookie authenticates the
module's streams); the module is imported into it with import('/dispatch.js'). A server
restart is asked of the harness through CONTROL_DIR (`restart`, answered by `restarted`).
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

BASE, KEY, CONTROL = sys.argv[1:4]
passed = 0


def check(name, ok, detail=""):
    global passed
    if not ok:
        print(f"FAIL {name} {detail}", flush=True)
        try:
            print("T:", json.dumps(driver.execute_script("return window.T"))[:4000])
        except Exception as e:
            print("T: (unreadable)", e)
        print(f"dispatch.js: {passed} passed, 1 failed")
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
    start = time.monotonic()
    while True:
        try:
            v = predicate()
        except Exception:
            v = None
        if v:
            return v
        if time.monotonic() - start > timeout:
            check(what, False, f"(not within {timeout}s)")
        time.sleep(0.05)


def js(script, *args):
    return driver.execute_script(script, *args)


def status_requests(aid):
    """How many status stream requests for `aid` the page made so far (Chromium's network log)."""
    for entry in driver.get_log("performance"):
        m = json.loads(entry["message"])["message"]
        if m.get("method") == "Network.requestWillBeSent":
            urls.append(m["params"]["request"]["url"])
    return sum(1 for u in urls if f"/v1/activities/{aid}/status" in u)


options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000", "--disable-gpu"]:
    options.add_argument(arg)
options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
driver.set_script_timeout(30)
urls = []

# Sign in through the page (the cookie is what authenticates the module's streams), then load
# the module into it; every scenario records into window.T.
driver.get(BASE + "/")
wait("the sign-in form", lambda: driver.find_element(By.ID, "login").is_displayed(), 10)
driver.find_element(By.ID, "key").send_keys(KEY)
driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
wait("the page is live", lambda: driver.find_element(By.ID, "conn").text == "Live", 30)
ok = driver.execute_async_script("""
    const done = arguments[arguments.length - 1];
    import('/dispatch.js').then((m) => { window.M = m; window.T = {}; done(true); }, (e) => done(String(e)));
""")
check("import('/dispatch.js') under the page's policy", ok is True, str(ok))

# 1. An unknown id: one request, onEnd('not_found'), and no reconnect every 3 s.
js("""T.typo = {events: [], ends: []};
      M.watchActivity('no-such-job', {onEvent: (n) => T.typo.events.push(n), onEnd: (r) => T.typo.ends.push(r)});""")
wait("unknown id ends with not_found", lambda: js("return T.typo.ends.length") == 1, 10)
check("unknown id: onEnd('not_found') once, no event", js("return T.typo") == {"events": [], "ends": ["not_found"]})
time.sleep(4)  # longer than the stream's retry: 3 s; what is checked is that nothing happens
check("unknown id: no reconnect after not_found", status_requests("no-such-job") == 1, str(status_requests("no-such-job")))
check("unknown id: onEnd was not called again", js("return T.typo.ends.length") == 1)

# 2. A job followed to its failure: the `error` event is the job's, not the connection's.
api("POST", "/v1/activities/start", {"activityId": "js-fail", "taskName": "Fails", "state": "processing"})
js("""T.fail = {events: [], ends: []};
      M.watchActivity('js-fail', {onEvent: (n, s, seq) => T.fail.events.push([n, seq, s.state]),
                                  onEnd: (r, s) => T.fail.ends.push([r, s && s.state])});""")
wait("the first event", lambda: js("return T.fail.events.length") == 1, 10)
api("POST", "/v1/activities/js-fail/update", {"progress": 0.5})
api("POST", "/v1/activities/js-fail/end", {"state": "error", "error": "disk full"})
wait("the final event", lambda: js("return T.fail.ends.length") == 1, 10)
check("a failed job: every event once, in order", js("return T.fail.events") ==
      [["processing", 1, "processing"], ["processing", 2, "processing"], ["error", 3, "error"]], json.dumps(js("return T.fail.events")))
check("a failed job: onEnd('final') with the error snapshot", js("return T.fail.ends") == [["final", "error"]])
time.sleep(4)
check("a final event closes the stream (no reconnect)", status_requests("js-fail") == 1, str(status_requests("js-fail")))

# 3. Watching a job that had ended, resuming after its final seq: the server answers 204, the
#    module asks the database and ends with the final snapshot, without repeating events.
js("""T.late = {events: [], ends: []};
      M.watchActivity('js-fail', {lastEventId: 3, onEvent: (n, s, seq) => T.late.events.push(seq),
                                  onEnd: (r, s) => T.late.ends.push([r, s && s.state])});""")
wait("a resume past the end ends", lambda: js("return T.late.ends.length") == 1, 10)
check("204: onEnd('final'), no event repeated", js("return T.late") == {"events": [], "ends": [["final", "error"]]}, json.dumps(js("return T.late")))

# 4. A feed that resumes from a position the server never issued (a database restored from a
#    backup): `reset`, the store starts over, what the server no longer has is removed at `synced`.
api("POST", "/v1/activities/start", {"activityId": "js-live", "taskName": "Live one", "state": "processing", "machine": "m1"})
js("""T.reset = {changes: []};
      const f = T.resetFeed = new M.ActivityFeed({position: 999999999999, autoStart: false});
      f.put({activityId: 'js-ghost', taskName: 'gone', state: 'processing', seq: 1}, {archived: false});
      f.put({activityId: 'js-archived', taskName: 'old', state: 'completed', seq: 9});
      f.subscribe((c) => T.reset.changes.push(c.type === 'snapshot' ? 'snapshot:' + c.snapshot.activityId : c.type === 'removed' ? 'removed:' + c.ids : c.type));
      f.start();""")
wait("the reset feed synced", lambda: js("return T.resetFeed.synced"), 15)
changes = js("return T.reset.changes.filter(c => c !== 'connection')")
check("reset: the stream said reset, then synced once", changes[0] == "reset" and changes.count("synced") == 1 and changes[-1] == "synced", str(changes))
check("reset: the ghost is removed at synced, archived snapshots stay",
      "removed:js-ghost" in changes and js("return [T.resetFeed.has('js-ghost'), T.resetFeed.has('js-archived'), T.resetFeed.get('js-live').state]")
      == [False, True, "processing"], str(changes))
position = js("return T.resetFeed.position")
check("reset: the position is the server's again", position is not None and int(position) < 999999999999, str(position))

# 5. Filters: the server's machine filter.
js("""T.m2 = new M.ActivityFeed({machine: 'm2'});""")
api("POST", "/v1/activities/start", {"activityId": "js-m2", "taskName": "On m2", "machine": "m2"})
wait("the filtered feed synced and has its job", lambda: js("return T.m2.synced && T.m2.has('js-m2')"), 15)
check("filters: only the machine's jobs", js("return T.m2.list().map(a => a.machine)") and
      set(js("return T.m2.list().map(a => a.machine)")) == {"m2"}, str(js("return T.m2.list().map(a => a.activityId)")))

# 6. A job that ends while nobody listens: unsubscribed views come back to the final state.
js("""T.quiet = {n: 0}; T.feed = new M.ActivityFeed();
      T.unsub = T.feed.subscribe(() => T.quiet.n++);""")
wait("the feed synced", lambda: js("return T.feed.synced"), 15)
api("POST", "/v1/activities/start", {"activityId": "js-quiet", "taskName": "Ends unseen", "state": "processing"})
wait("the feed has the new job", lambda: js("return T.feed.has('js-quiet')"), 10)
js("T.unsub(); T.quiet.before = T.quiet.n;")
api("POST", "/v1/activities/js-quiet/end", {"status": "done while nobody looked"})
wait("the store has the end", lambda: js("return T.feed.get('js-quiet').state") == "completed", 10)
check("an unsubscribed listener hears nothing, the store still follows", js("return T.quiet.n === T.quiet.before"))

# 6b. The same in the Activities view: a job ends while the list is filtered so that no row
#     shows it; cleared, the list shows it finished, and its history has the end.
api("POST", "/v1/activities/start", {"activityId": "js-unseen", "taskName": "Unseen end", "state": "processing"})
wait("the view shows the job", lambda: driver.find_elements(By.CSS_SELECTOR, '.row[data-id="js-unseen"][data-section="active"]:not([hidden])'), 10)
driver.get(BASE + "/#/?q=nothing-matches-this")
wait("the filter hides it", lambda: not driver.find_elements(By.CSS_SELECTOR, '.row[data-id="js-unseen"]:not([hidden])'), 10)
api("POST", "/v1/activities/js-unseen/end", {"status": "ended while hidden"})
wait("the page's store has the end", lambda: js("return window.dispatchView.activities.get('js-unseen').state") == "completed", 10)
driver.get(BASE + "/#/")
wait("the list shows it finished", lambda: driver.find_elements(By.CSS_SELECTOR, '.row[data-id="js-unseen"][data-section="finished"]:not([hidden])'), 10)
check("a job that ended unseen shows finished once the filter is cleared", True)
driver.get(BASE + "/#/activities/js-unseen")
wait("its history has the end", lambda: "completed" in driver.find_element(By.ID, "history").text.lower(), 10)
check("its history has the final event", True)
driver.get(BASE + "/#/")

# 7. A server restart mid-stream: the watch and the feed resume by id and position; nothing is
#    lost or repeated.
api("POST", "/v1/activities/start", {"activityId": "js-restart", "taskName": "Across a restart", "state": "processing"})
wait("the feed has the job", lambda: js("return T.feed.has('js-restart')"), 10)
js("""T.rw = {seqs: [], ends: [], changes: []};
      M.watchActivity('js-restart', {onEvent: (n, s, seq) => T.rw.seqs.push(seq), onEnd: (r) => T.rw.ends.push(r)});
      T.feed.subscribe((c) => { if (c.type === 'snapshot' && c.snapshot.activityId === 'js-restart') T.rw.changes.push(c.snapshot.seq);
                                if (c.type === 'synced') T.rw.synced = (T.rw.synced || 0) + 1;
                                if (c.type === 'reset') T.rw.reset = true; });""")
wait("the watch has the first event", lambda: js("return T.rw.seqs.length") == 1, 10)
api("POST", "/v1/activities/js-restart/update", {"progress": 0.3})
wait("the feed has seq 2", lambda: js("return T.feed.get('js-restart').seq") == 2, 10)
open(os.path.join(CONTROL, "restart"), "w").close()
wait("the server restarted", lambda: os.path.exists(os.path.join(CONTROL, "restarted")), 60)
api("POST", "/v1/activities/js-restart/update", {"progress": 0.6})
api("POST", "/v1/activities/js-restart/end", {})
wait("the watch ended after the restart", lambda: js("return T.rw.ends.length") == 1, 30)
check("restart: the watch saw every seq once, in order", js("return T.rw") and js("return T.rw.seqs") == [1, 2, 3, 4], str(js("return T.rw.seqs")))
check("restart: the watch ended final", js("return T.rw.ends") == ["final"])
wait("the feed has the end", lambda: js("return T.feed.get('js-restart').state") == "completed", 30)
check("restart: the feed took every change after seq 1 once", js("return T.rw.changes") == [2, 3, 4], str(js("return T.rw.changes")))
check("restart: the feed resumed by position (synced again, no reset)", js("return T.rw.synced") == 1 and not js("return T.rw.reset"),
      str(js("return [T.rw.synced, T.rw.reset]")))
check("restart: the store keeps one snapshot per job", js("return T.feed.list().filter(a => a.activityId === 'js-restart').length") == 1)

print(f"dispatch.js: {passed} passed, 0 failed")
driver.quit()
