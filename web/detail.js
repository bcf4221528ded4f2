// One job in detail: facts, actions its session may take (cancel, end as error) behind a
// confirmation, the history newest first paged backwards (?order=desc, ?before=), runs of
// progress-only updates folded into one line, a progress-over-time chart drawn here in SVG,
// the phone's Live Activity from GET /v1/activities/{id}/live-activity, and terminal snippets.
'use strict';

const D = { id: null, events: new Map(), oldest: null, newest: 0, complete: false, loading: false, pushTimer: 0, token: 0 };
const PAGE = 500;
const $d = (id) => document.getElementById(id);

window.showDetail = function (id) {
  const panel = $d('detail');
  document.body.classList.toggle('has-detail', !!id);
  if (!id) { panel.hidden = true; D.id = null; return; }
  const v = window.dispatchView;
  if (D.id === id && !panel.hidden) return;
  D.id = id;
  D.token++;
  D.events = new Map();
  D.oldest = null;
  D.newest = 0;
  D.complete = false;
  D.loading = false;  // a page still on its way for the previous job is dropped by its token
  panel.hidden = false;
  panel.scrollTop = 0;
  $d('action-msg').textContent = '';
  $d('history').textContent = '';
  $d('chart').textContent = '';
  $d('phone').textContent = '';
  $d('raw').textContent = '';
  // Nothing of the previous job stays while this one loads, or when it turns out not to exist.
  panel.classList.remove('missing');
  $d('detail-title').textContent = id;
  $d('detail-sub').textContent = '';
  $d('detail-facts').textContent = '';
  $d('detail-glyph').textContent = '';
  $d('cancel').hidden = $d('end-error').hidden = true;
  const a = v.activities.get(id);
  if (a) {
    facts(a);
    loadHistory(true);
    refreshPush();
  } else {
    fetchOne(id);
  }
  panel.focus({ preventScroll: true });
};

/// A job the list does not hold (older, or a link): read it, then its history and phone view.
async function fetchOne(id) {
  const v = window.dispatchView;
  const token = D.token;
  let r;
  try { r = await v.api('/v1/activities/' + encodeURIComponent(id)); } catch (e) { r = null; }
  if (D.token !== token) return;
  if (!r || !r.ok) {
    const why = !r ? 'The server is unreachable.'
      : r.status === 404 ? 'No such job on this server (a mistyped link, or it was pruned).'
      : r.status === 400 ? 'This cannot be a job id (1–128 of A–Z a–z 0–9 . _ : -).'
      : 'The server answered ' + r.status + '.';
    $d('detail').classList.add('missing');
    $d('detail-title').textContent = r && r.status === 404 ? 'No such job' : r && r.status === 400 ? 'Not a job id' : 'Could not load this job';
    $d('detail-sub').textContent = id + ' · ' + why;
    return;
  }
  const a = await r.json();
  a._archived = true;
  a._created = Date.parse(a.createdAt); a._updated = Date.parse(a.updatedAt); a._ended = a.endedAt ? Date.parse(a.endedAt) : 0;
  a._search = (a.activityId + '\n' + a.taskName).toLowerCase();
  if (!v.activities.has(id)) v.activities.set(id, a);
  facts(a);
  loadHistory(true);
  refreshPush();
}

window.onDetailChange = function (a, type) {
  if (a.activityId !== D.id) return;
  facts(a);
  if (D.newest === 0) {
    // The first page is on its way; loadHistory reads what it missed once it is in.
  } else if (a.seq === D.newest + 1) {
    addEvents([{ seq: a.seq, event: type, data: a, createdAt: a.updatedAt }]);
  } else if (a.seq > D.newest) {
    catchUp();  // a gap (a reconnect): read what we missed instead of guessing
  }
  clearTimeout(D.pushTimer);
  D.pushTimer = setTimeout(refreshPush, 300);
};

// ---------------------------------------------------------------- facts and actions

