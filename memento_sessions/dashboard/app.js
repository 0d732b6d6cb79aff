// memento-sessions live dashboard: plain JS, no build step, talks only to the daemon's public /ws API.
// Every update from the socket only changes state and asks for a frame; the DOM is touched once per
// animation frame, and both long lists are virtual (a fixed budget of rows whatever their length).

import { Usage } from "./usage.js";

const TOKEN_KEY = "memento.token";
const ROW = 26;            // px per row: the virtual lists place rows by index * ROW
const OVERSCAN = 8;        // rows drawn above and below the viewport
const LIST_PAGE = 500;     // session.list's largest page
const MAX_PAGES = 100;     // a namespace holds at most MEMENTO_NAMESPACE_MAX_SESSIONS; stop well past any default
const POLL_MS = 2000;      // sessions.watch announces creations and checkpoints only: states and seqs are polled
const MIN_POLL_GAP = 1000; // ms between two polls however many announcements arrive
const MAX_EVENTS = 100000; // timeline events kept in memory (MEMENTO_SESSION_MAX_EVENTS' default)
const CHART_POINTS = 90;
const $ = (sel) => document.querySelector(sel);
const USAGE_EVENTS = new Set(["usage", "query:started", "query:completed", "query:failed"]);

// ---------------------------------------------------------------- token

function takeToken() {
  // A ?token= link works once: the token moves into this tab's sessionStorage and leaves the URL (and so the
  // history, bookmarks and anything the address bar syncs) at once.
  const url = new URL(location.href);
  const given = url.searchParams.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function claims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
  } catch {
    return {};
  }
}

// ---------------------------------------------------------------- JSON-RPC over /ws

class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

class Rpc {
  constructor(token, handlers) {
    this.token = token;
    this.handlers = handlers;
    this.pending = new Map();
    this.nextId = 1;
    this.opened = false;
  }

