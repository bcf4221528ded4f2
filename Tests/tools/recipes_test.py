"""Runs every recipe of docs/recipes.md against a live dispatchd (RecipesTests drives it).

usage: recipes_test.py BASE_URL ADMIN_KEY PAGE_PORT BIN_DIR REPO_ROOT

The recipes are the files in docs/recipes/, each also shown verbatim in docs/recipes.md (checked
first, so the page and what runs here cannot drift apart). Only what the real tools around them
provide is stood in for: GitHub's and GitLab's ${{ }} and CI variables, systemd's %N and the
variables it hands ExecStopPost, rTorrent's calls of its hook, and the job itself (`make test`).
Prints one line per check and "N passed, M failed".
"""
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import yaml

BASE, KEY, PAGE_PORT, BIN, ROOT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
RECIPES = os.path.join(ROOT, "docs", "recipes")
passed, failed = 0, 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {what}")
    else:
        failed += 1
        print(f"FAIL {what} {detail}")
    sys.stdout.flush()


def api(path):
    request = urllib.request.Request(BASE + path, headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError:
        return None


def statuses(aid):
    events = (api(f"/v1/activities/{aid}/events?after=0&limit=1000") or {}).get("events", [])
    return [e["data"].get("status") for e in events]


def recipe(name):
    with open(os.path.join(RECIPES, name)) as f:
        return f.read()


work = tempfile.mkdtemp(prefix="dispatch-recipes-")
# The job the CI recipes run: `make test`, stood in for by a script that prints progress.
fake_bin = os.path.join(work, "bin")
os.makedirs(fake_bin)
with open(os.path.join(fake_bin, "make"), "w") as f:
    f.write('#!/bin/sh\necho "test 1/2"; sleep 0.3; echo "test 2/2"; sleep 0.3; echo "all 12 tests passed"; sleep 0.5\n'
            'exit "${FAKE_MAKE_EXIT:-0}"\n')
os.chmod(os.path.join(fake_bin, "make"), 0o755)
ENV = dict(os.environ, PATH=f"{fake_bin}:{BIN}:/usr/bin:/bin", DISPATCH_URL=BASE, DISPATCH_TOKEN=KEY)

# 0. docs/recipes.md (or, for the recipes that use a client library, docs/clients.md) shows
#    every recipe file exactly.
blocks = {}
for page_name in ["recipes.md", "clients.md"]:
    with open(os.path.join(ROOT, "docs", page_name)) as f:
        blocks[page_name] = re.findall(r"^```[a-z]*\n(.*?)^```", f.read(), re.S | re.M)
for name in sorted(os.listdir(RECIPES)):
    shown = [p for p, b in blocks.items() if recipe(name) in b]
    check(f"{' or '.join(shown) or 'no page'} shows {name} verbatim", bool(shown))


def run_steps(scripts, env, shell_flags="-e"):
    """Runs each script in bash, in order; stops at the first failure. Returns the exit codes."""
    codes = []
    for script in scripts:
        r = subprocess.run(["/bin/bash", shell_flags, "-c", script], env=env, cwd=work, capture_output=True, text=True, timeout=120)
        codes.append(r.returncode)
        if r.returncode != 0:
            break
    return codes


# 1. GitHub Actions: the steps' shell, with ${{ }} filled in as GitHub would.
def github(job_status_when_ok, make_exit):
    workflow = yaml.safe_load(recipe("github-actions.yml"))
    run_id = str(uuid.uuid4().int % 10**10)
    values = {"github.run_id": run_id, "github.run_attempt": "1", "github.repository": "acme/app", "github.workflow": "build",
              "github.run_number": "7", "github.ref_name": "main"}
    steps = workflow["jobs"]["build"]["steps"]
    env = dict(ENV, FAKE_MAKE_EXIT=str(make_exit))
    failed_step = False
    for step in steps:
        if "run" not in step or (failed_step and step.get("if") != "always()"):
            continue
        status = "failure" if failed_step else job_status_when_ok
        script = re.sub(r"\$\{\{\s*([a-z_.]+)\s*\}\}", lambda m: dict(values, **{"job.status": status})[m.group(1)], step["run"])
        r = subprocess.run(["/bin/bash", "-e", "-c", script], env=env, cwd=work, capture_output=True, text=True, timeout=120)
        failed_step = failed_step or r.returncode != 0
    return f"gh-{run_id}-1"


job = github("success", 0)
check("github: the job's activity completed", (api(f"/v1/activities/{job}") or {}).get("state") == "completed", api(f"/v1/activities/{job}"))
check("github: the test step showed its last output line", "all 12 tests passed" in statuses(f"{job}-test"), statuses(f"{job}-test"))
job = github("success", 2)
check("github: a failed step ends the job in error", (api(f"/v1/activities/{job}") or {}).get("state") == "error", api(f"/v1/activities/{job}"))
check("github: the failed step's activity is in error", (api(f"/v1/activities/{job}-test") or {}).get("error") == "exit status 2")

# 2. GitLab CI: before_script and script in one shell, after_script with CI_JOB_STATUS.
def gitlab(make_exit):
    job = yaml.safe_load(recipe("gitlab-ci.yml"))["test"]
    job_id = str(uuid.uuid4().int % 10**9)
    env = dict(ENV, CI_JOB_ID=job_id, CI_PROJECT_PATH="acme/app", CI_JOB_NAME="test", CI_COMMIT_REF_NAME="main",
               FAKE_MAKE_EXIT=str(make_exit))
    codes = run_steps(["\n".join(job["before_script"] + job["script"])], env)
    env["CI_JOB_STATUS"] = "success" if codes == [0] else "failed"
    run_steps(["\n".join(job["after_script"])], env)
    return f"gl-{job_id}"


job = gitlab(0)
check("gitlab: the job's activity completed", (api(f"/v1/activities/{job}") or {}).get("state") == "completed", api(f"/v1/activities/{job}"))
check("gitlab: the tests' last line shown", "all 12 tests passed" in statuses(f"{job}-tests"))
job = gitlab(1)
check("gitlab: a failed job ends in error", (api(f"/v1/activities/{job}") or {}).get("error") == "job failed", api(f"/v1/activities/{job}"))

# 3. systemd: the unit verifies (in a scratch root holding what it names), and its
# ExecStartPre/ExecStopPost lines, run as systemd would, end the activity with the unit's result.
unit = recipe("backup.service")
if shutil.which("systemd-analyze"):
    root = os.path.join(work, "root")
    for d in ["etc/systemd/system", "etc/dispatch", "usr/local/bin", "usr/local/lib/dispatch", "bin"]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for target in ["sysinit.target", "basic.target", "shutdown.target"]:
        with open(os.path.join(root, "etc/systemd/system", target), "w") as f:
            f.write("[Unit]\nDescription=scratch\n")
    with open(os.path.join(root, "etc/systemd/system/backup.service"), "w") as f:
        f.write(unit)
    with open(os.path.join(root, "etc/dispatch/client.env"), "w") as f:
        f.write("DISPATCH_URL=http://127.0.0.1:8080\n")
    shutil.copy(os.path.join(RECIPES, "dispatch-unit"), os.path.join(root, "usr/local/lib/dispatch/dispatch-unit"))
    shutil.copy("/bin/true", os.path.join(root, "usr/local/bin/backup-job"))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "/etc/systemd/system/backup.service"],
                       capture_output=True, text=True, timeout=60)
    check("systemd: systemd-analyze verify accepts the unit, without a warning", r.returncode == 0 and r.stderr.strip() == "",
          r.stderr)
