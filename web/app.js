// The Activities view: a session cookie instead of a key (POST /v1/session once), the feed
// (GET /v1/stream) kept by dispatch.js's ActivityFeed, the one store of snapshots every part
// of the page reads, and a virtualised list that draws only the rows on screen. Filters and the open job live in the URL
// (#/activities/<id>?q=&machine=&show=&stall=). No framework, no build step, no CDN.
'use strict';

const STATES = ['queued', 'processing', 'retrying', 'idle', 'completed', 'error', 'cancelled', 'rejected'];
const TERMINAL = new Set(['completed', 'error', 'cancelled', 'rejected']);
const DEFAULT_STALL_SECONDS = 120;

const $ = (id) => document.getElementById(id);
let feed = null;                // dispatch.js's ActivityFeed: activityId -> snapshot, kept by the feed
let feedModule = null;          // import('/dispatch.js'), loaded once
// The feed's store as the view and detail.js read it (snapshots carry _created, _updated,
// _ended in ms and _search, added by prepare() as they arrive). Never a copy of its own.
const activities = {
  get: (id) => (feed ? feed.get(id) : undefined),
  has: (id) => !!feed && feed.has(id),
  values: () => (feed ? feed.values() : [].values()),
  set: (id, a) => { if (feed) feed.put(a); },   // a snapshot read elsewhere (older finished jobs)
  get size() { return feed ? feed.size : 0; },
};
const samples = new Map();      // activityId -> [[ms, progress], ...] seen live, for the ETA
let session = null;             // {keyName, scopes}
let synced = false;
let structureDirty = true;
let lastRebuild = 0;
let frame = 0;
const dirtyRows = new Set();
const view = { id: null, q: '', machine: '', show: '', stall: DEFAULT_STALL_SECONDS };
let items = [];                 // what the list shows, in order: heads, rows, empties, "more"
let offsets = [0];              // offsets[i]: top of items[i]; offsets[items.length]: total height
const shown = new Map();        // item key -> element on screen
const pool = { row: [], head: [], empty: [], more: [] };
const archive = { cursor: null, done: false, loading: false, added: 0 };
const connectionLog = [];
window.dispatchConnectionLog = connectionLog;
function logConn(what) { connectionLog.push([what, Date.now()]); if (connectionLog.length > 200) connectionLog.shift(); }

// ---------------------------------------------------------------- session

async function api(path, options) {
  const o = Object.assign({ credentials: 'same-origin' }, options || {});
  if (o.body) o.headers = Object.assign({ 'Content-Type': 'application/json' }, o.headers || {});
  return fetch(path, o);
}

function may(action) {
  const s = new Set(session ? session.scopes : []);
  if (s.has('admin')) return true;
  switch (action) {
    case 'cancel': return s.has('device') || s.has('publish');
    case 'end': return s.has('publish');
    default: return s.size > 0;
  }
}

async function boot(message) {
  // Earlier versions kept the key in this tab's storage: never again.
  try { sessionStorage.removeItem('dispatch.key'); localStorage.removeItem('dispatch.key'); } catch (e) { /* storage off */ }
  // Only ask the server about a session this browser made: a visitor who never signed in gets
  // the form without a 401 in the console. (A marker, not a secret: the cookie is HttpOnly.)
  if (!signedInHere()) return showLogin(message || '');
  let r;
  try { r = await api('/v1/session'); } catch (e) { return showLogin('The server is unreachable.'); }
  if (r.status !== 200) { markSignedIn(false); return showLogin(message || ''); }
  session = await r.json();
  start();
}

function signedInHere() {
  try { return localStorage.getItem('dispatch.signedIn') === '1'; } catch (e) { return true; }  // storage off: ask
}

function markSignedIn(yes) {
  try { if (yes) localStorage.setItem('dispatch.signedIn', '1'); else localStorage.removeItem('dispatch.signedIn'); } catch (e) { /* storage off */ }
}

function showLogin(message) {
  session = null;
  if (feed) feed.close();
  feed = null;
  $('board').hidden = true;
  $('detail').hidden = true;
  $('forget').hidden = true;
  $('who').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  setConn('Not signed in', 'bad');
  banner(null);
  $('key').focus();
}

