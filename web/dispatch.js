// dispatch.js: Dispatch's streams in a browser, done right. An ES module with no dependency,
// served by dispatchd at /dispatch.js (and usable from a bundler: copy this file).
//
//   import { watchActivity, ActivityFeed } from '/dispatch.js';
//
//   const w = watchActivity('iso-1', {
//     onEvent: (name, snapshot, seq) => render(snapshot),
//     onEnd: (why, snapshot) => console.log('done:', why, snapshot && snapshot.state),
//   });
//
//   const feed = new ActivityFeed({ machine: 'shodan' });
//   feed.subscribe((change) => { if (change.type !== 'connection') draw(feed.list()); });
//
// What it gets right (contract §4, §8, §9): a final event closes the status stream and a
// `not_found` or a `204` stops it (an EventSource left alone reconnects every 3 s for ever);
// the event named `error` (a failed job) is told apart from a lost connection; a stream the
// browser gave up on is resumed with the last id it saw; the feed keeps ONE store of
// snapshots that views read (never a copy per view, which goes stale after one missed
// event), handles `synced` and `reset`, and resumes by position.

export const STATES = ['queued', 'processing', 'retrying', 'idle', 'completed', 'error', 'cancelled', 'rejected'];
export const TERMINAL = new Set(['completed', 'error', 'cancelled', 'rejected']);
// Every change's event name but `error`: that one shares its name with connection errors and
// is told apart in the `error` listener.
const CHANGE_EVENTS = STATES.filter((s) => s !== 'error').concat(['cancel_requested']);
const isJobEvent = (e) => typeof e.data === 'string' && e.data !== '';
const RETRY_MS = 3000;

function withQuery(path, params) {
  const q = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => encodeURIComponent(k) + '=' + encodeURIComponent(String(v)));
  return q.length ? path + (path.includes('?') ? '&' : '?') + q.join('&') : path;
}

function parse(data) {
  try { return JSON.parse(data); } catch (e) { return null; }
}

/**
 * Follows one activity's status stream (GET /v1/activities/{id}/status) until it ends.
 *
 * - `onEvent(name, snapshot, seq)`: every change, in order, each once.
 * - `onEnd(reason, snapshot)`: called once; `reason` is `'final'` (a terminal event: the
 *   snapshot is the final one), `'not_found'` (no such activity), `'closed'` (you called
 *   `close()`) or `'unauthorized'` (the key or session is gone).
 *
 * Options: `base` (the server's origin, default this page's), `lastEventId` (resume after that
 * seq), `accessToken` (a key for `?access_token=`, when the page has no session cookie: prefer
 * a session), `retryMs` (wait before a resume the module starts itself, default 3000),
 * `EventSource` (an implementation, for tests and other runtimes).
 * Returns `{ close(), get lastEventId() }`.
 */
