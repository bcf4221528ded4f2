// The Activities view: one EventSource on the feed (GET /v1/stream), a map of activity
// snapshots, and DOM updates batched per animation frame. No framework, no build step.
'use strict';

const KEY = 'dispatch.key';
const STATES = ['queued', 'processing', 'retrying', 'idle', 'completed', 'error', 'cancelled', 'rejected'];
const TERMINAL = new Set(['completed', 'error', 'cancelled', 'rejected']);
const EVENTS = STATES.concat(['cancel_requested']);
// A few SF Symbols by their meaning, as symbols every system font has; anything else gets
// the name's first letter, and no symbol at all a diamond.
const GLYPHS = {
  'arrow.down': '⬇', 'arrow.up': '⬆', 'icloud': '☁', 'film': '▶', 'play': '▶', 'gear': '⚙', 'cpu': '⚙', 'brain': '⚙',
  'hammer': '⚒', 'wrench': '⚒', 'externaldrive': '⛁', 'archivebox': '▤', 'doc': '▤', 'shippingbox': '▣', 'clock': '◷',
  'bolt': '⚡', 'server': '▦', 'desktopcomputer': '▦', 'checkmark': '✓', 'trash': '✕', 'envelope': '✉',
};

const $ = (id) => document.getElementById(id);
const activities = new Map();   // activityId -> snapshot
const rows = new Map();         // activityId -> <li>
const dirty = new Set();
let frame = 0;
let source = null;
let lastId = null;              // the last feed position seen (for a manual reconnect)
let synced = false;
let canCancel = true;
let selected = null;
let retryTimer = 0;
// Connection history, newest last (read by the browser test and handy in the console).
const connectionLog = [];
window.dispatchConnectionLog = connectionLog;
function logConn(what) { connectionLog.push([what, Date.now()]); if (connectionLog.length > 200) connectionLog.shift(); }

// ---------------------------------------------------------------- connection

function key() { return sessionStorage.getItem(KEY); }

function connect() {
  clearTimeout(retryTimer);
  if (source) source.close();
  let url = '/v1/stream?access_token=' + encodeURIComponent(key());
  // EventSource resends Last-Event-ID by itself; a source we build anew passes it here.
  if (lastId !== null) url += '&lastEventId=' + encodeURIComponent(lastId);
  source = new EventSource(url);
  setConn('Connecting…', 'wait');
  // Open again after a drop: the browser resumed with Last-Event-ID (no new initial set).
  source.onopen = () => {
    logConn('open');
    banner(null);
    setConn(synced ? 'Live' : 'Loading…', synced ? 'ok' : 'wait');
  };
  for (const name of EVENTS) source.addEventListener(name, onChange);
  source.addEventListener('synced', (e) => {
    lastId = e.lastEventId;
    synced = true;
    setConn('Live', 'ok');
    banner(null);
  });
  source.addEventListener('reset', () => {
    // Our position is too old for the server: start over from its initial set.
    activities.clear();
    for (const li of rows.values()) li.remove();
    rows.clear();
    synced = false;
    render();
  });
  // The event named `error` (a failed job) and connection errors share this name: a
  // MessageEvent with data is a job; a plain Event is the connection.
  source.addEventListener('error', (e) => {
    if (e instanceof MessageEvent && e.data) return onChange(e);
    onConnectionError();
  });
}

function onConnectionError() {
  logConn(source.readyState === EventSource.CLOSED ? 'closed' : 'error');
  setConn('Disconnected', 'bad');
  banner('Disconnected from the server — reconnecting. The list resumes where it left off.');
  if (source.readyState === EventSource.CLOSED) {
    // The browser gave up (an answer that is not a stream: bad key, server error). Find out why.
    fetch('/v1/activities?limit=1', { headers: auth() }).then((r) => {
      if (r.status === 401 || r.status === 403) return logout('The server refused this key (' + r.status + ').');
      retryTimer = setTimeout(connect, 3000);
    }, () => { retryTimer = setTimeout(connect, 3000); });
  }
}

function auth() { return { Authorization: 'Bearer ' + key() }; }

function setConn(text, kind) {
  const el = $('conn');
  el.textContent = text;
  el.dataset.kind = kind;
}

function banner(text) {
  const b = $('banner');
  b.hidden = !text;
  b.textContent = text || '';
}

// ---------------------------------------------------------------- changes

function onChange(e) {
  let a;
  try { a = JSON.parse(e.data); } catch { return; }
  if (!a || typeof a.activityId !== 'string') return;
  if (e.lastEventId) lastId = e.lastEventId;
  const old = activities.get(a.activityId);
  // Positions only grow, but a snapshot never goes back in seq either: keep the newest.
  if (old && old.seq > a.seq) return;
  activities.set(a.activityId, a);
  dirty.add(a.activityId);
  if (selected === a.activityId) appendHistory({ seq: a.seq, event: e.type, data: a, createdAt: a.updatedAt });
  schedule();
}