function facts(a) {
  const v = window.dispatchView;
  const now = Date.now();
  const terminal = v.TERMINAL.has(a.state);
  $d('detail-title').textContent = a.taskName;
  $d('detail-sub').textContent = a.activityId;
  const g = $d('detail-glyph');
  if (!g.firstChild) g.appendChild(symbolSVG(null, 34));
  drawSymbol(g.firstChild, a.systemImage);
  const rows = [
    ['State', a.state + (a.cancelRequested && !terminal ? ' (cancel requested)' : '')],
    ['Progress', typeof a.progress === 'number' ? Math.round(a.progress * 100) + ' %' : 'unknown'],
    ['Status', a.status || '—'],
    ['Machine', a.machine || '—'],
    ['Attempt', String(a.attempt)],
    ['Started', new Date(a.createdAt).toLocaleString()],
    terminal ? ['Finished', new Date(a.endedAt).toLocaleString() + ' (took ' + v.duration(a._ended - a._created) + ')']
      : ['Last update', v.ago(now - a._updated) + (v.isStalled(a, now) ? ' — stalled' : '')],
  ];
  if (a.error) rows.push(['Error', a.error]);
  const dl = $d('detail-facts');
  dl.textContent = '';
  for (const [k, val] of rows) {
    const dt = document.createElement('dt'); dt.textContent = k;
    const dd = document.createElement('dd'); dd.textContent = val;
    dl.append(dt, dd);
  }
  $d('cancel').hidden = !v.may('cancel') || terminal || a.cancelRequested;
  $d('end-error').hidden = !v.may('end') || terminal;
  $d('actions').hidden = !v.may('cancel') && !v.may('end');
  if (terminal && /publisher decides/.test($d('action-msg').textContent)) $d('action-msg').textContent = 'The job has finished (' + a.state + ').';
  snippets(a);
}

function confirmAction(title, body, yes) {
  return new Promise((resolve) => {
    const d = $d('confirm');
    $d('confirm-title').textContent = title;
    $d('confirm-text').textContent = body;
    $d('confirm-yes').textContent = yes;
    $d('confirm-reason').value = '';
    d.returnValue = '';
    d.addEventListener('close', () => resolve(d.returnValue === 'yes' ? $d('confirm-reason').value.trim() : null), { once: true });
    d.showModal();
    $d('confirm-no').focus();
  });
}

function explain(status, verb) {
  const v = window.dispatchView;
  const s = v.session;
  switch (status) {
    case 401: v.showLogin('Your session has ended: sign in again.'); return '';
    case 403:
      return s && s.scopes.includes('publish') && !s.scopes.includes('admin')
        ? 'This key (' + s.keyName + ') may ' + verb + ' only the jobs it started, and another key started this one. Use an admin key, or a device key to cancel.'
        : 'This key may not ' + verb + ' jobs.';
    case 404: return 'The job is gone.';
    case 409: return 'The job has already finished.';
    case 429: return 'Too many requests: try again in a moment.';
    default: return verb + ' failed (' + status + ').';
  }
}

async function cancelJob() {
  const id = D.id;
  const reason = await confirmAction('Cancel this job?', 'The server asks the job\'s publisher to stop (its cancel URL, or the dispatch run that started it). The job ends when the publisher says so.', 'Cancel the job');
  if (reason === null) return;
  const msg = $d('action-msg');
  msg.textContent = 'Asking the job to stop…';
  try {
    const r = await window.dispatchView.api('/v1/activities/' + encodeURIComponent(id) + '/cancel', {
      method: 'POST', body: JSON.stringify({ reason: reason || 'cancelled from the Activities view' }) });
    msg.textContent = r.status === 202 ? 'Cancel requested: the job\'s publisher decides when it stops.' : explain(r.status, 'cancel');
  } catch (e) { msg.textContent = 'Cancel failed: the server is unreachable.'; }
}

async function endJob() {
  const id = D.id;
  const reason = await confirmAction('End this job as failed?', 'Use this for a job whose publisher died: it is marked "error" at once and never changes again. A publisher that is still running will get 409 on its next update.', 'End as error');
  if (reason === null) return;
  const msg = $d('action-msg');
  msg.textContent = 'Ending the job…';
  try {
    const r = await window.dispatchView.api('/v1/activities/' + encodeURIComponent(id) + '/end', {
      method: 'POST', body: JSON.stringify({ state: 'error', error: reason || 'ended from the Activities view' }) });
    msg.textContent = r.status === 200 ? 'Ended as error.' : explain(r.status, 'end');
  } catch (e) { msg.textContent = 'Ending failed: the server is unreachable.'; }
}