export function watchActivity(id, { onEvent = () => {}, onEnd = () => {}, base = '', lastEventId = null, accessToken = null,
  retryMs = RETRY_MS, EventSource: ES = globalThis.EventSource, fetch: doFetch = globalThis.fetch } = {}) {
  const path = '/v1/activities/' + encodeURIComponent(id);
  let last = lastEventId === null || lastEventId === undefined ? null : Number(lastEventId);
  let source = null, timer = 0, ended = false;

  const end = (reason, snapshot) => {
    if (ended) return;
    ended = true;
    clearTimeout(timer);
    if (source) source.close();
    source = null;
    onEnd(reason, snapshot || null);
  };

  const onChange = (e) => {
    const snapshot = parse(e.data);
    if (!snapshot) return;
    const seq = Number(e.lastEventId);
    if (last !== null && seq <= last) return;  // never twice, never backwards
    last = seq;
    onEvent(e.type, snapshot, seq);
    if (TERMINAL.has(snapshot.state)) end('final', snapshot);
  };

  // The browser closed the stream for good: a 204 (nothing after our id: it had ended), an
  // error answer, or a 401. The database is the truth: ask it what happened, then end or
  // resume with the last id (the browser's own reconnects already send it; a new
  // EventSource cannot set the header, so it goes as ?lastEventId=).
  const recover = async () => {
    if (ended) return;
    let r = null;
    try {
      r = await doFetch(base + path, { credentials: 'same-origin', headers: accessToken ? { Authorization: 'Bearer ' + accessToken } : {} });
    } catch (e) { /* unreachable: try again later */ }
    if (ended) return;
    if (r && r.status === 404) return end('not_found', null);
    if (r && r.status === 401) return end('unauthorized', null);
    if (r && r.ok) {
      const snapshot = await r.json();
      if (TERMINAL.has(snapshot.state)) {
        if (last === null || snapshot.seq > last) {
          // Events we have not seen yet: read them from the history, in order.
          const h = await doFetch(base + withQuery(path + '/events', { after: last === null ? snapshot.seq - 1 : last, limit: 1000 }),
            { credentials: 'same-origin', headers: accessToken ? { Authorization: 'Bearer ' + accessToken } : {} });
          if (ended) return;
          if (h.ok) for (const ev of (await h.json()).events) onChange({ type: ev.event, data: JSON.stringify(ev.data), lastEventId: String(ev.seq) });
        }
        return end('final', snapshot);
      }
    }
    timer = setTimeout(open, retryMs);
  };

  function open() {
    if (ended) return;
    const url = base + withQuery(path + '/status', { lastEventId: last, access_token: accessToken });
    source = new ES(url);  // never withCredentials: CORS answers never allow credentials (another origin: accessToken)
    for (const name of CHANGE_EVENTS) source.addEventListener(name, onChange);
    source.addEventListener('not_found', () => end('not_found', null));
    // `error` is two things: a failed job (a MessageEvent with data) or the connection.
    source.addEventListener('error', (e) => {
      if (isJobEvent(e)) return onChange(e);
      if (!source || source.readyState !== ES.CLOSED) return;  // the browser reconnects with Last-Event-ID itself
      source = null;
      recover();
    });
  }

  open();
  return {
    close() { end('closed', null); },
    get lastEventId() { return last; },
  };
}

/**
 * The feed (GET /v1/stream) kept as one store of snapshots, newest seq wins.
 *
 * Views read the store (`get`, `list`, `synced`, `position`) and `subscribe(listener)` to hear
 * what changed; they never keep their own copies. The listener gets one object per change:
 *   { type: 'snapshot', snapshot, previous, event }   a change (or an initial snapshot)
 *   { type: 'synced', position }                      what follows is live
 *   { type: 'reset' }                                  the server starts over (store kept until synced)
 *   { type: 'removed', ids }                           gone after a reset (pruned while away)
 *   { type: 'connection', state }                      'open', 'reconnecting' (the browser retries),
 *                                                      'closed' (the browser gave up; the feed
 *                                                      resumes by position after `retryMs`)
 *
 * Options: `base`, `machine`, `state` (`active` | `finished`): the server's filters;
 * `position`: resume after it; `accessToken`; `retryMs`; `autoStart` (default true);
 * `EventSource`.
 */
export class ActivityFeed {
  constructor({ base = '', machine = null, state = null, position = null, accessToken = null, retryMs = RETRY_MS,
    autoStart = true, EventSource: ES = globalThis.EventSource } = {}) {
    this._opts = { base, machine, state, accessToken, retryMs, ES };
    this._store = new Map();
    this._listeners = new Set();
    this._position = position === null || position === undefined ? null : String(position);
    this._synced = false;
    this._unseen = null;      // after a reset: ids not sent again yet, swept at `synced`
    this._source = null;
    this._timer = 0;
    this._closed = false;
    if (autoStart) this.start();
  }