async function signIn(key) {
  let r;
  try { r = await api('/v1/session', { method: 'POST', headers: { Authorization: 'Bearer ' + key } }); } catch (e) {
    return showLogin('The server is unreachable.');
  }
  if (r.status === 204) { markSignedIn(true); return boot(); }
  showLogin(r.status === 401 ? 'The server does not know this key.' : 'Sign-in failed (' + r.status + ').');
}

async function signOut() {
  if (feed) feed.close();
  feed = null;
  markSignedIn(false);
  try { await api('/v1/session', { method: 'DELETE' }); } catch (e) { /* the cookie dies with the session anyway */ }
  structureDirty = true;
  showLogin('Signed out.');
}

// ---------------------------------------------------------------- the feed

function start() {
  $('login').hidden = true;
  $('board').hidden = false;
  $('forget').hidden = false;
  $('who').hidden = false;
  $('who').textContent = session.keyName + ' · ' + session.scopes.join(', ');
  readRoute();
  connect();
}

async function connect() {
  if (feed) feed.close();
  feed = null;
  synced = false;
  setConn('Connecting…', 'wait');
  try {
    feedModule = feedModule || await import('/dispatch.js');
  } catch (e) {
    feedModule = null;
    return banner('Could not load dispatch.js (' + e.message + '). Reload the page.');
  }
  if (!session) return;
  // The cookie authenticates the stream: no key in the URL (proxies log URLs).
  feed = new feedModule.ActivityFeed();
  feed.subscribe(onFeed);
}

function onFeed(change) {
  switch (change.type) {
    case 'snapshot': return onChange(change);
    case 'synced':
      synced = true;
      structureDirty = true;
      setConn('Live', 'ok');
      banner(null);
      return schedule();
    case 'reset':
    case 'removed':
      synced = feed.synced;
      structureDirty = true;
      return schedule();
    case 'connection': return onConnection(change.state);
  }
}

function onConnection(state) {
  logConn(state === 'open' ? 'open' : state === 'closed' ? 'closed' : 'error');
  if (state === 'open') {
    banner(null);
    return setConn(synced ? 'Live' : 'Loading…', synced ? 'ok' : 'wait');
  }
  setConn('Disconnected', 'bad');
  banner('Disconnected from the server — reconnecting. The list resumes where it left off.');
  if (state === 'closed') {
    // The browser gave up (an answer that is not a stream): is the session over? If not, the
    // feed resumes from its position by itself.
    api('/v1/session').then((r) => {
      if (r.status === 401) showLogin('Your session has ended (signed out elsewhere, unused for 12 hours, or its key revoked).');
    }, () => {});
  }
}

function setConn(text, kind) {
  const el = $('conn');
  if (el.textContent !== text) el.textContent = text;
  el.dataset.kind = kind;
}

function banner(text) {
  const b = $('banner');
  b.hidden = !text;
  b.textContent = text || '';
}

function prepare(a) {
  a._created = Date.parse(a.createdAt);
  a._updated = Date.parse(a.updatedAt);
  a._ended = a.endedAt ? Date.parse(a.endedAt) : 0;
  a._search = (a.activityId + '\n' + a.taskName).toLowerCase();
  return a;
}

function onChange(change) {
  const a = prepare(change.snapshot), old = change.previous;
  if (!old || old.state !== a.state) structureDirty = true;
  if (typeof a.progress === 'number' && (!old || old.progress !== a.progress)) {
    const s = samples.get(a.activityId) || [];
    s.push([a._updated, a.progress]);
    if (s.length > 12) s.shift();
    samples.set(a.activityId, s);
  }
  dirtyRows.add(a.activityId);
  if (window.onDetailChange && change.event) window.onDetailChange(a, change.event);
  schedule();
}

function schedule() { if (!frame) frame = requestAnimationFrame(render); }

// ---------------------------------------------------------------- what a row says

function duration(ms) {
  if (!(ms >= 0)) return '';
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + ' min ' + (s % 60) + ' s';
  const h = Math.floor(m / 60);
  if (h < 48) return h + ' h ' + (m % 60) + ' min';
  return Math.floor(h / 24) + ' d ' + (h % 24) + ' h';
}

function ago(ms) { return ms < 1500 ? 'just now' : duration(ms) + ' ago'; }

