#!/usr/bin/env python3
"""The feed stall hunt (bench/README.md, "Feed stall hunt"): restart dispatchd node(s), connect
many feed readers at once, each must reach `event: synced` while live publishes and start/end
churn go on. A reader still waiting at 80 % of the timeout makes every worker dump its feed
state (SIGUSR1, `msg=feed.state` lines); the log of a stalled run is kept in --dir.
Run as root (the private cluster runs as `postgres`); loopback only.

  python3 bench/feed-hunt.py --dispatchd .build-bench/release/dispatchd --runs 250
  python3 bench/feed-hunt.py --dispatchd ... --nodes 2 --carrier nats --port-offset 1 --dir /tmp/hunt-nats
"""
import argparse, glob, http.client, json, os, random, signal, subprocess, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--dispatchd", required=True)
ap.add_argument("--runs", type=int, default=100)
ap.add_argument("--readers", type=int, default=60)
ap.add_argument("--activities", type=int, default=1000)
ap.add_argument("--nodes", type=int, default=1)
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--carrier", choices=["notify", "nats"], default="notify")
ap.add_argument("--timeout", type=float, default=60)
ap.add_argument("--dir", default="/tmp/hunt")
ap.add_argument("--stop-on-stall", action="store_true")
ap.add_argument("--port-offset", type=int, default=0)
a = ap.parse_args()

PG = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
KEY = "dk_hunt_" + "a" * 40
PGPORT, NATSPORT, BASE = 55432 + a.port_offset, 54222 + a.port_offset, 58080 + 10 * a.port_offset
os.makedirs(a.dir, exist_ok=True)
os.system(f"chown postgres {a.dir}")
procs = {}

def sh(cmd):
    subprocess.run(cmd, shell=True, check=True)

def pg_start():
    d = f"{a.dir}/pg"
    if not os.path.exists(d + "/PG_VERSION"):
        sh(f"runuser -u postgres -- {PG}/initdb -D {d} -A trust -U postgres >/dev/null")
        with open(d + "/postgresql.conf", "a") as f:
            f.write(f"port={PGPORT}\nlisten_addresses='127.0.0.1'\nunix_socket_directories='{a.dir}'\n"
                    "track_commit_timestamp=on\nmax_connections=300\nfsync=off\n")
    sh(f"runuser -u postgres -- {PG}/pg_ctl -D {d} -l {a.dir}/pg.log -w start >/dev/null")
    subprocess.run(f"psql -h 127.0.0.1 -p {PGPORT} -U postgres -c 'create database hunt' >/dev/null 2>&1", shell=True)

def start_node(i):
    env = dict(os.environ, DATABASE_URL=f"postgres://postgres@127.0.0.1:{PGPORT}/hunt",
               DISPATCH_LISTEN=f"127.0.0.1:{BASE + i}", DISPATCH_BOOTSTRAP_KEY=KEY,
               DISPATCH_WORKERS=str(a.workers), DISPATCH_ACCESS_LOG="off",
               DISPATCH_PUBLISH_RATE="0", DISPATCH_MAX_STREAMS_PER_KEY="100000")
    if a.carrier == "nats":
        env["DISPATCH_NATS_URL"] = f"nats://127.0.0.1:{NATSPORT}"
    log = open(f"{a.dir}/node{i}.log", "ab")
    procs[i] = subprocess.Popen([a.dispatchd], env=env, stdout=log, stderr=log)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", BASE + i, timeout=2)
            c.request("GET", "/readyz"); r = c.getresponse(); r.read()
            if r.status == 200: return
        except OSError: pass
        time.sleep(0.05)
    raise SystemExit(f"node {i} not ready")

def stop_node(i):
    p = procs.pop(i, None)
    if p:
        p.send_signal(signal.SIGTERM)
        try: p.wait(15)
        except subprocess.TimeoutExpired: p.kill(); p.wait()

def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse(); data = r.read(); c.close()
    return r.status, data