function schedule() {
  if (!frame) frame = requestAnimationFrame(render);
}

// ---------------------------------------------------------------- rendering

function render() {
  frame = 0;
  for (const id of dirty) {
    const a = activities.get(id);
    let li = rows.get(id);
    if (!li) {
      li = makeRow(id);
      rows.set(id, li);
    }
    fillRow(li, a);
    place(li, a);
  }
  dirty.clear();
  applyFilters();
  refreshMachines();
  if (selected && activities.has(selected)) showFacts(activities.get(selected));
}

function makeRow(id) {
  const li = document.createElement('li');
  li.className = 'row';
  li.dataset.id = id;
  li.innerHTML =
    '<button type="button" class="open">' +
    '<span class="glyph" aria-hidden="true"></span>' +
    '<span class="main"><span class="name"></span><span class="meta"><span class="machine"></span>' +
    '<span class="badge"></span><span class="attempt"></span></span>' +
    '<span class="status"></span></span>' +
    '<span class="side"><span class="bar" role="progressbar" aria-valuemin="0" aria-valuemax="100"><span class="fill"></span></span>' +
    '<span class="pct"></span><span class="time"></span></span>' +
    '</button>';
  li.querySelector('button').addEventListener('click', () => openDetail(id));
  return li;
}

function text(el, value) { if (el.textContent !== value) el.textContent = value; }

function fillRow(li, a) {
  const q = (c) => li.querySelector(c);
  const terminal = TERMINAL.has(a.state);
  li.dataset.state = a.state;
  li.dataset.machine = a.machine || '';
  text(q('.glyph'), glyph(a.systemImage));
  q('.glyph').title = a.systemImage || '';
  text(q('.name'), a.taskName);
  text(q('.machine'), a.machine || '');
  q('.machine').hidden = !a.machine;
  const badge = q('.badge');
  const label = a.cancelRequested && !terminal ? a.state + ' · cancel requested' : a.state;
  text(badge, label);
  badge.dataset.state = a.state;
  badge.classList.toggle('cancelreq', !!a.cancelRequested && !terminal);
  text(q('.attempt'), a.attempt > 1 ? 'attempt ' + a.attempt : '');
  text(q('.status'), a.error && terminal ? a.error : (a.status || ''));
  const bar = q('.bar');
  const known = typeof a.progress === 'number';
  const pct = known ? Math.round(a.progress * 100) : null;
  bar.classList.toggle('unknown', !known);
  q('.fill').style.width = known ? pct + '%' : '';
  if (known) bar.setAttribute('aria-valuenow', String(pct)); else bar.removeAttribute('aria-valuenow');
  bar.setAttribute('aria-label', a.taskName + ' progress');
  text(q('.pct'), known ? pct + '%' : '—');
  q('.time').dataset.created = a.createdAt;
  q('.time').dataset.ended = a.endedAt || '';
  tickOne(q('.time'));
}

/// Active rows: newest start first. Finished rows: newest end first.
function place(li, a) {
  const list = TERMINAL.has(a.state) ? $('finished') : $('active');
  const keyOf = (x) => TERMINAL.has(x.state) ? Date.parse(x.endedAt || x.updatedAt) : Date.parse(x.createdAt);
  const mine = keyOf(a);
  if (li.parentNode === list) return;
  let before = null;
  for (const other of list.children) {
    const o = activities.get(other.dataset.id);
    if (o && keyOf(o) < mine) { before = other; break; }
  }
  list.insertBefore(li, before);
}

function glyph(name) {
  if (!name) return '◆';
  for (const [prefix, g] of Object.entries(GLYPHS)) if (name.startsWith(prefix)) return g;
  return name[0].toUpperCase();
}

function duration(ms) {
  if (!(ms >= 0)) return '';
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + String(s % 60).padStart(2, '0') + 's';
  const h = Math.floor(m / 60);
  return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
}

function tickOne(el) {
  const created = Date.parse(el.dataset.created);
  const ended = el.dataset.ended ? Date.parse(el.dataset.ended) : null;
  text(el, ended ? 'took ' + duration(ended - created) : duration(Date.now() - created));
}

function tick() {
  for (const el of $('active').querySelectorAll('.time')) tickOne(el);
}

function applyFilters() {
  const m = $('f-machine').value;
  const s = $('f-state').value;
  let shownActive = 0, shownFinished = 0;
  for (const li of rows.values()) {
    const visible = !m || li.dataset.machine === m;
    li.hidden = !visible;
    if (visible) { if (TERMINAL.has(li.dataset.state)) shownFinished++; else shownActive++; }
  }
  $('active-section').hidden = s === 'finished';
  $('finished-section').hidden = s === 'active';
  text($('active-n'), String(shownActive));
  text($('finished-n'), String(shownFinished));
  $('active-empty').hidden = shownActive > 0;
  $('finished-empty').hidden = shownFinished > 0;
}