/// Only a job that should be moving: a queued job waits its turn and an idle one says it waits.
function isStalled(a, now) {
  return (a.state === 'processing' || a.state === 'retrying') && now - a._updated > view.stall * 1000;
}

/// Milliseconds left when progress moved steadily over the last few updates, else null:
/// each step's rate within a factor of 3 of the others, all within the last 10 minutes.
function eta(a, now) {
  const s = samples.get(a.activityId);
  if (!s || typeof a.progress !== 'number' || a.progress >= 1) return null;
  const recent = s.slice(-4).filter((x) => now - x[0] < 10 * 60 * 1000);
  if (recent.length < 3) return null;
  const rates = [];
  for (let i = 1; i < recent.length; i++) {
    const dt = recent[i][0] - recent[i - 1][0], dp = recent[i][1] - recent[i - 1][1];
    if (dt <= 0 || dp <= 0) return null;
    rates.push(dp / dt);
  }
  if (Math.max(...rates) / Math.min(...rates) > 3) return null;
  const first = recent[0], last = recent[recent.length - 1];
  const rate = (last[1] - first[1]) / (last[0] - first[0]);
  const left = (1 - a.progress) / rate - (now - last[0]);
  return left > 0 && left < 48 * 3600 * 1000 ? left : null;
}

/// [ETA or '', the rest]: the ETA leads (it is what a reader looks for and must never be cut),
/// then the last update, then the age, which may be cut on a narrow row.
function timeLine(a, now) {
  if (TERMINAL.has(a.state)) return ['', 'took ' + duration(a._ended - a._created) + ' · finished ' + ago(now - a._ended)];
  const left = eta(a, now);
  return [left === null ? '' : 'ETA ' + duration(left), 'updated ' + ago(now - a._updated) + ' · running ' + duration(now - a._created)];
}

// ---------------------------------------------------------------- the list

function matches(a) {
  if (view.machine && a.machine !== view.machine) return false;
  if (view.q && !a._search.includes(view.q.toLowerCase())) return false;
  return true;
}

/// Filters and sorts every snapshot into `items`: only when the structure changed (a new
/// job, a state change, a filter), never per frame for progress.
function rebuild(now) {
  const act = [], fin = [];
  const counts = {};
  let stalled = 0;
  const machines = new Set();
  for (const a of activities.values()) {
    if (a.machine) machines.add(a.machine);
    if (!matches(a)) continue;
    const terminal = TERMINAL.has(a.state);
    const st = !terminal && isStalled(a, now);
    if (view.show === 'stalled' && !st) continue;
    counts[a.state] = (counts[a.state] || 0) + 1;
    if (st) stalled++;
    (terminal ? fin : act).push(a);
  }
  act.sort((x, y) => y._created - x._created || (x.activityId < y.activityId ? 1 : -1));
  fin.sort((x, y) => y._ended - x._ended || (x.activityId < y.activityId ? 1 : -1));
  items = [];
  const showActive = view.show !== 'finished', showFinished = view.show !== 'active' && view.show !== 'stalled';
  if (showActive) {
    items.push({ kind: 'head', key: 'head:active', section: 'active', n: act.length, counts, stalled });
    for (const a of act) items.push({ kind: 'row', key: a.activityId, id: a.activityId });
    if (!act.length) items.push({ kind: 'empty', key: 'empty:active', text: view.show === 'stalled' ? 'Nothing stalled.' : 'Nothing running.' });
  }
  if (showFinished) {
    items.push({ kind: 'head', key: 'head:finished', section: 'finished', n: fin.length, counts });
    for (const a of fin) items.push({ kind: 'row', key: a.activityId, id: a.activityId });
    if (!fin.length) items.push({ kind: 'empty', key: 'empty:finished', text: 'Nothing finished matches.' });
    items.push({ kind: 'more', key: 'more' });
  }
  const style = getComputedStyle($('list'));
  const rowH = parseFloat(style.getPropertyValue('--row-h')) || 78, headH = parseFloat(style.getPropertyValue('--head-h')) || 52;
  offsets = new Array(items.length + 1);
  offsets[0] = 0;
  for (let i = 0; i < items.length; i++) {
    const k = items[i].kind;
    offsets[i + 1] = offsets[i] + (k === 'row' ? rowH : k === 'head' ? headH : k === 'more' ? 64 : 44);
  }
  $('list').style.height = offsets[items.length] + 'px';
  refreshMachines(machines);
  $('empty').hidden = !(synced && activities.size === 0);
  $('list').hidden = synced && activities.size === 0;
  const total = act.length + fin.length;
  $('counts').textContent = total === activities.size ? activities.size.toLocaleString() + ' jobs' : total.toLocaleString() + ' of ' + activities.size.toLocaleString() + ' jobs';
  structureDirty = false;
  lastRebuild = performance.now();
  for (const [key, el] of shown) { recycle(el); shown.delete(key); }
}

