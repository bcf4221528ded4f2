#!/usr/bin/env python3
# Light load (issue 35): one publisher, sequential updates over one keep-alive connection, 2 ms
# apart; two dispatchd side by side on embedded PostgreSQL, A with DISPATCH_COMMIT_WINDOW_MS=0 and
# B with 4, rounds of 200 alternating which goes first; prints each round's acknowledgement p50.
# Usage: bench/light-publish.py [ROUNDS] (after bench/run built .build-bench; DISPATCHD=path overrides).
import http.client, json, os, subprocess, time, statistics, sys, secrets, signal
D=os.environ.get('DISPATCHD', os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '.build-bench', 'release', 'dispatchd'))
TMP=os.environ.get('TMPDIR', '/tmp')
key='dk_'+secrets.token_hex(20)
procs=[]
def start(port, window):
    d=os.path.join(TMP, f'light-publish-{port}'); subprocess.run(['rm','-rf',d])
    env=dict(os.environ, DISPATCH_LISTEN=f'127.0.0.1:{port}', DISPATCH_BOOTSTRAP_KEY=key, DISPATCH_DATA_DIR=d,
             DISPATCH_WORKERS='2', DISPATCH_COMMIT_WINDOW_MS=str(window), DISPATCH_PUBLISH_RATE='0', DISPATCH_LOG_LEVEL='warning')
    p=subprocess.Popen([D], env=env, stdout=open(os.path.join(TMP, f'light-publish-{port}.log'),'w'), stderr=subprocess.STDOUT)
    procs.append(p); return p
def wait(port):
    for _ in range(600):
        try:
            c=http.client.HTTPConnection('127.0.0.1',port,timeout=5); c.request('GET','/readyz'); r=c.getresponse(); r.read()
            if r.status==200: return
        except Exception: pass
        time.sleep(0.2)
    raise SystemExit(f'{port} not ready')
def conn(port):
    c=http.client.HTTPConnection('127.0.0.1',port,timeout=10); return c
H={'Authorization':'Bearer '+key,'Content-Type':'application/json'}
def post(c,path,body):
    c.request('POST',path,json.dumps(body),H); r=c.getresponse(); r.read(); return r.status
try:
    ports={'A':18441,'B':18442}
    start(ports['A'],0); start(ports['B'],4)
    for p in ports.values(): wait(p)
    cs={k:conn(p) for k,p in ports.items()}
    for k,c in cs.items():
        for i in range(4): assert post(c,'/v1/activities/start',{'activityId':f'l{i}','taskName':'light','state':'processing'}) in (200,201)
    res={'A':[],'B':[]}
    rounds=int(sys.argv[1]) if len(sys.argv)>1 else 8
    for r in range(rounds):
        order='AB' if r%2==0 else 'BA'
        for k in order:
            c=cs[k]; ts=[]
            for i in range(200):
                t=time.perf_counter(); s=post(c,f'/v1/activities/l{i%4}/update',{'progress':(i%100)/100}); ts.append((time.perf_counter()-t)*1000)
                assert s==200, s
                time.sleep(0.002)
            res[k].append(statistics.median(ts))
    for k in 'AB': print(k, 'round p50 ms', [round(x,2) for x in res[k]], 'median', round(statistics.median(res[k]),3))
    print('B lower in', sum(b<a for a,b in zip(res['A'],res['B'])), 'of', rounds)
finally:
    for p in procs: p.send_signal(signal.SIGTERM)
    for p in procs:
        try: p.wait(15)
        except Exception: p.kill()
    for port in (18441, 18442): subprocess.run(['rm','-rf',os.path.join(TMP, f'light-publish-{port}')])