  open() {
    // Browsers cannot set an Authorization header on a WebSocket handshake, so the token goes in ?token=,
    // which the daemon accepts on /ws only and never logs; use https (wss:) beyond localhost so the query
    // is encrypted like a header would be. The page's own URL never carries it (see takeToken).
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/ws?token=${encodeURIComponent(this.token)}`);
    this.ws = ws;
    ws.onopen = () => { this.opened = true; this.handlers.onOpen(); };
    ws.onmessage = (msg) => this.receive(msg.data);
    ws.onclose = (ev) => { this.failAll(); this.handlers.onClose(ev.code, this.opened); };
  }

  call(method, params = {}) {
    return new Promise((resolve, reject) => {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
        reject(new RpcError(-1, "not connected"));
        return;
      }
      const id = this.nextId++;
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  receive(text) {
    let msg;
    try { msg = JSON.parse(text); } catch { return; }
    for (const one of Array.isArray(msg) ? msg : [msg]) {
      if (one.method) this.handlers.onNotify(one.method, one.params || {});
      else this.settle(one);
    }
  }

  settle(reply) {
    const waiter = this.pending.get(reply.id);
    if (!waiter) return;
    this.pending.delete(reply.id);
    if (reply.error) waiter.reject(new RpcError(reply.error.code, reply.error.message, reply.error.data));
    else waiter.resolve(reply.result);
  }

  failAll() {
    for (const waiter of this.pending.values()) waiter.reject(new RpcError(-1, "connection closed"));
    this.pending.clear();
  }

  close() {
    if (!this.ws) return;
    this.ws.onclose = null;
    this.ws.close(1000);
    this.failAll();
  }
}

// ---------------------------------------------------------------- virtual list

class VList {
  // Draws only the rows in view (plus OVERSCAN): 10,000 items cost the same DOM as 30.
  constructor(el, part, keyOf, fill) {
    this.el = el;
    this.keyOf = keyOf;
    this.fill = fill;
    this.items = [];
    this.rows = new Map();
    this.inner = document.createElement("div");
    this.inner.className = "vinner";
    el.appendChild(this.inner);
    el.addEventListener("scroll", () => frame(part));
  }

  draw(follow = false) {
    const n = this.items.length;
    const height = `${n * ROW}px`;
    if (this.inner.style.height !== height) this.inner.style.height = height;
    if (follow) this.el.scrollTop = n * ROW;
    const top = this.el.scrollTop;
    const view = this.el.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW) - OVERSCAN);
    const last = Math.min(n, Math.ceil((top + view) / ROW) + OVERSCAN);
    const keep = new Set();
    for (let i = first; i < last; i++) keep.add(this.place(this.items[i], i));
    for (const [key, row] of this.rows) {
      if (!keep.has(key)) { row.remove(); this.rows.delete(key); }
    }
  }

  place(item, index) {
    const key = this.keyOf(item);
    let row = this.rows.get(key);
    if (!row) {
      row = document.createElement("div");
      this.rows.set(key, row);
      this.inner.appendChild(row);
    }
    const at = `translateY(${index * ROW}px)`;
    if (row.style.transform !== at) row.style.transform = at;
    if (row.item !== item) { row.item = item; this.fill(row, item); }
    return key;
  }
}

function span(text, cls) {
  // Event content is only ever text (textContent, never markup), whatever a client stored in it.
  const el = document.createElement("span");
  el.textContent = typeof text === "string" ? text : asText(text);
  if (cls) el.className = cls;
  return el;
}

function asText(value, max = 200) {
  // Any stored value as a short line of text: a string as it is, anything else as JSON.
  let text;
  try { text = typeof value === "string" ? value : JSON.stringify(value) ?? ""; } catch { text = String(value); }
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

function list(value) {
  return Array.isArray(value) ? value : [];
}

function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function clock(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleTimeString([], { hour12: false }) +
    "." + String(d.getMilliseconds()).padStart(3, "0");
}

function ago(iso) {
  const ms = Date.now() - new Date(iso).getTime();
  if (!Number.isFinite(ms)) return "";
  if (ms < 60000) return `${Math.max(0, Math.round(ms / 1000))}s ago`;
  if (ms < 3600000) return `${Math.round(ms / 60000)}m ago`;
  return `${Math.round(ms / 3600000)}h ago`;
}

// ---------------------------------------------------------------- state

const app = {
  token: null,
  rpc: null,
  attempt: 0,
  retryTimer: 0,
  pollTimer: 0,
  pollAt: 0,             // performance.now() when the scheduled poll runs
  sessions: new Map(),   // sessionId -> session view (replaced, never mutated, so rows redraw on change)
  order: [],             // sessionIds newest first, as session.list gives them
  filter: { state: "", status: "", agent: "" },
  samples: [],           // {rate, broken} per poll, for the chart
  lastPoll: null,        // {at, seqs} of the previous poll
  lastFetch: new Map(),  // sessionId -> seq whose last event was asked for
  detail: null,
  presenceTimer: 0,      // a presence read after a session.presence notification (fills in counts)
  leasesTimer: 0,        // a lease read after the timeline names a new entity or shows a conflict
};

function newDetail(id) {
  // presence: agentId -> {agentId, status, lastSeen, connections}, kept live from session.presence;
  // entities: every entity the timeline names (the leases panel shows the leases on them).
  return { id, items: [], lastSeq: 0, epoch: null, state: "", presence: null, entities: new Set(), tab: "timeline",
    note: "" };
}

// What the next frame must redraw: a live event in the open session redraws the timeline only.
const dirty = { list: false, detail: false, chart: false };
let framed = false;
function frame(...parts) {
  for (const part of parts.length ? parts : Object.keys(dirty)) dirty[part] = true;
  if (framed) return;
  framed = true;
  requestAnimationFrame(() => { framed = false; render(); });
}

// ---------------------------------------------------------------- sessions list

function stateOf(event, current) {
  if (event.stateTransition && event.stateTransition.to) return event.stateTransition.to;
  if (event.type === "broke") return "broken";
  if (event.type === "test_pass") return "working";
  return current;
}

function upsert(view) {
  const old = app.sessions.get(view.sessionId);
  app.sessions.set(view.sessionId, { lastType: old ? old.lastType : "", ...view });
}

async function loadSessions() {
  // The status filter is asked of the daemon: suspended, completed and archived sessions are listed only when
  // asked for by status (the default listing is the live sessions).
  const status = app.filter.status;
  const seen = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    const params = { limit: LIST_PAGE, ...(status ? { status } : {}), ...(cursor ? { cursor } : {}) };
    const result = await app.rpc.call("session.list", params);
    if (status !== app.filter.status) return;  // the filter changed meanwhile: its own listing is under way
    for (const view of list(result.sessions)) { upsert(view); seen.push(view.sessionId); }
    cursor = result.nextCursor;
    if (!cursor) break;
  }
  const listed = new Set(seen);
  const kept = [];
  for (const [id, s] of app.sessions) {
    if (listed.has(id)) continue;
    // A session suspended while the page is open stays, shown as suspended (the live listing leaves it out).
    if (!status && s.status === "suspended" && s.suspendedHere) kept.push(id);
    else app.sessions.delete(id);  // expired or deleted
  }
  app.order = [...seen, ...kept];
  sample();
  frame();
}

function suspendedHere(id, status) {
  // A status learnt live (a notification); a suspension is remembered so that the next poll keeps the row.
  const s = app.sessions.get(id);
  if (s) upsert({ ...s, status, suspendedHere: status === "suspended" });
}

function sample() {
  // Events per second from the seqs' growth between two polls; the broken count as it stands.
  const now = performance.now();
  const seqs = new Map();
  let broken = 0;
  for (const s of app.sessions.values()) { seqs.set(s.sessionId, s.seq); if (s.state === "broken") broken++; }
  if (app.lastPoll) {
    let grown = 0;
    for (const [id, seq] of seqs) grown += Math.max(0, seq - (app.lastPoll.seqs.get(id) || 0));
    const secs = Math.max(0.001, (now - app.lastPoll.at) / 1000);
    app.samples.push({ rate: grown / secs, broken });
    if (app.samples.length > CHART_POINTS) app.samples.shift();
  }
  app.lastPoll = { at: now, seqs };
}

function schedulePoll(delay = POLL_MS) {
  // Only ever brought forward: a burst of announcements (one per created session) must not keep pushing
  // the next poll back, or states and seqs would freeze for as long as the burst lasts.
  // Nor closer than MIN_POLL_GAP to the last one: a namespace busy with checkpoints announces many a second.
  const now = performance.now();
  const at = Math.max(now + delay, (app.lastPoll ? app.lastPoll.at : 0) + MIN_POLL_GAP);
  if (app.pollTimer && app.pollAt <= at) return;
  stopPoll();
  app.pollAt = at;
  app.pollTimer = setTimeout(() => { app.pollTimer = 0; poll(); }, at - now);
}

function stopPoll() {
  clearTimeout(app.pollTimer);
  app.pollTimer = 0;
}

async function poll() {
  try {
    if (!document.hidden) await loadSessions();
    if (!document.hidden && app.detail) await loadLeases();  // leases end and start without a notification to us
  } catch (err) {
    if (err.code !== -1) console.warn("session.list failed", err);
  }
  if (app.rpc && app.rpc.opened) schedulePoll();
}

function announced(note) {
  if (note.type === "new" && !app.sessions.has(note.sessionId)) {
    // Shown at once; the next poll (brought forward) fills in what the announcement does not carry.
    const now = new Date().toISOString();
    upsert({ sessionId: note.sessionId, state: "working", agentIds: note.agentId ? [note.agentId] : [], seq: 0,
      createdAt: now, updatedAt: now, labels: note.labels || {} });
    app.order.unshift(note.sessionId);
  } else if (note.type === "completed" && app.sessions.has(note.sessionId)) {
    upsert({ ...app.sessions.get(note.sessionId), state: "completed" });
  } else if (note.type === "suspended" || note.type === "resumed") {
    suspendedHere(note.sessionId, note.type === "suspended" ? "suspended" : "active");
  }
  frame();
  schedulePoll(250);
}

function visibleSessions() {
  const { state, status, agent } = app.filter;
  const needle = agent.trim().toLowerCase();
  const out = [];
  for (const id of app.order) {
    const s = app.sessions.get(id);
    if (!s) continue;
    if (state && s.state !== state) continue;
    if (status && (s.status || (s.state === "completed" ? "completed" : "active")) !== status) continue;
    if (needle && !list(s.agentIds).some((a) => String(a).toLowerCase().includes(needle))) continue;
    out.push(s);
  }
  return out;
}

function fillSession(row, s) {
  row.className = `row row-grid session ${s.state}` + (app.detail && app.detail.id === s.sessionId ? " selected" : "");
  row.dataset.session = s.sessionId;
  row.dataset.state = s.state;
  row.dataset.status = s.status || "";
  row.dataset.seq = String(s.seq);
  const status = s.status && s.status !== "active" && s.status !== s.state ? ` · ${s.status}` : "";
  row.replaceChildren(
    span(s.sessionId, "sid"),
    span(s.state + status, `state ${s.state}`),
    span(list(s.agentIds).join(", ") || "—", "agents"),
    span(String(s.seq), "num"),
    span((s.lastType ? s.lastType + " · " : "") + ago(s.updatedAt), "dim"),
  );
  if (s.seq > 0 && app.lastFetch.get(s.sessionId) !== s.seq) lastEvent(s.sessionId, s.seq);
}

async function lastEvent(id, seq) {
  // Only rows on screen ask, once per seq they show: a bounded number of small reads per poll.
  app.lastFetch.set(id, seq);
  try {
    const got = await app.rpc.call("session.get", { sessionId: id, since: seq - 1, limit: 1 });
    const s = app.sessions.get(id);
    if (got.events.length && s) { upsert({ ...s, lastType: got.events[0].type }); frame("list"); }
  } catch { /* gone or disconnected: the next poll says */ }
}

// ---------------------------------------------------------------- one session

async function openSession(id) {
  const old = app.detail;
  if (old && old.id === id) return;
  if (old) app.rpc.call("session.unsubscribe", { sessionId: old.id }).catch(() => {});
  app.detail = newDetail(id);
  timeline.items = [];
  timeline.el.scrollTop = 0;
  showTab("timeline");
  frame();
  await subscribe();
  loadPanels();
}

async function subscribe() {
  const d = app.detail;
  if (!d) return;
  // Resume like the Python client: after the last seq seen, in the epoch it came from.
  const params = { sessionId: d.id, since: d.lastSeq };
  if (d.epoch) params.epoch = d.epoch;
  try {
    const result = await app.rpc.call("session.subscribe", params);
    if (app.detail !== d) return;
    if (!result.recovered) {
      // The stored history is not the one we hold (expired and re-created, or lost): start over from what is
      // stored rather than show a timeline with a hole in it.
      await app.rpc.call("session.unsubscribe", { sessionId: d.id });
      Object.assign(d, newDetail(d.id), { note: "history changed on the daemon: reloaded" });
      await subscribe();
      return;
    }
    d.epoch = result.epoch;
  } catch (err) {
    if (app.detail === d) d.note = err.code === -32004 ? "session not found (expired?)" : `subscribe failed: ${err.message}`;
  }
  frame();
}

function onEvent(p) {
  const d = app.detail;
  const s = app.sessions.get(p.sessionId);
  if (s && p.seq > s.seq) {
    upsert({ ...s, seq: p.seq, state: stateOf(p.event, s.state), lastType: p.event.type,
      updatedAt: p.event.timestamp || s.updatedAt });
    app.lastFetch.set(p.sessionId, p.seq);  // its last event is this one: no need to ask
    frame("list");
  }
  if (!d || p.sessionId !== d.id || p.seq <= d.lastSeq) return;
  d.lastSeq = p.seq;
  // The timeline replays from seq 0, so the state before its first event is a new session's.
  const before = d.state || "working";
  d.state = stateOf(p.event, before);
  d.items.push({ key: p.seq, seq: p.seq, event: p.event, changed: d.state !== before });
  if (d.items.length > MAX_EVENTS) d.items.splice(0, d.items.length - MAX_EVENTS);
  noteEntities(d, p.event);
  if (p.event.type === "conflict") markConflicted(d, p.event);
  if (USAGE_EVENTS.has(p.event.type)) usage.soon();
  frame("detail");
}

function noteEntities(d, e) {
  // A new entity may have leases on it: the leases panel is read again (at most once per poll).
  const ids = (e.changeInfo && e.changeInfo.entityIds) || [];
  let grown = false;
  for (const id of ids) if (!d.entities.has(id)) { d.entities.add(id); grown = true; }
  if (grown) leasesSoon();
}

function leasesSoon() {
  // Many events naming new entities (a replay) cost one lease read.
  clearTimeout(app.leasesTimer);
  app.leasesTimer = setTimeout(() => loadLeases(), 300);
}

function markConflicted(d, e) {
  // The conflict event names the seq of the emit that touched a leased entity: that row is marked too.
  const seq = e.data && e.data.seq;
  if (typeof seq !== "number") return;
  for (let i = d.items.length - 1; i >= 0; i--) {
    const it = d.items[i];
    if (it.event && it.seq === seq) { d.items[i] = { ...it, conflicted: true }; break; }
    if (it.seq < seq) break;
  }
  leasesSoon();
}

function onCheckpoint(p) {
  const d = app.detail;
  if (!d || p.sessionId !== d.id) return;
  d.items.push({ key: `cp:${p.checkpointId}`, seq: d.lastSeq, checkpoint: p });
  frame();
}

function conflictText(data) {
  // Whatever the event holds: a conflict that is not the daemon's shape is shown as its text, never thrown on.
  const found = list(isObject(data) ? data.conflicts : null);
  const held = found.slice(0, 2).map((c) => isObject(c) ? `${asText(c.entityId)}${c.via ? ` (via ${asText(c.via)})` : ""}` +
    ` held by ${asText(c.heldBy)} (${asText(c.mode)})` : asText(c));
  const seq = isObject(data) && data.seq !== undefined ? asText(data.seq) : "?";
  return `seq ${seq} touched ${held.join(", ")}${found.length > 2 ? ` +${found.length - 2}` : ""}`;
}

function summary(e) {
  if (!isObject(e)) return asText(e);
  if (e.type === "conflict") return conflictText(e.data);
  const parts = [];
  const ci = e.changeInfo;
  if (isObject(ci)) {
    const ids = list(ci.entityIds).map((id) => asText(id));
    parts.push([ci.operation, ci.elementType].filter(Boolean).map((v) => asText(v)).join(" ") +
      (ids.length ? ` ${ids.slice(0, 3).join(", ")}` : "") + (ids.length > 3 ? ` +${ids.length - 3}` : ""));
  }
  const st = e.stateTransition;
  if (isObject(st)) parts.push(`${st.from ? asText(st.from) : "?"} → ${asText(st.to)}`);
  const impact = isObject(e.impact) ? e.impact : {};
  if (impact.severity) parts.push(`impact ${asText(impact.severity)}`);
  if (typeof impact.perfDelta === "number") parts.push(`perf ${impact.perfDelta}ms`);
  return parts.join(" · ");
}

function kindOf(item) {
  // A transition is drawn where the session's state changed (a test_pass while working changes nothing).
  const e = item.event;
  if (e.type === "conflict") return "conflict";
  if (e.type === "checkpoint") return "checkpoint";
  return item.changed ? "transition" : "";
}

function fillEvent(row, item) {
  if (item.checkpoint) {
    row.className = "row ev checkpoint marker";
    row.dataset.checkpoint = item.checkpoint.checkpointId;
    row.replaceChildren(span("◆", "num"), span(`checkpoint ${item.checkpoint.outcome}`, "type"),
      span(item.checkpoint.checkpointId, "dim"));
    return;
  }
  const e = item.event;
  row.dataset.seq = String(item.seq);
  row.dataset.type = asText(e.type);
  try {
    const broken = stateOf(e, "") === "broken" ? "broken" : "";
    row.className = ["row", "ev", kindOf(item), broken, item.conflicted ? "conflicted" : ""].filter(Boolean).join(" ");
    row.replaceChildren(span(String(item.seq), "num"), span(clock(e.timestamp), "dim time"), span(e.actor || "", "actor"),
      span(e.type, "type"), span(summary(e), "sum"));
  } catch {
    // Never a blank row, nor a broken list: the event as text.
    row.className = "row ev";
    row.replaceChildren(span(String(item.seq), "num"), span(asText(e.type), "type"), span(asText(e), "sum"));
  }
}

// ---------------------------------------------------------------- panels

function notAvailable(err) {
  return err.code === -32601 ? "not available on this daemon" : `unavailable: ${err.message}`;
}

function lines(box, items, line, empty, data) {
  // `data` gives each line's data-* attributes (what the tests and a user's devtools look for). A line that
  // cannot be drawn (a stored value of another shape) shows as text: one bad item never blanks the panel.
  const all = list(items);
  box.replaceChildren(...(all.length ? all.map((it) => {
    const p = document.createElement("div");
    p.className = "line";
    try {
      if (data) Object.assign(p.dataset, data(it));
      p.append(...line(it));
    } catch {
      p.replaceChildren(span(asText(it), "sum"));
    }
    return p;
  }) : [span(empty, "dim")]));
}

async function panel(box, call, show, first = true) {
  // A first read says "loading…"; a refresh keeps what is shown until the answer replaces it.
  const id = app.detail && app.detail.id;
  if (first) box.replaceChildren(span("loading…", "dim"));
  try {
    const result = await call();
    if (app.detail && app.detail.id === id) { delete box.dataset.code; show(result); }
  } catch (err) {
    if (app.detail && app.detail.id === id && err.code !== -1) {
      box.replaceChildren(span(notAvailable(err), "dim na"));
      box.dataset.code = String(err.code);
    }
  }
}

function loadPanels() {
  loadPresence(true);
  loadLeases(true);
}

async function loadPresence(first = false) {
  const d = app.detail;
  if (!d) return;
  await panel($("#presence"), () => app.rpc.call("presence.get", { sessionId: d.id }), (r) => {
    d.presence = new Map((r.agents || []).map((a) => [a.agentId, a]));
    drawPresence();
  }, first);
}

// A Claude Code session's own agent is `<token's agent>:<8 characters of the session id>`: its parent is the first part.
function parentOf(agentId) {
  const m = /^(.+):[A-Za-z0-9]{8}$/.exec(agentId);
  return m ? m[1] : "";
}

function drawPresence() {
  const d = app.detail;
  if (!d || !d.presence) return;
  const agents = [...d.presence.values()].sort((a, b) => a.agentId.localeCompare(b.agentId));
  lines($("#presence"), agents, (a) => [span(a.agentId, "actor"), span(` ${a.status}`, `presence ${a.status}`),
    span(parentOf(a.agentId) ? ` · session of ${parentOf(a.agentId)}` : "", "dim"),
    span(a.connections ? ` · ${a.connections} conn` : "", "dim"), span(a.lastSeen ? ` · ${ago(a.lastSeen)}` : "", "dim")],
  "nobody here", (a) => ({ agent: a.agentId, status: a.status }));
}

function onPresence(p) {
  // Applied at once (joined/active/idle/left); the next read fills in connections and lastSeen.
  const d = app.detail;
  if (!d || p.sessionId !== d.id || !d.presence) return;
  if (p.status === "left") d.presence.delete(p.agentId);
  else {
    const old = d.presence.get(p.agentId) || { agentId: p.agentId, connections: 0 };
    d.presence.set(p.agentId, { ...old, status: p.status === "joined" ? "active" : p.status,
      lastSeen: new Date().toISOString() });
  }
  drawPresence();
  clearTimeout(app.presenceTimer);
  app.presenceTimer = setTimeout(() => loadPresence(), 500);
}

async function allLeases() {
  // lease.list pages by nextCursor, each cut by count and by size (a page stays under a quarter of the send
  // buffer), so a page may hold fewer than asked; a namespace holds at most MEMENTO_LEASE_MAX (10,000) live leases.
  const leases = [];
  let cursor = null;
  for (let page = 0; page < 500 && leases.length < 10000; page++) {
    const r = await app.rpc.call("lease.list", cursor ? { limit: 1000, cursor } : { limit: 1000 });
    leases.push(...(r.leases || []));
    cursor = r.nextCursor;
    if (!cursor) break;
  }
  return { leases };
}

function sessionLeases(d, leases) {
  // Taken for this session, or on an entity its timeline names (directly or through what the lease covers).
  return leases.filter((l) => l.sessionId === d.id ||
    [...(l.entityIds || []), ...(l.covers || [])].some((e) => d.entities.has(e)));
}

async function loadLeases(first = false) {
  const d = app.detail;
  if (!d) return;
  await panel($("#leases"), allLeases, (r) =>
    lines($("#leases"), sessionLeases(d, r.leases), (l) => [span((l.entityIds || []).join(", "), "sid"),
      span(` ${l.mode}`, `mode ${l.mode}`), span(` ${l.agentId}`, "actor"), span(` until ${clock(l.expiresAt)}`, "dim")],
    "no leases", (l) => ({ lease: l.leaseId, agent: l.agentId })), first);
}

function showTab(name) {
  for (const b of document.querySelectorAll(".tabs button")) b.classList.toggle("on", b.dataset.tab === name);
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.dataset.tab !== name;
  if (app.detail) app.detail.tab = name;
  if (name === "handoff") loadHandoff();
  if (name === "conversation") loadConversation();
  frame();
}

function heading(text) { const h = document.createElement("h3"); h.textContent = text; return h; }

function loadHandoff() {
  const box = $("#handoff");
  panel(box, () => app.rpc.call("bridge.handoff", { sessionId: app.detail.id }), (r) => {
    const recent = document.createElement("div");
    lines(recent, r.recentChanges, (c) => [span(`#${c.seq ?? ""} `, "num"), span(c.type || "", "type"), span(` ${summary(c)}`, "sum")], "no changes yet");
    const kg = document.createElement("div");
    lines(kg, r.kgContext, (k) => [span(k.entityId, "sid"), span(` related ${list(k.related).length}`, "dim"),
      span(k.lastAnchor ? ` last anchor: ${k.lastAnchor.outcome || ""}` : "", "dim")], "no knowledge-graph context");
    const advice = span(typeof r.joiningAdvice === "string" ? r.joiningAdvice : JSON.stringify(r.joiningAdvice ?? ""), "advice");
    advice.id = "advice";
    box.replaceChildren(span(`${r.sessionId} · ${r.state} · ${(r.agentIds || []).join(", ")}`, "dim"),
      heading("Joining advice"), advice, heading("Recent changes"), recent, heading("Knowledge graph"), kg,
      heading("Leases on its entities"), holds(r.leases, "handoff-leases", "no leases on its entities"),
      heading("Open conflicts (held outside the session)"),
      holds(r.openConflicts, "handoff-conflicts", "no open conflicts"));
  });
}

function holds(list, id, empty) {
  // bridge.handoff's live holds, `{entityId, heldBy, leaseId, mode, via?}`; absent on a daemon without leases.
  const box = document.createElement("div");
  box.id = id;
  lines(box, list || [], (h) => [span(h.entityId, "sid"), span(` ${h.mode}`, `mode ${h.mode}`),
    span(` ${h.heldBy}`, "actor"), span(h.via ? ` via ${h.via}` : "", "dim")], empty,
  (h) => ({ lease: h.leaseId, agent: h.heldBy }));
  return box;
}

function blockText(b) {
  if (b.kind === "tool_use") {
    const out = typeof b.output === "string" ? ` → ${b.output}` : "";
    return `${b.toolName || "tool"}(${b.input === undefined ? "" : JSON.stringify(b.input)})${out}`;
  }
  return typeof b.content === "string" ? b.content : JSON.stringify(b.content ?? "");
}

function loadConversation(thread = null, before = []) {
  // A page (session.conversation's default, 200 blocks) of one thread, the main one or a subagent's;
  // "more" appends the next page to the blocks already shown.
  const box = $("#conversation");
  const params = { sessionId: app.detail.id, cursor: before.length };
  if (thread) params.subagentId = thread;
  panel(box, () => app.rpc.call("session.conversation", params), (r) => {
    const blocks = [...before, ...(r.blocks || [])];
    const list = document.createElement("div");
    lines(list, blocks, (b) => [span(`${b.kind} `, `actor kind-${b.kind}`),
      span(b.status === "pending" ? "… " : "", "dim"), span(blockText(b), "sum")], "no conversation recorded",
    (b) => ({ block: b.id, kind: b.kind, status: b.status }));
    const head = [`${r.blockCount} blocks`, thread ? `subagent ${thread}` : "",
      r.subagentCount ? `${r.subagentCount} subagents` : "", r.idle ? "idle" : "",
      r.nextCursor !== undefined ? `first ${blocks.length} shown` : ""];
    const parts = [span(head.filter(Boolean).join(" · "), "dim")];
    if (r.subagentCount) parts.push(threadButtons(r.subagents || [], thread));
    parts.push(list);
    if (r.nextCursor !== undefined) parts.push(button("more", () => loadConversation(thread, blocks)));
    box.replaceChildren(...parts);
  }, before.length === 0);
}

function threadButtons(subagents, current) {
  // The main thread and each subagent's (its type or description, status and block count).
  const row = document.createElement("div");
  row.className = "threads";
  const pick = (id, label) => {
    const b = button(label, () => loadConversation(id));
    b.dataset.thread = id || "main";
    b.classList.toggle("on", id === current);
    return b;
  };
  row.append(pick(null, "main"), ...subagents.map((s) =>
    pick(s.id, `${s.subagentType || s.description || s.id} (${s.status || "running"}, ${s.blockCount} blocks)`)));
  return row;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

// ---------------------------------------------------------------- chart

function drawChart() {
  const canvas = $("#chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== width * ratio) { canvas.width = width * ratio; canvas.height = height * ratio; }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const pts = app.samples;
  canvas.dataset.samples = String(pts.length);
  canvas.dataset.rates = pts.map((p) => p.rate.toFixed(1)).join(" ");  // what the line draws, for a reader
  gridlines(g, width, height);
  if (!pts.length) {
    // The first rate needs two polls: say so rather than show an empty box.
    g.fillStyle = "#8a93a3";
    g.fillText("measuring…", 8, height / 2);
  } else {
    const step = width / (CHART_POINTS - 1);
    const xs = pts.map((_, i) => width - 6 - (pts.length - 1 - i) * step);
    brokenBars(g, pts, xs, height);
    rateLine(g, pts, xs, height);
  }
  setText("#rate", (pts.length ? pts[pts.length - 1].rate : 0).toFixed(1));
}

function gridlines(g, width, height) {
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#262c36";
  g.lineWidth = 1;
  for (const f of [0.25, 0.5, 0.75, 1]) {
    const at = Math.round(4 + (height - 8) * f) + 0.5;
    g.beginPath(); g.moveTo(0, at); g.lineTo(width, at); g.stroke();
  }
}

function brokenBars(g, pts, xs, height) {
  // Their own scale (the broken count is not a rate): the highest count fills 40% of the height.
  const most = Math.max(1, ...pts.map((p) => p.broken));
  g.fillStyle = "rgba(229, 72, 77, 0.6)";
  pts.forEach((p, i) => {
    const h = (p.broken / most) * (height - 8) * 0.4;
    if (h) g.fillRect(xs[i] - 2, height - 4 - h, 4, h);
  });
}

function rateLine(g, pts, xs, height) {
  const top = Math.max(1, ...pts.map((p) => p.rate)) * 1.1;
  const y = (v) => height - 4 - (v / top) * (height - 8);
  g.beginPath();
  pts.forEach((p, i) => (i ? g.lineTo(xs[i], y(p.rate)) : g.moveTo(xs[i], y(p.rate))));
  g.strokeStyle = "#4f9dff";
  g.lineWidth = 2;
  g.stroke();
  g.lineTo(xs[xs.length - 1], height - 4);
  g.lineTo(xs[0], height - 4);
  g.closePath();
  g.fillStyle = "rgba(79, 157, 255, 0.15)";
  g.fill();
  const last = pts[pts.length - 1];
  g.fillStyle = "#4f9dff";
  g.beginPath(); g.arc(xs[xs.length - 1], y(last.rate), 3, 0, 2 * Math.PI); g.fill();
  g.fillStyle = "#8a93a3";
  g.fillText(`${Math.round(top / 1.1)}/s`, 4, 12);
}

// ---------------------------------------------------------------- render (once per frame)

const sessionList = new VList($("#sessions"), "list", (s) => s.sessionId, fillSession);
const timeline = new VList($("#timeline"), "detail", (it) => it.key, fillEvent);
const usage = new Usage((method, params) => app.rpc.call(method, params), usageTargets);

function usageTargets() {
  // The open session and the newest listed ones; the agents of the listed sessions (Usage bounds both).
  const sessions = app.detail ? [app.detail.id] : [];
  const agents = new Set();
  for (const id of app.order) {
    if (!sessions.includes(id)) sessions.push(id);
    for (const agent of list((app.sessions.get(id) || {}).agentIds)) agents.add(String(agent));
  }
  return { sessions, agents: [...agents] };
}

function setText(sel, text) {
  // Unchanged text is left alone: rewriting it would cost a layout in every frame.
  const el = $(sel);
  if (el.textContent !== text) el.textContent = text;
}

function render() {
  if (dirty.list) {
    const shown = visibleSessions();
    sessionList.items = shown;
    sessionList.draw();
    setText("#count", shown.length === app.sessions.size ? `${shown.length}` : `${shown.length} of ${app.sessions.size}`);
    let broken = 0;  // as the list stands now, not as of the last poll
    for (const s of app.sessions.values()) if (s.state === "broken") broken++;
    setText("#broken", String(broken));
  }
  if (dirty.detail || dirty.list) renderDetail();
  if (dirty.chart) drawChart();
  dirty.list = dirty.detail = dirty.chart = false;
}

function renderDetail() {
  const d = app.detail;
  $("#empty").hidden = Boolean(d);
  $("#detail").hidden = !d;
  $("#p-presence").hidden = !d;
  $("#p-leases").hidden = !d;
  if (!d) return;
  const s = app.sessions.get(d.id);
  const state = (s && s.state) || d.state || "";
  setText("#d-title", d.id);
  setText("#d-state", state);
  $("#d-state").className = `state ${state}`;
  setText("#d-meta", [s && s.status ? `status ${s.status}` : "", s ? `agents ${list(s.agentIds).join(", ") || "—"}` : "", `seq ${d.lastSeq}`,
    d.epoch ? `epoch ${d.epoch}` : "", d.note].filter(Boolean).join(" · "));
  setText("#tl-count", `${d.items.length} rows`);
  timeline.items = d.items;
  timeline.draw($("#follow").checked);
}

// ---------------------------------------------------------------- connection

function setConn(state, text) {
  const pill = $("#conn");
  pill.dataset.state = state;
  pill.className = `pill ${state}`;
  pill.textContent = text;
}

function banner(text) {
  const el = $("#banner");
  el.textContent = text || "";
  el.hidden = !text;
}

function showLogin(message) {
  clearTimeout(app.retryTimer);
  stopPoll();
  usage.stop();
  if (app.rpc) app.rpc.close();
  app.rpc = null;
  app.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  banner("");
  setConn("off", "not connected");
  $("#who").textContent = "";
  $("#logout").hidden = true;
  $("#main").hidden = true;
  $("#login").hidden = false;
  $("#login-msg").textContent = message || "";
  $("#token").value = "";
  $("#token").focus();
}

function start(token) {
  app.token = token;
  const c = claims(token);
  $("#who").textContent = c.sub ? `${c.sub} @ ${c.ns || "?"}` : "";
  $("#login").hidden = true;
  $("#main").hidden = false;
  $("#logout").hidden = false;
  app.attempt = 0;
  connect();
}

function connect() {
  setConn("connecting", "connecting…");
  app.rpc = new Rpc(app.token, { onOpen: opened, onClose: closed, onNotify: notified });
  app.rpc.open();
}

async function opened() {
  app.attempt = 0;
  banner("");
  setConn("live", "live");
  try {
    await app.rpc.call("sessions.watch");
    await loadSessions();
    if (app.detail) { await subscribe(); loadPanels(); }
  } catch (err) {
    if (err.code !== -1) banner(`The daemon answered an error: ${err.message}`);
  }
  schedulePoll();
  usage.start();
}

async function closed(code, wasOpen) {
  stopPoll();
  usage.stop();
  if (code === 4001) { showLogin("Token expired: paste a fresh one."); return; }
  if (!wasOpen && await daemonUp()) {
    // The handshake failed while the daemon answers HTTP: it refused the token (HTTP 401). A browser never
    // sees the status of a failed WebSocket handshake, only a close before open.
    const exp = claims(app.token).exp;
    showLogin(exp && exp * 1000 < Date.now() ? "Token refused: it has expired." : "Token refused by the daemon (HTTP 401): check it and try again.");
    return;
  }
  const delay = Math.min(10000, 500 * 2 ** app.attempt) * (0.5 + Math.random() / 2);
  app.attempt++;
  setConn("down", "disconnected");
  banner(`Disconnected, reconnecting in ${(delay / 1000).toFixed(1)} s (attempt ${app.attempt})…`);
  app.retryTimer = setTimeout(connect, delay);
}

async function daemonUp() {
  try {
    const r = await fetch("/healthz", { cache: "no-store" });
    return r.ok;
  } catch {
    return false;
  }
}

const LIFECYCLE = new Map([["session.suspended", "suspended"], ["session.resumed", "active"],
  ["session.forked", null], ["session.compacted", null]]);

function onLifecycle(method, p) {
  // A status change shows at once; a fork or compaction is noted in the timeline's header; the poll confirms.
  const status = LIFECYCLE.get(method);
  if (status) suspendedHere(p.sessionId, status);
  if (app.detail && app.detail.id === p.sessionId) app.detail.note = method.replace("session.", "");
  frame();
  schedulePoll(250);
}

function onRecovery(p) {
  // The session lost writes in a Redis failover: the daemon sends its stored history again, under a new
  // epoch, right after this notice; what the page drew before may include events that are gone.
  const d = app.detail;
  if (!d || d.id !== p.sessionId) return;
  app.detail = newDetail(d.id);
  app.detail.note = "history lost in a Redis failover: shown again from storage";
  timeline.items = [];
  frame();
  loadPanels();
}

function notified(method, params) {
  if (method === "session.event") onEvent(params);
  else if (method === "session.recovery") onRecovery(params);
  else if (method === "session.checkpoint") onCheckpoint(params);
  else if (method === "sessions.announce") announced(params);
  else if (method === "session.presence") onPresence(params);
  else if (LIFECYCLE.has(method)) onLifecycle(method, params);
}

// ---------------------------------------------------------------- wiring

$("#login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("#token").value.trim();
  if (!token) { $("#login-msg").textContent = "Paste a token first."; return; }
  sessionStorage.setItem(TOKEN_KEY, token);
  start(token);
});
$("#logout").addEventListener("click", () => showLogin("Token forgotten."));
$("#sessions").addEventListener("click", (ev) => {
  const row = ev.target.closest("[data-session]");
  if (row) openSession(row.dataset.session);
});
for (const [sel, key] of [["#f-state", "state"], ["#f-status", "status"], ["#f-agent", "agent"]]) {
  // `change` too: a keyboard or scripted choice on a select fires only that.
  for (const kind of ["input", "change"]) $(sel).addEventListener(kind, (ev) => filterBy(key, ev.target.value));
}

function filterBy(key, value) {
  if (app.filter[key] === value) return;
  app.filter[key] = value;
  if (key === "status") {
    // Another status is another listing: asked at once, the rows of the previous one dropped.
    app.sessions.clear();
    app.order = [];
    app.lastPoll = null;
    if (app.rpc && app.rpc.opened) loadSessions().catch(() => {});
  }
  frame();
}
for (const b of document.querySelectorAll(".tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
$("#timeline").addEventListener("wheel", () => { $("#follow").checked = false; }, { passive: true });
$("#follow").addEventListener("change", () => frame());
window.addEventListener("resize", () => frame());

const initial = takeToken();
if (initial) start(initial);
else showLogin("");