function render() {
  frame = 0;
  const now = Date.now();
  if (!synced) {
    setConn('Loading… ' + activities.size.toLocaleString(), 'wait');
  } else if (structureDirty) {
    // Under a storm of state changes, rebuild at most four times a second.
    const wait = activities.size > 2000 ? 250 - (performance.now() - lastRebuild) : 0;
    if (wait > 0) { setTimeout(schedule, wait); } else { rebuild(now); }
  }
  draw(now, false);
  dirtyRows.clear();
}

function firstIndexBelow(y) {
  let lo = 0, hi = items.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (offsets[mid + 1] <= y) lo = mid + 1; else hi = mid; }
  return lo;
}

/// Puts on screen the items that are (nearly) visible and nothing else.
function draw(now, all) {
  const list = $('list');
  if (list.hidden || $('board').hidden) return;
  const top = list.getBoundingClientRect().top;
  const from = Math.max(0, -top - 400), to = -top + window.innerHeight + 400;
  const first = firstIndexBelow(from);
  const want = new Set();
  for (let i = first; i < items.length && offsets[i] < to; i++) {
    const it = items[i];
    want.add(it.key);
    let el = shown.get(it.key);
    const fresh = !el;
    if (fresh) { el = take(it.kind); shown.set(it.key, el); list.appendChild(el); }
    el.style.transform = 'translateY(' + offsets[i] + 'px)';
    if (fresh || all || it.kind !== 'row' || dirtyRows.has(it.id)) fill(el, it, now);
  }
  for (const [key, el] of shown) if (!want.has(key)) { recycle(el); shown.delete(key); }
}

function take(kind) {
  const el = pool[kind].pop() || make(kind);
  el.hidden = false;
  return el;
}

function recycle(el) {
  el.hidden = true;
  delete el.dataset.id;
  pool[el.dataset.kind].push(el);
}

function make(kind) {
  const el = document.createElement('div');
  el.dataset.kind = kind;
  el.className = 'item ' + kind;
  if (kind === 'row') {
    el.setAttribute('role', 'listitem');
    el.innerHTML =
      '<button type="button" class="open"><span class="glyph"></span>' +
      '<span class="main"><span class="name"></span><span class="meta"><span class="badge"></span>' +
      '<span class="stall"></span><span class="attempt"></span><span class="machine"></span></span>' +
      '<span class="status"></span></span>' +
      '<span class="side"><span class="bar" role="progressbar" aria-valuemin="0" aria-valuemax="100"><span class="fill"></span></span>' +
      '<span class="pct"></span><span class="time"><span class="eta"></span><span class="ago"></span></span></span></button>';
    el.querySelector('.glyph').appendChild(symbolSVG(null, 26));
    el.querySelector('button').addEventListener('click', () => openDetail(el.dataset.id));
  } else if (kind === 'head') {
    el.innerHTML = '<h2><span class="title"></span> <span class="n"></span><span class="sub"></span></h2><span class="chips"></span>';
  } else if (kind === 'more') {
    el.innerHTML = '<button type="button" class="secondary more-btn"></button>';
    el.querySelector('button').addEventListener('click', loadOlderFinished);
  } else {
    el.innerHTML = '<p class="muted"></p>';
  }
  return el;
}

function text(el, value) { if (el.textContent !== value) el.textContent = value; }