else:
    check("systemd: systemd-analyze is installed", False)


def exec_line(key):
    line = next(l for l in unit.splitlines() if l.startswith(key + "="))
    command = line.split("=", 1)[1].lstrip("-").replace("%N", "backup").split()
    command[0] = os.path.join(RECIPES, os.path.basename(command[0]))
    return command


for result, code, status, state in [("success", "exited", "0", "completed"), ("exit-code", "exited", "3", "error"),
                                    ("signal", "killed", "TERM", "cancelled"), ("signal", "killed", "KILL", "error"),
                                    ("timeout", "killed", "TERM", "error")]:
    invocation = uuid.uuid4().hex
    env = dict(ENV, INVOCATION_ID=invocation)
    start = subprocess.run(exec_line("ExecStartPre"), env=env, capture_output=True, text=True, timeout=60)
    env.update(SERVICE_RESULT=result, EXIT_CODE=code, EXIT_STATUS=status)
    end = subprocess.run(exec_line("ExecStopPost"), env=env, capture_output=True, text=True, timeout=60)
    a = api(f"/v1/activities/backup-{invocation}") or {}
    check(f"systemd: {result}/{code}/{status} ends the activity {state}",
          start.returncode == 0 and end.returncode == 0 and a.get("state") == state, f"{start.stderr} {end.stderr} {a}")