function refreshMachines() {
  const select = $('f-machine');
  const have = new Set([...select.options].map((o) => o.value));
  for (const a of activities.values()) {
    if (a.machine && !have.has(a.machine)) {
      const o = document.createElement('option');
      o.value = o.textContent = a.machine;
      select.appendChild(o);
      have.add(a.machine);
    }
  }
}

// ---------------------------------------------------------------- details and cancel

function openDetail(id) {
  selected = id;
  const a = activities.get(id);
  $('detail').hidden = false;
  text($('detail-title'), a.taskName);
  showFacts(a);
  $('cancel-msg').textContent = '';
  $('history').textContent = '';
  fetch('/v1/activities/' + encodeURIComponent(id) + '/events?limit=1000', { headers: auth() })
    .then((r) => r.ok ? r.json() : Promise.reject(r.status))
    .then((body) => { if (selected === id) { $('history').textContent = ''; body.events.forEach(appendHistory); } })
    .catch((status) => { $('cancel-msg').textContent = 'History unavailable (' + status + ').'; });
  $('detail').focus();
}

function showFacts(a) {
  const dl = $('detail-facts');
  const facts = [['Id', a.activityId], ['Machine', a.machine || '—'], ['State', a.state + (a.cancelRequested ? ' (cancel requested)' : '')],
    ['Attempt', String(a.attempt)], ['Started', new Date(a.createdAt).toLocaleString()],
    ['Ended', a.endedAt ? new Date(a.endedAt).toLocaleString() : '—']];
  if (a.error) facts.push(['Error', a.error]);
  dl.textContent = '';
  for (const [k, v] of facts) {
    const dt = document.createElement('dt'); dt.textContent = k;
    const dd = document.createElement('dd'); dd.textContent = v;
    dl.append(dt, dd);
  }
  $('cancel').hidden = !canCancel || TERMINAL.has(a.state) || a.cancelRequested;
}

function appendHistory(e) {
  const body = $('history');
  if ([...body.children].some((tr) => tr.dataset.seq === String(e.seq))) return;
  const tr = document.createElement('tr');
  tr.dataset.seq = String(e.seq);
  const d = e.data || {};
  for (const v of [String(e.seq), e.event, new Date(e.createdAt).toLocaleTimeString(),
    typeof d.progress === 'number' ? Math.round(d.progress * 100) + '%' : '—', d.status || '']) {
    const td = document.createElement('td'); td.textContent = v; tr.appendChild(td);
  }
  body.appendChild(tr);
}

function cancelSelected() {
  const id = selected;
  const msg = $('cancel-msg');
  msg.textContent = 'Asking the job to stop…';
  fetch('/v1/activities/' + encodeURIComponent(id) + '/cancel', {
    method: 'POST', headers: Object.assign({ 'Content-Type': 'application/json' }, auth()),
    body: JSON.stringify({ reason: 'cancelled from the Activities view' }),
  }).then((r) => {
    if (r.status === 202) msg.textContent = 'Cancel requested: the job\'s publisher decides when it stops.';
    else if (r.status === 403) { canCancel = false; $('cancel').hidden = true; msg.textContent = 'This key may not cancel jobs.'; }
    else if (r.status === 409) msg.textContent = 'The job has already finished.';
    else if (r.status === 404) msg.textContent = 'This server cannot cancel jobs (or the job is gone).';
    else msg.textContent = 'Cancel failed (' + r.status + ').';
  }, () => { msg.textContent = 'Cancel failed: the server is unreachable.'; });
}

// ---------------------------------------------------------------- key

function logout(message) {
  sessionStorage.removeItem(KEY);
  if (source) source.close();
  source = null;
  $('board').hidden = true;
  $('forget').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  setConn('Not connected', 'bad');
  banner(null);
  $('key').focus();
}

function start() {
  $('login').hidden = true;
  $('board').hidden = false;
  $('forget').hidden = false;
  render();
  connect();
}

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', (e) => {
    e.preventDefault();
    const k = $('key').value.trim();
    if (!k) return;
    sessionStorage.setItem(KEY, k);
    $('key').value = '';
    start();
  });
  $('forget').addEventListener('click', () => logout());
  $('f-machine').addEventListener('change', applyFilters);
  $('f-state').addEventListener('change', applyFilters);
  $('detail-close').addEventListener('click', () => { selected = null; $('detail').hidden = true; });
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape' && selected) $('detail-close').click(); });
  $('cancel').addEventListener('click', cancelSelected);
  setInterval(tick, 1000);
  if (key()) start(); else logout();
});