function fill(el, it, now) {
  if (it.kind === 'row') return fillRow(el, activities.get(it.id), now);
  if (it.kind === 'empty') return text(el.firstChild, it.text);
  if (it.kind === 'more') {
    const b = el.firstChild;
    b.disabled = archive.done || archive.loading;
    text(b, archive.loading ? 'Loading…' : archive.done ? 'No older finished jobs' : 'Show older finished jobs');
    return;
  }
  el.dataset.section = it.section;
  text(el.querySelector('.title'), it.section === 'active' ? 'Active' : 'Finished');
  text(el.querySelector('.n'), it.n.toLocaleString());
  text(el.querySelector('.sub'), it.section === 'finished' ? (archive.added ? ' last 24 hours + ' + archive.added.toLocaleString() + ' older' : ' last 24 hours') : '');
  const chips = el.querySelector('.chips');
  chips.textContent = '';
  const states = it.section === 'active' ? ['processing', 'queued', 'retrying', 'idle'] : ['completed', 'error', 'cancelled', 'rejected'];
  for (const s of states) {
    if (!it.counts[s]) continue;
    const c = document.createElement('span');
    c.className = 'chip';
    c.dataset.state = s;
    c.textContent = it.counts[s].toLocaleString() + ' ' + s;
    chips.appendChild(c);
  }
  if (it.stalled) {
    const c = document.createElement('span');
    c.className = 'chip';
    c.dataset.state = 'stalled';
    c.textContent = it.stalled.toLocaleString() + ' stalled';
    chips.appendChild(c);
  }
}

function fillRow(el, a, now) {
  if (!a) return;
  const q = (c) => el.querySelector(c);
  const terminal = TERMINAL.has(a.state);
  el.dataset.id = a.activityId;
  el.dataset.state = a.state;
  el.dataset.machine = a.machine || '';
  el.dataset.section = terminal ? 'finished' : 'active';
  const stalled = isStalled(a, now);
  el.classList.toggle('stalled', stalled);
  el.classList.toggle('selected', view.id === a.activityId);
  drawSymbol(q('.glyph svg'), a.systemImage);
  q('.glyph').title = a.systemImage || '';
  text(q('.name'), a.taskName);
  q('.name').title = a.taskName;
  text(q('.machine'), a.machine || '');
  q('.machine').hidden = !a.machine;
  const badge = q('.badge');
  text(badge, a.cancelRequested && !terminal ? a.state + ' · cancel requested' : a.state);
  badge.dataset.state = a.state;
  text(q('.attempt'), a.attempt > 1 ? 'attempt ' + a.attempt : '');
  text(q('.stall'), stalled ? 'stalled ' + duration(now - a._updated) : '');
  q('.stall').title = stalled ? 'No update for ' + duration(now - a._updated) : '';
  q('.machine').title = a.machine || '';
  q('.stall').hidden = !stalled;
  text(q('.status'), a.error && terminal ? a.error : (a.status || ''));
  const bar = q('.bar');
  const known = typeof a.progress === 'number';
  const pct = known ? Math.round(a.progress * 100) : null;
  bar.hidden = !known && terminal;           // a finished job without progress has no bar
  bar.classList.toggle('indeterminate', !known && !terminal);
  q('.fill').style.width = known ? pct + '%' : '';
  if (known) bar.setAttribute('aria-valuenow', String(pct)); else bar.removeAttribute('aria-valuenow');
  bar.setAttribute('aria-label', a.taskName + (known ? ' progress' : ' progress unknown'));
  text(q('.pct'), known ? pct + '%' : '');
  const [etaText, rest] = timeLine(a, now);
  text(q('.eta'), etaText);
  q('.eta').hidden = !etaText;
  text(q('.ago'), rest);
  q('.time').title = etaText ? etaText + ' · ' + rest : rest;
}

function refreshMachines(machines) {
  const select = $('f-machine');
  const have = new Set([...select.options].map((o) => o.value));
  for (const m of [...machines].sort()) {
    if (have.has(m)) continue;
    const o = document.createElement('option');
    o.value = o.textContent = m;
    select.appendChild(o);
  }
  if (view.machine && !have.has(view.machine) && !machines.has(view.machine)) {
    const o = document.createElement('option');
    o.value = o.textContent = view.machine;
    select.appendChild(o);
  }
  select.value = view.machine;
}