  /** Whether what the store holds is live (the stream said `synced` since its last reset). */
  get synced() { return this._synced; }
  /** The position the feed resumes after (the id of the last event it took), or null. */
  get position() { return this._position; }
  get size() { return this._store.size; }
  get(id) { return this._store.get(id); }
  has(id) { return this._store.has(id); }
  values() { return this._store.values(); }
  /** Every snapshot, optionally filtered: `list(a => a.machine === 'x')`. */
  list(filter) { const all = [...this._store.values()]; return filter ? all.filter(filter) : all; }

  /** `listener(change)` for every change; returns a function that unsubscribes. */
  subscribe(listener) {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /**
   * Adds a snapshot read elsewhere (an older finished job from GET /v1/activities). It is
   * kept across resets (the feed does not resend what finished over 24 hours ago), and a
   * newer one from the feed replaces it.
   */
  put(snapshot, { archived = true } = {}) {
    const old = this._store.get(snapshot.activityId);
    if (old && old.seq >= snapshot.seq) return old;
    const s = archived ? Object.assign({}, snapshot, { _archived: true }) : snapshot;
    this._store.set(s.activityId, s);
    this._emit({ type: 'snapshot', snapshot: s, previous: old || null, event: null });
    return s;
  }

  start() {
    if (this._source || this._closed) return;
    clearTimeout(this._timer);
    const { base, machine, state, accessToken, ES } = this._opts;
    const url = base + withQuery('/v1/stream', { machine, state, lastEventId: this._position, access_token: accessToken });
    const src = this._source = new ES(url);
    src.onopen = () => this._emit({ type: 'connection', state: 'open' });
    const onChange = (e) => this._change(e);
    for (const name of CHANGE_EVENTS) src.addEventListener(name, onChange);
    src.addEventListener('synced', (e) => this._syncedEvent(e));
    src.addEventListener('reset', () => this._reset());
    src.addEventListener('error', (e) => {
      if (isJobEvent(e)) return onChange(e);  // a failed job
      if (src.readyState === ES.CLOSED) {
        // An answer that is not a stream (a 401, a 503 while a server stops): resume by position.
        if (this._source === src) this._source = null;
        this._emit({ type: 'connection', state: 'closed' });
        if (!this._closed) this._timer = setTimeout(() => this.start(), this._opts.retryMs);
      } else {
        this._emit({ type: 'connection', state: 'reconnecting' });
      }
    });
  }

  /** Stops for good (a later `start()` does nothing). */
  close() {
    this._closed = true;
    clearTimeout(this._timer);
    if (this._source) this._source.close();
    this._source = null;
  }

  _change(e) {
    const s = parse(e.data);
    if (!s || typeof s.activityId !== 'string') return;
    if (e.lastEventId) this._position = e.lastEventId;
    if (this._unseen) this._unseen.delete(s.activityId);
    const old = this._store.get(s.activityId);
    if (old && old.seq > s.seq) return;   // never back in seq
    if (old && old.seq === s.seq && !old._archived) return;  // the same change again
    this._store.set(s.activityId, s);
    this._emit({ type: 'snapshot', snapshot: s, previous: old || null, event: e.type });
  }

  _syncedEvent(e) {
    const data = parse(e.data) || {};
    this._position = e.lastEventId || (data.position !== undefined ? String(data.position) : this._position);
    if (this._unseen) {
      const ids = [...this._unseen];
      this._unseen = null;
      for (const id of ids) this._store.delete(id);
      if (ids.length) this._emit({ type: 'removed', ids });
    }
    this._synced = true;
    this._emit({ type: 'synced', position: this._position });
  }

  _reset() {
    // Start over, but keep showing what we have until `synced`: what the server sends again
    // replaces it, what it does not (pruned, or finished while the feed was away and past
    // its 24 hours) is removed then. Snapshots added with put() stay.
    this._synced = false;
    this._unseen = new Set([...this._store.values()].filter((s) => !s._archived).map((s) => s.activityId));
    this._emit({ type: 'reset' });
  }

  _emit(change) {
    for (const l of [...this._listeners]) {
      try { l(change); } catch (err) { setTimeout(() => { throw err; }); }  // one bad view stops no other
    }
  }
}