function snippets(a) {
  const box = $d('snippets');
  const base = location.origin;
  const id = a.activityId;
  const q = "'" + id.replace(/'/g, "'\\''") + "'";
  const list = [
    ['Follow it', 'dispatch watch --id ' + q],
    ['Its stream', 'curl -N ' + base + '/v1/activities/' + encodeURIComponent(id) + '/status -H "Authorization: Bearer $DISPATCH_TOKEN"'],
    ['Cancel it', 'dispatch cancel --id ' + q],
    ['End it as failed', 'curl -X POST ' + base + '/v1/activities/' + encodeURIComponent(id) + '/end -H "Authorization: Bearer $DISPATCH_TOKEN" -H \'Content-Type: application/json\' -d \'{"state":"error","error":"ended by hand"}\''],
  ];
  if (box.dataset.id === id) return;
  box.dataset.id = id;
  box.textContent = '';
  for (const [label, cmd] of list) {
    const wrap = document.createElement('div');
    wrap.className = 'copyable';
    const l = document.createElement('span'); l.className = 'muted'; l.textContent = label;
    const pre = document.createElement('pre'); pre.className = 'snippet'; pre.textContent = cmd;
    const b = document.createElement('button'); b.type = 'button'; b.className = 'copy'; b.textContent = 'Copy';
    wrap.append(l, pre, b);
    box.appendChild(wrap);
    window.dispatchView.copyButton(b, () => cmd);
  }
}

// ---------------------------------------------------------------- history

async function loadHistory(first) {
  if (D.loading || D.complete) return;
  D.loading = true;
  const id = D.id, token = D.token;
  const path = '/v1/activities/' + encodeURIComponent(id) + '/events?' +
    (first || D.oldest === null ? 'order=desc&limit=' + PAGE : 'before=' + D.oldest + '&limit=' + PAGE);
  $d('older').textContent = 'Loading…';
  try {
    const r = await window.dispatchView.api(path);
    if (token !== D.token) return;
    if (!r.ok) { $d('action-msg').textContent = 'History unavailable (' + r.status + ').'; return; }
    const body = await r.json();
    if (body.events.length < PAGE) D.complete = true;
    addEvents(body.events);
    const now = window.dispatchView.activities.get(id);
    if (first && now && now.seq > D.newest) catchUp();
  } finally {
    if (token === D.token) D.loading = false;
    $d('older').textContent = 'Load older events';
    $d('older').hidden = D.complete;
  }
}

/// Reads every event after the newest we have (a gap after a reconnect, or changes made
/// while the first page was on its way).
async function catchUp() {
  const id = D.id, token = D.token;
  for (;;) {
    const r = await window.dispatchView.api('/v1/activities/' + encodeURIComponent(id) + '/events?after=' + D.newest + '&limit=1000');
    if (token !== D.token || !r.ok) return;
    const events = (await r.json()).events;
    addEvents(events);
    if (events.length < 1000) return;
  }
}

function addEvents(events) {
  for (const e of events) {
    if (D.events.has(e.seq)) continue;
    e._t = Date.parse(e.createdAt);
    D.events.set(e.seq, e);
    if (D.oldest === null || e.seq < D.oldest) D.oldest = e.seq;
    if (e.seq > D.newest) D.newest = e.seq;
  }
  if (D.oldest === 1) D.complete = true;
  drawHistory();
  drawChart();
}

/// Groups the loaded events newest first: consecutive updates that change only progress or
/// status (same state, same attempt) fold into one line.
function groups() {
  const seqs = [...D.events.keys()].sort((x, y) => y - x);
  const out = [];
  for (const s of seqs) {
    const e = D.events.get(s);
    const prev = D.events.get(s - 1);
    const quiet = prev && e.event === e.data.state && prev.data.state === e.data.state && prev.data.attempt === e.data.attempt && s !== 1;
    const g = out[out.length - 1];
    if (quiet && g && g.quiet && g.from === s + 1) {
      g.from = s; g.events.push(e);
    } else {
      out.push({ quiet, from: s, to: s, events: [e] });
    }
  }
  return out;
}

function pct(d) { return typeof d.progress === 'number' ? Math.round(d.progress * 100) + ' %' : '—'; }

function drawHistory() {
  const ol = $d('history');
  const v = window.dispatchView;
  ol.textContent = '';
  let count = 0;
  for (const g of groups()) {
    count += g.events.length;
    const li = document.createElement('li');
    li.dataset.from = String(g.from);
    li.dataset.to = String(g.to);
    li.dataset.count = String(g.events.length);
    const newest = g.events[0], oldest = g.events[g.events.length - 1];
    if (g.events.length >= 3) {
      li.className = 'ev folded';
      const span = v.duration(newest._t - oldest._t);
      const what = document.createElement('button');
      what.type = 'button';
      what.className = 'fold';
      what.textContent = newest.data.state + ' ' + pct(oldest.data) + ' → ' + pct(newest.data) + ', ' + g.events.length + ' updates, ' + span;
      what.setAttribute('aria-expanded', 'false');
      const inner = document.createElement('ol');
      inner.hidden = true;
      what.addEventListener('click', () => {
        inner.hidden = !inner.hidden;
        what.setAttribute('aria-expanded', String(!inner.hidden));
        if (!inner.hidden && !inner.firstChild) for (const e of g.events) inner.appendChild(eventLine(e));
      });
      li.append(seqLabel(g.from + '–' + g.to), what, when(newest), inner);
    } else {
      for (const e of g.events) ol.appendChild(eventLine(e));
      continue;
    }
    ol.appendChild(li);
  }
  $d('history-n').textContent = count.toLocaleString() + (D.complete ? ' events' : ' newest events');
}

function seqLabel(t) { const s = document.createElement('span'); s.className = 'seq'; s.textContent = '#' + t; return s; }

function when(e) {
  const t = document.createElement('time');
  t.dateTime = e.createdAt;
  t.textContent = new Date(e.createdAt).toLocaleTimeString();
  return t;
}

function eventLine(e) {
  const li = document.createElement('li');
  li.className = 'ev';
  li.dataset.from = li.dataset.to = String(e.seq);
  li.dataset.count = '1';
  const name = document.createElement('span');
  name.className = 'badge';
  name.dataset.state = e.data.state;
  name.textContent = e.event.replace('_', ' ');
  const detail = document.createElement('span');
  detail.className = 'what';
  detail.textContent = [pct(e.data), e.event === 'cancel_requested' ? (e.data.cancelReason || '') : (e.data.error || e.data.status || '')].filter(Boolean).join(' · ');
  li.append(seqLabel(String(e.seq)), name, detail, when(e));
  return li;
}

// ---------------------------------------------------------------- the chart

const SVGNS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent) {
  const n = document.createElementNS(SVGNS, tag);
  for (const k in attrs) n.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(n);
  return n;
}