async function loadOlderFinished() {
  if (archive.loading || archive.done) return;
  archive.loading = true;
  draw(Date.now(), true);
  const p = new URLSearchParams({ state: 'finished', limit: '200' });
  if (view.machine) p.set('machine', view.machine);
  if (view.q) p.set('q', view.q);
  if (archive.cursor) p.set('cursor', archive.cursor);
  try {
    const r = await api('/v1/activities?' + p);
    if (r.status === 401) return showLogin('Your session has ended.');
    if (!r.ok) throw new Error(String(r.status));
    const body = await r.json();
    for (const a of body.activities) {
      if (!activities.has(a.activityId)) { activities.set(a.activityId, a); archive.added++; }
    }
    archive.cursor = body.nextCursor;
    archive.done = !body.nextCursor;
    structureDirty = true;
  } catch (e) {
    banner('Could not load older jobs (' + e.message + ').');
  } finally {
    archive.loading = false;
    schedule();
  }
}

// ---------------------------------------------------------------- the URL

function readRoute() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const p = new URLSearchParams(query || '');
  const m = /^activities\/(.+)$/.exec(path || '');
  const before = JSON.stringify([view.q, view.machine, view.show]);
  view.id = m ? decodeURIComponent(m[1]) : null;
  view.q = p.get('q') || '';
  view.machine = p.get('machine') || '';
  view.show = ['active', 'finished', 'stalled'].includes(p.get('show')) ? p.get('show') : '';
  const stall = parseInt(p.get('stall'), 10);
  view.stall = stall > 0 ? stall : DEFAULT_STALL_SECONDS;
  $('f-q').value = view.q;
  $('f-show').value = view.show;
  if (before !== JSON.stringify([view.q, view.machine, view.show])) { archive.cursor = null; archive.done = false; }
  structureDirty = true;
  schedule();
  if (window.showDetail) window.showDetail(view.id);
}

function routeHash() {
  const p = new URLSearchParams();
  if (view.q) p.set('q', view.q);
  if (view.machine) p.set('machine', view.machine);
  if (view.show) p.set('show', view.show);
  if (view.stall !== DEFAULT_STALL_SECONDS) p.set('stall', String(view.stall));
  const qs = p.toString();
  return '#/' + (view.id ? 'activities/' + encodeURIComponent(view.id) : '') + (qs ? '?' + qs : '');
}

/// Filters replace the URL (no history entry per keystroke); opening a job pushes one.
function writeRoute(push) {
  const h = routeHash();
  if (location.hash === h) return;
  if (push) location.hash = h; else { history.replaceState(null, '', h); readRoute(); }
}

function openDetail(id) {
  view.id = id;
  writeRoute(true);
}

window.closeDetail = function () { view.id = null; writeRoute(true); };

function copyButton(button, textOf) {
  button.addEventListener('click', async () => {
    const t = textOf();
    try { await navigator.clipboard.writeText(t); button.textContent = 'Copied'; } catch (e) {
      const range = document.createRange();
      range.selectNodeContents(button.previousElementSibling || button);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      button.textContent = 'Selected: press Ctrl+C';
    }
    setTimeout(() => { button.textContent = 'Copy'; }, 2000);
  });
}

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', (e) => {
    e.preventDefault();
    const k = $('key').value.trim();
    $('key').value = '';
    if (k) signIn(k);
  });
  $('forget').addEventListener('click', signOut);
  let typing = 0;
  $('f-q').addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => { view.q = $('f-q').value.trim(); writeRoute(false); }, 150);
  });
  $('f-machine').addEventListener('change', () => { view.machine = $('f-machine').value; writeRoute(false); });
  $('f-show').addEventListener('change', () => { view.show = $('f-show').value; writeRoute(false); });
  window.addEventListener('hashchange', readRoute);
  window.addEventListener('scroll', () => draw(Date.now(), false), { passive: true });
  window.addEventListener('resize', () => { structureDirty = true; schedule(); });
  copyButton(document.querySelector('[data-copy="first-run"]'), () => $('first-run').textContent);
  setInterval(() => {
    if (!session) return;
    // Times tick on the rows on screen; the stalled filter and counts follow every 5 s.
    if (Date.now() % 5000 < 1000) structureDirty = true;
    draw(Date.now(), true);
    schedule();
  }, 1000);
  boot();
});

window.dispatchView = { activities, view, may, api, duration, ago, timeLine, isStalled, TERMINAL, copyButton, showLogin,
  get session() { return session; } };