# 4. cron: the wrapper exits as the job did, and the activity shows its last line.
r = subprocess.run([os.path.join(RECIPES, "dispatch-cron"), "nightly-recipe", "/bin/sh", "-c", "echo copying files; exit 3"],
                   env=ENV, capture_output=True, text=True, timeout=120)
listing = (api("/v1/activities?limit=100") or {}).get("activities", [])
cron = [a for a in listing if a["activityId"].startswith("cron-nightly-recipe-")]
check("cron: the wrapper exits with the job's code", r.returncode == 3, r.stderr)
check("cron: --quiet keeps the notes out of cron's mail", r.stderr == "", r.stderr)
check("cron: the activity ended in error with the last line shown",
      len(cron) == 1 and cron[0]["state"] == "error" and "copying files" in statuses(cron[0]["activityId"]), cron)

# 5. rTorrent: the hook, called with what the rtorrent.rc lines pass.
rc = recipe("rtorrent.rc")
for event in ["event.download.inserted_new", "event.download.finished", "event.download.erased"]:
    check(f"rtorrent: {event} calls the hook", re.search(rf"^method\.set_key = {re.escape(event)}, \w+, \"execute\.nothrow\.bg = /usr/local/bin/dispatch-rtorrent, ", rc, re.M) is not None)
hook = os.path.join(RECIPES, "dispatch-rtorrent")
torrent = uuid.uuid4().hex[:40].upper()
runs = [subprocess.run([hook] + args, env=ENV, capture_output=True, text=True, timeout=60) for args in [
    ["start", torrent, "debian-13.iso"], ["progress", torrent, "debian-13.iso", str(512 << 20), str(1024 << 20)]]]
a = api(f"/v1/activities/rtorrent-{torrent}") or {}
check("rtorrent: start then progress: processing at 50%", all(r.returncode == 0 for r in runs) and a.get("progress") == 0.5
      and a.get("status") == "Downloading (512 of 1024 MiB)", f"{[r.stderr for r in runs]} {a}")
done = subprocess.run([hook, "progress", torrent, "debian-13.iso", "100", "100"], env=ENV, timeout=60)
finish = subprocess.run([hook, "finish", torrent, "debian-13.iso"], env=ENV, timeout=60)
erase = subprocess.run([hook, "erase", torrent, "debian-13.iso"], env=ENV, timeout=60)
a = api(f"/v1/activities/rtorrent-{torrent}") or {}
check("rtorrent: finish completes it; erase after that changes nothing",
      done.returncode == 0 and finish.returncode == 0 and erase.returncode == 0 and a.get("state") == "completed", a)
other = uuid.uuid4().hex[:40]
subprocess.run([hook, "start", other, "big.iso"], env=ENV, timeout=60)
subprocess.run([hook, "erase", other, "big.iso"], env=ENV, timeout=60)
check("rtorrent: erased before the end: cancelled", (api(f"/v1/activities/rtorrent-{other}") or {}).get("state") == "cancelled")

# 6. Python: the cron job with the Python client (clients/python, as `pip install` would give it).
PYENV = dict(ENV, PYTHONPATH=os.path.join(ROOT, "clients", "python", "src"), PYTHONDONTWRITEBYTECODE="1")
sys.path.insert(0, PYENV["PYTHONPATH"])
from dispatch_client import Client  # noqa: E402

d = Client(BASE, KEY, retry_for=5)
data, backup = os.path.join(work, "data"), os.path.join(work, "backup")
os.makedirs(os.path.join(data, "sub"))
for i in range(5):
    with open(os.path.join(data, "sub" if i % 2 else "", f"file{i}"), "w") as f:
        f.write("x" * i)
r = subprocess.run([sys.executable, os.path.join(RECIPES, "nightly-backup.py"), data, backup], env=PYENV,
                   capture_output=True, text=True, timeout=60)