function drawChart() {
  const box = $d('chart');
  box.textContent = '';
  const evs = [...D.events.values()].sort((x, y) => x.seq - y.seq);
  if (!evs.length) return;
  const W = 480, H = 180, L = 36, R = 8, T = 10, B = 24;
  const t0 = evs[0]._t, t1 = Math.max(evs[evs.length - 1]._t, t0 + 1000);
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (p) => T + (H - T - B) * (1 - p);
  const svg = el('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'chart-svg', role: 'presentation' }, box);
  for (const p of [0, 0.25, 0.5, 0.75, 1]) {
    el('line', { x1: L, x2: W - R, y1: y(p), y2: y(p), class: 'grid' }, svg);
    el('text', { x: L - 4, y: y(p) + 4, class: 'axis', 'text-anchor': 'end' }, svg).textContent = Math.round(p * 100) + '%';
  }
  el('text', { x: L, y: H - 6, class: 'axis' }, svg).textContent = new Date(t0).toLocaleTimeString();
  el('text', { x: W - R, y: H - 6, class: 'axis', 'text-anchor': 'end' }, svg).textContent = new Date(t1).toLocaleTimeString();
  let d = '', prevState = null, points = 0, lastLabel = -1e9, row = 0;
  for (const e of evs) {
    if (e.data.state !== prevState) {
      const mx = x(e._t);
      el('line', { x1: mx, x2: mx, y1: T, y2: H - B, class: 'mark', 'data-state': e.data.state }, svg);
      // Labels of changes close together stack instead of overprinting.
      row = mx - lastLabel < 70 ? (row + 1) % 4 : 0;
      lastLabel = mx;
      // Near the right edge the label goes left of its line, so it is never clipped.
      const right = mx + 3 + e.data.state.length * 6 > W - R;
      el('text', { x: right ? mx - 3 : mx + 3, y: T + 10 + row * 11, class: 'mark-label', 'data-state': e.data.state,
        'text-anchor': right ? 'end' : 'start' }, svg).textContent = e.data.state;
      prevState = e.data.state;
    }
    if (typeof e.data.progress === 'number') {
      d += (d ? 'L' : 'M') + x(e._t).toFixed(1) + ' ' + y(e.data.progress).toFixed(1);
      points++;
    }
  }
  if (d) el('path', { d, class: 'line' }, svg);
  // The newest point as a dot: a job with one progress report still shows it.
  const last = evs.filter((e) => typeof e.data.progress === 'number').pop();
  if (last) el('circle', { cx: x(last._t).toFixed(1), cy: y(last.data.progress).toFixed(1), r: 3.5, class: 'dot' }, svg);
  box.dataset.points = String(points);
  box.setAttribute('aria-label', 'Progress over time: ' + points + ' points, ' + svg.querySelectorAll('.mark').length + ' state changes');
  const note = !points ? 'This job reports no progress.' : D.complete ? '' : 'From the ' + evs.length.toLocaleString() + ' newest events: load older ones below for the whole run.';
  if (note) { const p = document.createElement('p'); p.className = 'muted chart-note'; p.textContent = note; box.appendChild(p); }
}

// ---------------------------------------------------------------- the phone

async function refreshPush() {
  const id = D.id, token = D.token;
  if (!id) return;
  const r = await window.dispatchView.api('/v1/activities/' + encodeURIComponent(id) + '/live-activity');
  if (token !== D.token || !r.ok) return;
  // Without APNs no phone gets anything: say so instead of drawing a phone.
  const off = r.headers.get('Dispatch-Pushes') === 'off';
  $d('detail').classList.toggle('no-pushes', off);
  if (off) return;
  const push = await r.json();
  $d('raw').textContent = JSON.stringify(push, null, 2);
  drawPhone(push, window.dispatchView.activities.get(id));
}

function drawPhone(push, a) {
  const box = $d('phone');
  box.textContent = '';
  const aps = push.payload.aps;
  const cs = aps['content-state'];
  const at = aps.attributes || { taskName: a ? a.taskName : '', machine: a ? a.machine : null, systemImage: a ? a.systemImage : null };
  const known = typeof cs.progress === 'number';
  const p = known ? Math.round(cs.progress * 100) : null;
  const div = (cls, parent, txt) => { const n = document.createElement('div'); n.className = cls; if (txt !== undefined) n.textContent = txt; if (parent) parent.appendChild(n); return n; };
  const bar = (parent) => { const b = div('pbar' + (known ? '' : ' indeterminate'), parent); const f = div('pfill', b); if (known) f.style.width = p + '%'; return b; };
  const label = { queued: 'Queued', processing: 'In progress', retrying: 'Retrying', idle: 'Waiting', completed: 'Completed', error: 'Failed', cancelled: 'Cancelled', rejected: 'Rejected' }[cs.state];

  const lock = div('lock', box);
  div('caption', lock, 'Lock Screen · ' + push.event + ' · priority ' + push.priority);
  const card = div('lock-card', lock);
  card.dataset.state = cs.state;
  const head = div('lock-head', card);
  head.appendChild(symbolSVG(at.systemImage, 28));
  const titles = div('lock-titles', head);
  div('lock-title', titles, at.taskName);
  div('lock-sub', titles, [at.machine, label + (cs.attempt > 1 ? ' · attempt ' + cs.attempt : '')].filter(Boolean).join(' · '));
  div('lock-pct', head, known ? p + '%' : '');
  div('lock-status', card, cs.status || label);
  bar(card);
  if (aps.alert) div('lock-alert', card, aps.alert.title + ': ' + aps.alert.body);

  const island = div('island', box);
  div('caption', island, 'Dynamic Island · compact');
  const compact = div('island-compact', island);
  compact.dataset.state = cs.state;
  compact.appendChild(symbolSVG(at.systemImage, 18));
  div('island-gap', compact);
  const ring = el('svg', { viewBox: '0 0 20 20', width: 20, height: 20, class: 'ring' + (known ? '' : ' indeterminate') }, compact);
  el('circle', { cx: 10, cy: 10, r: 8, class: 'ring-bg' }, ring);
  el('circle', { cx: 10, cy: 10, r: 8, class: 'ring-fg', 'stroke-dasharray': (known ? 50.3 * cs.progress : 12) + ' 50.3', transform: 'rotate(-90 10 10)' }, ring);
  div('caption', island, 'Dynamic Island · expanded');
  const ex = div('island-expanded', island);
  ex.dataset.state = cs.state;
  const top = div('ex-top', ex);
  top.appendChild(symbolSVG(at.systemImage, 24));
  div('ex-title', top, at.taskName);
  div('ex-pct', top, known ? p + '%' : label);
  div('ex-status', ex, cs.status || label);
  bar(ex);
}

document.addEventListener('DOMContentLoaded', () => {
  $d('detail-close').addEventListener('click', () => window.closeDetail());
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape' && D.id && !$d('confirm').open) window.closeDetail(); });
  $d('cancel').addEventListener('click', cancelJob);
  $d('end-error').addEventListener('click', endJob);
  $d('older').addEventListener('click', () => loadHistory(false));
});
