// The usage panel: what the agents cost, per agent and per session, and the namespace's spend per hour over
// the last 24 hours. Read with usage.get in a bounded poll (brought forward when the open session reports
// usage); a reply of an unexpected shape is shown as its text, never thrown on, and a cost the source did not
// give is "unknown", never 0.

const POLL_MS = 3000;      // usage has no notification of its own: it is polled
const MIN_GAP = 1000;      // ms between two reads however many usage events arrive
const MAX_SESSIONS = 10;   // sessions read per poll: the newest listed, and the open one
const MAX_AGENTS = 12;     // agents read per poll: those of the listed sessions
const RUN_PAGE = 500;      // usage.get's largest page
const AGENT_PAGES = 2;     // pages of one agent's runs of the last 24 hours read per poll
const HOURS = 24;
const HOUR_MS = 3600000;
const COUNTS = ["inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens", "runs", "costUnknownRuns"];

function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function asText(value, max = 300) {
  let text;
  try { text = typeof value === "string" ? value : JSON.stringify(value) ?? ""; } catch { text = String(value); }
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

function span(text, cls) {
  const el = document.createElement("span");
  el.textContent = text;
  if (cls) el.className = cls;
  return el;
}

function totalsOf(reply) {
  // usage.get's `totals`, checked: counts are whole numbers, the cost a number or null (unknown).
  const t = isObject(reply) ? reply.totals : null;
  if (!isObject(t)) throw new TypeError("no totals");
  for (const name of COUNTS) if (!Number.isSafeInteger(t[name] ?? 0)) throw new TypeError(name);
  if (t.costUsd !== null && !Number.isFinite(t.costUsd)) throw new TypeError("costUsd");
  return t;
}

export function tokens(n) {
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}

export function dollars(cost) {
  return `$${cost >= 1 ? cost.toFixed(2) : cost.toFixed(4)}`;
}

export function costText(t) {
  // Unknown stays unknown: a total over runs some of which gave no cost says how many.
  if (t.costUsd === null) return t.runs || t.inputTokens || t.outputTokens ? "cost unknown" : "no cost";
  const unknown = t.costUnknownRuns || 0;
  return dollars(t.costUsd) + (unknown ? ` + unknown (${unknown} run${unknown > 1 ? "s" : ""})` : "");
}

function usageLine(key, id, cls, reply) {
  // One agent's or session's totals; anything else (an error, a reply of another shape) as text.
  const p = document.createElement("div");
  p.className = "line";
  p.dataset[key] = id;
  try {
    if (reply instanceof Error) throw reply;
    const t = totalsOf(reply);
    Object.assign(p.dataset, { input: String(t.inputTokens ?? 0), output: String(t.outputTokens ?? 0),
      cost: t.costUsd === null ? "unknown" : String(t.costUsd), unknownRuns: String(t.costUnknownRuns ?? 0) });
    p.append(span(id, cls), span(` ${tokens(t.inputTokens ?? 0)} in · ${tokens(t.outputTokens ?? 0)} out`, "dim"),
      span(` · ${costText(t)}`, t.costUsd === null ? "cost unknown" : "cost"));
  } catch (err) {
    p.dataset.malformed = "1";
    p.replaceChildren(span(id, cls), span(` ${err instanceof Error && err.code !== undefined ? err.message : asText(reply)}`, "sum"));
  }
  return p;
}

export function hourly(runs, now) {
  // The runs of the last HOURS clock hours by the hour they started: cost, runs, runs of unknown cost.
  const current = Math.floor(now / HOUR_MS) * HOUR_MS;
  const hours = Array.from({ length: HOURS }, (_, i) => ({ at: current - (HOURS - 1 - i) * HOUR_MS, cost: 0,
    runs: 0, unknown: 0 }));
  for (const run of runs) {
    if (!isObject(run)) continue;
    const at = Date.parse(run.startedAt);
    const slot = HOURS - 1 - Math.floor((current - Math.floor(at / HOUR_MS) * HOUR_MS) / HOUR_MS);
    if (!Number.isFinite(at) || slot < 0 || slot >= HOURS) continue;
    const hour = hours[slot];
    hour.runs++;
    if (Number.isFinite(run.costUsd)) hour.cost += run.costUsd;
    else hour.unknown++;
  }
  return hours;
}

export class Usage {
  // call(method, params) -> Promise; targets() -> {sessions, agents} to read (each list bounded here again).
  constructor(call, targets) {
    this.call = call;
    this.targets = targets;
    this.timer = 0;
    this.at = 0;        // performance.now() of the scheduled read
    this.last = 0;      // performance.now() of the last read's start
    this.busy = false;
    this.running = false;
  }

  start() {
    this.running = true;
    this.schedule(0);
  }

  stop() {
    this.running = false;
    clearTimeout(this.timer);
    this.timer = 0;
  }

  soon() {
    // A usage event in the open session: read again shortly (never closer than MIN_GAP to the last read).
    if (this.running) this.schedule(300);
  }

  schedule(delay) {
    const now = performance.now();
    const at = Math.max(now + delay, this.last + MIN_GAP);
    if (this.timer && this.at <= at) return;
    clearTimeout(this.timer);
    this.at = at;
    this.timer = setTimeout(() => { this.timer = 0; this.refresh(); }, at - now);
  }

  async refresh() {
    if (this.busy) { this.schedule(MIN_GAP); return; }
    this.busy = true;
    this.last = performance.now();
    try {
      if (!document.hidden) await this.read();
    } catch (err) {
      if (err.code !== -1) this.unavailable(err);
    } finally {
      this.busy = false;
      if (this.running) this.schedule(POLL_MS);
    }
  }

  async read() {
    const { sessions, agents } = this.targets();
    const since = new Date(Date.now() - HOURS * HOUR_MS).toISOString();
    const kept = (promise) => promise.catch((err) => { if (err.code === -1 || err.code === -32601) throw err; return err; });
    const [total, perSession, perAgent] = await Promise.all([
      kept(this.call("usage.get", {})),
      Promise.all(sessions.slice(0, MAX_SESSIONS).map((id) => kept(this.call("usage.get", { sessionId: id, limit: 1 })))),
      Promise.all(agents.slice(0, MAX_AGENTS).map((id) => kept(this.agentRuns(id, since)))),
    ]);
    this.draw(total, sessions.slice(0, MAX_SESSIONS), perSession, agents.slice(0, MAX_AGENTS), perAgent);
  }

  async agentRuns(agentId, since) {
    // The agent's totals and its runs started in the last 24 hours (a bounded number of pages).
    const first = await this.call("usage.get", { agentId, since, limit: RUN_PAGE });
    const runs = Array.isArray(first && first.runs) ? [...first.runs] : [];
    let cursor = isObject(first) ? first.nextCursor : undefined;
    for (let page = 1; page < AGENT_PAGES && typeof cursor === "string"; page++) {
      const next = await this.call("usage.get", { agentId, since, limit: RUN_PAGE, cursor });
      runs.push(...(Array.isArray(next && next.runs) ? next.runs : []));
      cursor = isObject(next) ? next.nextCursor : undefined;
    }
    return isObject(first) ? { ...first, runs } : first;
  }

  unavailable(err) {
    const text = err.code === -32601 ? "not available on this daemon" : `unavailable: ${err.message}`;
    document.querySelector("#u-total").textContent = text;
    document.querySelector("#u-total").dataset.code = String(err.code);
  }

  draw(total, sessions, perSession, agents, perAgent) {
    const head = document.querySelector("#u-total");
    delete head.dataset.code;
    try {
      const t = totalsOf(total);
      head.textContent = `namespace ${tokens(t.inputTokens)} in · ${tokens(t.outputTokens)} out · ${costText(t)}`;
      head.dataset.cost = t.costUsd === null ? "unknown" : String(t.costUsd);
    } catch {
      head.textContent = total instanceof Error ? total.message : asText(total);
      head.dataset.cost = "";
    }
    const lines = (box, ids, replies, key, cls, empty) => box.replaceChildren(...(ids.length ? ids.map((id, i) =>
      usageLine(key, id, cls, replies[i])) : [span(empty, "dim")]));
    lines(document.querySelector("#u-agents"), agents, perAgent, "agent", "actor", "no agents");
    lines(document.querySelector("#u-sessions"), sessions, perSession, "session", "sid", "no sessions");
    const seen = new Set();
    const runs = [];
    for (const reply of perAgent) {
      for (const run of (isObject(reply) && Array.isArray(reply.runs) ? reply.runs : [])) {
        const key = isObject(run) ? `${run.sessionId} ${run.runId}` : "";
        if (key && !seen.has(key)) { seen.add(key); runs.push(run); }
      }
    }
    this.chart(hourly(runs, Date.now()));
  }

  chart(hours) {
    // One bar per clock hour, oldest left; an hour with runs of unknown cost gets an amber cap, an hour whose
    // every run is of unknown cost an amber stub: unknown is never drawn as nothing.
    const svg = document.querySelector("#spend");
    const [width, height] = [HOURS * 10, 60];
    const most = Math.max(0, ...hours.map((h) => h.cost));
    const bars = [];
    hours.forEach((h, i) => {
      if (!h.runs) return;
      const high = most > 0 ? Math.max(1, (h.cost / most) * (height - 6)) : (h.unknown ? 0 : 1);
      const rect = document.createElementNS(svg.namespaceURI, "rect");
      const cap = h.unknown ? 3 : 0;
      for (const [name, value] of [["x", i * 10 + 1], ["y", height - high - cap], ["width", 8], ["height", high + cap]]) {
        rect.setAttribute(name, String(value));
      }
      rect.setAttribute("class", h.unknown ? (h.cost ? "bar part-unknown" : "bar unknown") : "bar");
      rect.setAttribute("data-hour", new Date(h.at).toISOString());
      rect.setAttribute("data-cost", String(h.cost));
      rect.setAttribute("data-runs", String(h.runs));
      rect.setAttribute("data-unknown", String(h.unknown));
      const title = document.createElementNS(svg.namespaceURI, "title");
      title.textContent = `${new Date(h.at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false })}: ` +
        `${dollars(h.cost)}${h.unknown ? ` + unknown (${h.unknown} runs)` : ""}, ${h.runs} runs`;
      rect.append(title);
      bars.push(rect);
    });
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.replaceChildren(...bars);
    document.querySelector("#u-scale").textContent = bars.length ? `highest ${dollars(most)}/h · last 24 h` : "no runs in the last 24 h";
  }
}