def read_until_synced(port, out, idx):
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=a.timeout)
        c.request("GET", "/v1/stream", headers={"Authorization": f"Bearer {KEY}", "Accept": "text/event-stream"})
        r = c.getresponse()
        if r.status != 200:
            out[idx] = ("status", r.status); return
        while time.time() - t0 < a.timeout:
            line = r.fp.readline()
            if not line: out[idx] = ("closed", time.time() - t0); return
            if line.startswith(b"event: synced"):
                out[idx] = ("synced", time.time() - t0); c.close(); return
        out[idx] = ("timeout", a.timeout)
    except Exception as e:
        out[idx] = ("timeout" if "timed out" in str(e) else "error", str(e))

class Churn(threading.Thread):
    def __init__(self, ids):
        super().__init__(daemon=True); self.ids = ids; self.stop = False; self.n = 0
    def run(self):
        k = 0
        while not self.stop:
            port = BASE + random.randrange(a.nodes)
            try:
                if random.random() < 0.2:
                    k += 1; aid = f"churn-{os.getpid()}-{time.time_ns()}-{k}"
                    call(port, "POST", "/v1/activities/start", {"activityId": aid, "taskName": "churn", "state": "processing"})
                    call(port, "POST", f"/v1/activities/{aid}/end", {"status": "done"})
                else:
                    aid = random.choice(self.ids)
                    call(port, "POST", f"/v1/activities/{aid}/update", {"progress": random.random(), "status": "x"})
                self.n += 1
            except OSError:
                time.sleep(0.05)

nats = None
pg_start()
if a.carrier == "nats":
    nats = subprocess.Popen(["nats-server", "-p", str(NATSPORT), "-a", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
for i in range(a.nodes): start_node(i)
ids = [f"hunt-{n}" for n in range(a.activities)]
st, _ = call(BASE, "GET", f"/v1/activities/{ids[-1]}")
if st != 200:
    for aid in ids:
        call(BASE, "POST", "/v1/activities/start", {"activityId": aid, "taskName": "hunt", "state": "processing"})
stalls = 0
try:
    for run in range(a.runs):
        for i in range(a.nodes): stop_node(i)
        for i in range(a.nodes): start_node(i)
        churn = Churn(ids); churn.start()
        out = [None] * a.readers
        ports = [BASE + (r % a.nodes) for r in range(a.readers)]
        ts = [threading.Thread(target=read_until_synced, args=(ports[r], out, r)) for r in range(a.readers)]
        for t in ts: t.start()
        def watchdog(out=out, ts=ts):
            # Dump while the late readers are still connected: the dump shows what they wait for.
            time.sleep(a.timeout * 0.8)
            if any(t.is_alive() for t in ts) and any(o is None for o in out):
                print(f"  late readers at {a.timeout * 0.8:.0f}s: dumping", flush=True)
                for i in list(procs): procs[i].send_signal(signal.SIGUSR1)
        threading.Thread(target=watchdog, daemon=True).start()
        for t in ts: t.join()
        churn.stop = True; churn.join()
        # A reader the server closed was cut (slow_client, database: see /metrics), not stalled.
        cut = [(r, o) for r, o in enumerate(out) if o and o[0] == "closed"]
        bad = [(r, o) for r, o in enumerate(out) if not o or o[0] not in ("synced", "closed")]
        slowest = max((o[1] for o in out if o and o[0] == "synced"), default=0)
        print(f"run {run}: synced {a.readers - len(bad) - len(cut)}/{a.readers}, cut {len(cut)}, slowest {slowest:.2f}s, churn {churn.n}", flush=True)
        if bad:
            stalls += 1
            print(f"  STALL: {bad[:5]}", flush=True)
            time.sleep(0.5)
            for i in range(a.nodes):
                sh(f"cp {a.dir}/node{i}.log {a.dir}/stall-{run}-node{i}.log")
            if a.stop_on_stall:
                print(f"  holding: pids {[p.pid for p in procs.values()]}; touch {a.dir}/release to end", flush=True)
                while not os.path.exists(f"{a.dir}/release"): time.sleep(1)
                break
        for i in range(a.nodes):
            open(f"{a.dir}/node{i}.log", "w").close()
finally:
    for i in list(procs): stop_node(i)
    if nats: nats.terminate()
    subprocess.run(f"runuser -u postgres -- {PG}/pg_ctl -D {a.dir}/pg -m fast stop >/dev/null", shell=True)
print(f"runs {a.runs}, stalls {stalls}")