aid = r.stdout.strip().split(" as ")[-1]
done = api(f"/v1/activities/{aid}") or {}
check("python backup: copies every file and ends completed at 100%", r.returncode == 0 and done.get("state") == "completed"
      and done.get("progress") == 1 and sorted(os.listdir(os.path.join(backup, "sub"))) == ["file1", "file3"], (r.stdout, r.stderr, done))
check("python backup: reports files copied", "5/5 files" in statuses(aid), statuses(aid))
not_a_dir = os.path.join(work, "not-a-directory")
open(not_a_dir, "w").close()  # the copy raises at once (also for root)
r = subprocess.run([sys.executable, os.path.join(RECIPES, "nightly-backup.py"), data, not_a_dir], env=PYENV,
                   capture_output=True, text=True, timeout=60)
jobs = (api("/v1/activities?q=Nightly%20backup&limit=10") or {}).get("activities", [])
failed_job = next((a for a in jobs if a["activityId"] != aid), {})
check("python backup: a failure ends the job error with the reason, and the script fails",
      r.returncode != 0 and failed_job.get("state") == "error" and "File exists" in (failed_job.get("error") or ""),
      (r.returncode, r.stderr[-300:], failed_job))

# 7. JavaScript: Node's fetch, then the browser's EventSource in Chromium.
node = shutil.which("node")
if node:
    r = subprocess.run([node, os.path.join(RECIPES, "dispatch-node.mjs")], env=ENV, capture_output=True, text=True, timeout=60)
    check("node: publish and follow to the end", r.returncode == 0 and r.stdout.strip().endswith("completed"), r.stdout + r.stderr)
else:
    check("node: installed", False)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=RECIPES)
handler.log_message = lambda *a: None
pages = http.server.ThreadingHTTPServer(("127.0.0.1", PAGE_PORT), handler)
threading.Thread(target=pages.serve_forever, daemon=True).start()
options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]:
    options.add_argument(arg)
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
try:
    aid = d.start("Browser recipe", state="processing")["activityId"]
    driver.get(f"http://127.0.0.1:{PAGE_PORT}/dispatch-browser.html?server={BASE}&id={aid}&key={KEY}")

    def line():
        return driver.find_element("id", "line").text

    def wait(prefix, timeout=15):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if line().startswith(prefix):
                return True
            time.sleep(0.05)
        return False

    check("browser: EventSource shows the current snapshot", wait("#1 processing"), line())
    d.update(aid, progress=0.42, status="Copying")
    check("browser: and each change as it happens", wait("#2 processing 42% Copying"), line())
    d.end(aid, status="Done")
    check("browser: through the end", wait("#3 completed"), line())
    driver.get(f"http://127.0.0.1:{PAGE_PORT}/dispatch-browser.html?server={BASE}&id=no-such-job&key={KEY}")
    check("browser: an unknown id says so", wait("no such activity"), line())

    # The dashboard: every job, live, through ActivityFeed.
    driver.get(f"http://127.0.0.1:{PAGE_PORT}/dispatch-dashboard.html?server={BASE}&key={KEY}")

    def cells(aid):
        rows = driver.find_elements("css selector", f'tr[data-id="{aid}"]')
        return [c.text for c in rows[0].find_elements("css selector", "td")] if rows else None

    def until(predicate, timeout=15):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if predicate():
                    return True
            except Exception:
                pass
            time.sleep(0.05)
        return False

    check("dashboard: live, with the jobs the server has", until(lambda: driver.find_element("id", "conn").text == "live"
                                                                   and cells(aid) and cells(aid)[2] == "completed"), cells(aid))
    b = d.start("Dashboard job", machine="dash1", state="processing")["activityId"]
    check("dashboard: a new job appears", until(lambda: cells(b) and cells(b)[:3] == ["Dashboard job", "dash1", "processing"]), cells(b))
    d.update(b, progress=0.25, status="quarter")
    check("dashboard: and follows it", until(lambda: cells(b) and cells(b)[3:] == ["25%", "quarter"]), cells(b))
    d.end(b, state="error", error="boom")
    check("dashboard: to its end", until(lambda: cells(b) and cells(b)[2] == "error"), cells(b))
finally:
    driver.quit()
    pages.shutdown()

shutil.rmtree(work, ignore_errors=True)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
