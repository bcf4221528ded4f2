"""The Activities view's rough edges, at a phone's 390x844 and a desktop's 1440x900, in headless
Chromium against a live dispatchd (BrowserToolsTests.testActivitiesViewEdgesInChromium):

    view_edges_test.py BASE_URL ADMIN_KEY SHOTS_DIR

No element overflows its row (long names, long machine tags, a stalled retrying job with a
cancel request), the ETA is never cut, a queued job is never flagged stalled, an unknown or
invalid id gets a clean panel, the Dynamic Island keeps its title's words and draws a failed
job's bar red, the chart keeps its labels inside and draws a single point, and a visitor who
never signed in sees no 401 in the console. Screenshots of each size go to SHOTS_DIR.
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

BASE, KEY, SHOTS = sys.argv[1:4]
APNS = len(sys.argv) > 4 and sys.argv[4] == "apns"  # the server pushes to phones (a fake APNs)
passed = 0


def check(name, ok, detail=""):
    global passed
    if not ok:
        print(f"FAIL {name} {detail}", flush=True)
        print(f"edges: {passed} passed, 1 failed")
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


def wait(what, predicate, timeout=10):
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


options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1440,900", "--disable-gpu",
            "--force-color-profile=srgb", "--hide-scrollbars"]:
    options.add_argument(arg)
options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
driver.set_script_timeout(30)


def js(script, *args):
    return driver.execute_script(script, *args)


def size(w, h):
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 500})


# A visitor who never signed in: the form, no request for a session, no 401 in the console.
driver.get(BASE + "/")
wait("the sign-in form", lambda: driver.find_element(By.ID, "login").is_displayed())
time.sleep(0.5)  # what is checked is that nothing more happens
asked = [m for m in (json.loads(e["message"])["message"] for e in driver.get_log("performance"))
         if m.get("method") == "Network.requestWillBeSent" and "/v1/session" in m["params"]["request"]["url"]]
console = [e["message"] for e in driver.get_log("browser")]
check("signed-out visitor: no session request, no 401 in the console", not asked and not any("401" in c for c in console), str(console))

# The jobs with every rough edge at once.
host = "build-farm-eu-west-1-rack-42-node-0007.internal.example.org"
api("POST", "/v1/activities/start", {"activityId": "busy", "taskName": "Transcode the director's cut into every format the store wants, twice",
                                     "machine": host, "systemImage": "film", "state": "processing", "initialProgress": 0.3,
                                     "status": "Encoding pass 2 of 2 at 1.7x realtime with the slow preset and two reference frames"})
for s in ["retrying", "processing", "retrying", "processing"]:
    api("POST", "/v1/activities/busy/update", {"state": s})
api("POST", "/v1/activities/busy/cancel", {"reason": "wrong preset"})
api("POST", "/v1/activities/start", {"activityId": "waiting", "taskName": "Queued behind the others", "machine": "xerxes"})
api("POST", "/v1/activities/start", {"activityId": "steady", "taskName": "Steady download", "machine": host, "state": "processing",
                                     "initialProgress": 0.05})
api("POST", "/v1/activities/start", {"activityId": "one", "taskName": "One progress report", "state": "processing", "initialProgress": 0.4})
api("POST", "/v1/activities/start", {"activityId": "failed", "taskName": "Reticulating splines for the interstellar release",
                                     "machine": "shodan", "state": "processing", "initialProgress": 0.2})
api("POST", "/v1/activities/failed/update", {"progress": 0.6})
api("POST", "/v1/activities/failed/end", {"state": "error", "error": "disk full"})

driver.get(BASE + "/")
driver.find_element(By.ID, "key").send_keys(KEY)
driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
wait("live after sign-in", lambda: driver.find_element(By.ID, "conn").text == "Live", 30)
for i in range(1, 6):  # steady, slow progress: an ETA of minutes, shown for the whole test
    api("POST", "/v1/activities/steady/update", {"progress": 0.05 + i * 0.002})
    time.sleep(1.0)  # even steps (the ETA wants rates within a factor of 3), even on a busy machine

OVERFLOW = """
  const out = [];
  for (const row of document.querySelectorAll('.row:not([hidden])')) {
    const box = row.querySelector('.open').getBoundingClientRect();
    if (box.bottom < 0 || box.top > innerHeight) continue;
    for (const el of row.querySelectorAll('.open *')) {
      const b = el.getBoundingClientRect();
      if (!b.width || !b.height || getComputedStyle(el).display === 'none') continue;
      // What shows of it: clipped by every box between it and the row that hides its overflow
      // (the indeterminate bar's sliding fill, an ellipsised name).
      const r = { left: b.left, right: b.right, top: b.top, bottom: b.bottom };
      for (let p = el.parentElement; p && !p.classList.contains('open'); p = p.parentElement) {
        if (getComputedStyle(p).overflow === 'visible') continue;
        const c = p.getBoundingClientRect();
        r.left = Math.max(r.left, c.left); r.right = Math.min(r.right, c.right);
        r.top = Math.max(r.top, c.top); r.bottom = Math.min(r.bottom, c.bottom);
      }
      if (r.right <= r.left || r.bottom <= r.top) continue;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        out.push(row.dataset.id + ' ' + (el.className.baseVal ?? el.className) + ' ' + JSON.stringify([r.left, r.right, r.top, r.bottom]) + ' in ' + JSON.stringify([box.left, box.right, box.top, box.bottom]));
    }
  }
  return out;"""

for w, h, name in [(390, 844, "phone"), (1440, 900, "desktop")]:
    size(w, h)
    driver.get(BASE + "/#/?stall=1")  # `busy` last changed seconds ago: stalled
    wait(f"{name}: rows drawn", lambda: driver.find_elements(By.CSS_SELECTOR, '.row[data-id="busy"]:not([hidden]).stalled'))
    wait(f"{name}: the ETA", lambda: js("return document.querySelector('.row[data-id=steady]:not([hidden]) .eta').textContent").startswith("ETA"), 5)
    wide = js("return [document.documentElement.scrollWidth, innerWidth, [...document.querySelectorAll('header *, #filters *')]"
              ".filter(e => e.getBoundingClientRect().right > innerWidth + 1).map(e => e.id || e.className)]")
    check(f"{name}: nothing is wider than the screen", wide[0] <= wide[1] and not wide[2], str(wide))
    badge = js("const b = document.querySelector('.row[data-id=steady]:not([hidden]) .badge'); return b.scrollWidth <= b.clientWidth")
    check(f"{name}: a long machine name gives way before the state badge", badge)
    bad = js(OVERFLOW)
    check(f"{name}: no element overflows its row", not bad, "\n".join(bad[:10]))
    stall = js("""const r = document.querySelector('.row[data-id=busy]:not([hidden])');
                  const s = r.querySelector('.stall').getBoundingClientRect(), m = r.querySelector('.meta').getBoundingClientRect();
                  return [r.querySelector('.stall').textContent, s.width > 0 && s.left >= m.left && s.right <= m.right + 0.5]""")
    check(f"{name}: the stalled hint is whole: {stall[0]}", stall[0].startswith("stalled ") and stall[1], str(stall))
    eta = js("""const t = document.querySelector('.row[data-id=steady]:not([hidden]) .time'), e = t.querySelector('.eta');
                return [e.textContent, e.getBoundingClientRect().right <= t.getBoundingClientRect().right + 0.5]""")
    check(f"{name}: the ETA is never cut: {eta[0]}", eta[1], str(eta))
    check(f"{name}: a queued job is not flagged stalled",
          "stalled" not in driver.find_element(By.CSS_SELECTOR, '.row[data-id="waiting"]:not([hidden])').get_attribute("class"))
    driver.save_screenshot(os.path.join(SHOTS, f"edges-list-{name}.png"))

    # A failed job's detail: the phone's view and the chart.
    driver.get(BASE + "/#/activities/failed")
    wait(f"{name}: the failed job's detail", lambda: driver.find_element(By.ID, "detail-title").text.startswith("Reticulating"))
    if APNS:
        wait(f"{name}: the phone view", lambda: driver.find_elements(By.CSS_SELECTOR, "#phone .island-expanded .pfill"))
        colour = js("return getComputedStyle(document.querySelector('#phone .island-expanded .pfill')).backgroundColor")
        check(f"{name}: the Dynamic Island draws a failed job's bar red", colour == "rgb(255, 69, 58)", colour)
        broken = js("""const el = document.querySelector('#phone .ex-title'), text = el.firstChild, out = [];
                       let at = 0;
                       for (const word of text.textContent.split(' ')) {
                         const r = document.createRange(); r.setStart(text, at); r.setEnd(text, at + word.length);
                         if (r.getClientRects().length > 1) out.push(word);
                         at += word.length + 1;
                       }
                       return out""")
        check(f"{name}: the Dynamic Island's title breaks between words only", not broken,
              str(broken) + js("const e = document.querySelector('#phone .ex-title'); return JSON.stringify([e.getBoundingClientRect().width, getComputedStyle(e).display, e.textContent])"))
    wait(f"{name}: the chart", lambda: driver.find_elements(By.CSS_SELECTOR, "#chart .mark-label"))
    outside = js("""const svg = document.querySelector('#chart svg'), W = svg.viewBox.baseVal.width;
                    return [...svg.querySelectorAll('.mark-label, .axis')].map(t => [t.textContent, t.getBBox()])
                      .filter(([, b]) => b.x < 0 || b.x + b.width > W).map(([t]) => t)""")
    check(f"{name}: every chart label inside the chart", not outside, str(outside))
    driver.find_element(By.ID, "detail").screenshot(os.path.join(SHOTS, f"edges-failed-{name}.png"))
    if APNS:
        check(f"{name}: with APNs the phone panels show, without the note",
              driver.find_element(By.ID, "phone").is_displayed() and not driver.find_element(By.ID, "no-pushes").is_displayed())
    else:
        wait(f"{name}: without APNs, a note", lambda: driver.find_element(By.ID, "no-pushes").is_displayed())
        check(f"{name}: without APNs the phone panels are hidden",
              not any(e.is_displayed() for e in driver.find_elements(By.CSS_SELECTOR, "#detail .push-only")))

    driver.get(BASE + "/#/activities/one")
    wait(f"{name}: a single progress point is drawn", lambda: driver.find_elements(By.CSS_SELECTOR, "#chart circle.dot"))
    check(f"{name}: a single progress point is drawn", True)

    # An unknown id after another job: nothing of that job stays; an invalid id says so.
    driver.get(BASE + "/#/activities/no-such-job")
    wait(f"{name}: unknown id", lambda: driver.find_element(By.ID, "detail-title").text == "No such job")
    panel = js("""const d = document.getElementById('detail');
                  return [d.classList.contains('missing'), document.getElementById('detail-facts').textContent,
                          [...d.querySelectorAll('.job-only')].filter(e => e.offsetParent !== null).length,
                          document.getElementById('detail-sub').textContent]""")
    check(f"{name}: unknown id: a clean panel saying so", panel[0] and panel[1] == "" and panel[2] == 0 and "no-such-job" in panel[3], str(panel))
    driver.find_element(By.ID, "detail").screenshot(os.path.join(SHOTS, f"edges-unknown-{name}.png"))
    driver.get(BASE + "/#/activities/" + "not%20an%20id!")
    wait(f"{name}: invalid id", lambda: driver.find_element(By.ID, "detail-title").text == "Not a job id")
    check(f"{name}: an invalid id says it cannot be one", "cannot be a job id" in driver.find_element(By.ID, "detail-sub").text)
    driver.get(BASE + "/#/")

print(f"screenshots in {SHOTS}")
print(f"edges: {passed} passed, 0 failed")
driver.quit()
