/* The crewlet dashboard: plain JavaScript, no build step, no dependencies.
 *
 * It talks to this node's API (/v1, roles/ingress/api) with the token the
 * operator gave it:
 *
 *   - the live state comes from GET /v1/events, a Server-Sent Events stream
 *     read with fetch (EventSource cannot send an Authorization header): a
 *     `snapshot` replaces everything, every other event is a change to apply;
 *     after a drop it reconnects with Last-Event-ID, backing off;
 *   - tasks, pages, search, conversations and dead letters are read when shown;
 *   - pending approvals are read every few seconds, and soon after a
 *     conversation run's turn shows in the feed (they are not on it);
 *   - requeue, mail and an approval's decision are POSTs.
 *
 * Every piece of data reaches the page through textContent or setAttribute,
 * never as HTML.
 */
"use strict";

(() => {
  const TOKEN_KEY = "crewlet.token";
  const FEED_MAX = 100;            // turns kept in the live feed
  const PILE_UP = 5;               // waiting messages from which a seat's mail is "piling up"
  const EXCERPT = 220;             // characters of a reply shown in the feed
  const BACKOFF_MAX = 30000;       // ms between reconnects, at most
  const SILENT_MAX = 45000;        // ms without a byte (keepalives come every 15 s): reconnect
  const PAGE = 50;                 // rows asked per page of tasks, pages, dead letters, conversations
  const APPROVALS_PAGE = 100;      // pending approvals read at once (oldest first)
  const APPROVALS_EVERY = 5000;    // ms between reads of the pending approvals
  const EXPIRY_SOON = 300;         // seconds left from which an approval's expiry shows amber
  const NOTE_MAX = 2000;           // characters of a decision's note (the API's limit)
  const CONV_MESSAGES = 500;       // messages of a conversation read at once
  const RUN_TRIGGER = "run=";      // a conversation run's turn: its trigger's start

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ DOM helpers

  /** An element: attrs set with setAttribute (or as a property for `text`,
   *  `hidden`, `disabled`, `on*`), children as nodes or text. Never HTML. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "hidden" || key === "disabled") node[key] = Boolean(value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function setText(node, text) {
    text = String(text);
    if (node.textContent !== text) node.textContent = text;
  }

  /** Keep *container*'s children one element per item, in order: an item's
   *  element is built again only when its signature changed, so rows that did
   *  not change keep their focus and their buttons stay clickable. */
  function reconcile(container, cache, items, keyOf, sigOf, build) {
    const seen = new Set();
    let previous = null;
    for (const item of items) {
      const key = keyOf(item);
      seen.add(key);
      const sig = sigOf(item);
      let entry = cache.get(key);
      if (!entry) {
        entry = { el: build(item), sig };
        cache.set(key, entry);
      } else if (entry.sig !== sig) {
        const fresh = build(item);
        if (entry.el.parentNode) entry.el.replaceWith(fresh);
        entry.el = fresh;
        entry.sig = sig;
      }
      const wanted = previous ? previous.nextSibling : container.firstChild;
      if (wanted !== entry.el) container.insertBefore(entry.el, wanted);
      previous = entry.el;
    }
    for (const [key, entry] of cache) {
      if (!seen.has(key)) {
        entry.el.remove();
        cache.delete(key);
      }
    }
  }

  /** A coloured state label. kind: ok | warn | bad | unknown | info. */
  function pill(kind, text, title) {
    return el("span", { class: `pill ${kind}`, title: title || null, "data-kind": kind }, text);
  }

  // ------------------------------------------------------------------ words

  const ROLE_WORDS = {
    data: "keeps a copy of the estate (tasks, pages, turns)",
    ingress: "serves the API and this dashboard",
    seats: "runs seats: the agents' turns",
    workers: "runs fleet-wide duties",
  };
  const CHILD_WORDS = {
    broker: "the message broker (NATS) the fleet talks through",
    fleet: "fleet membership: presence and leases",
    data_applier: "keeps this node's estate copy up to date",
    ingress: "serves the API and this dashboard",
    seats: "runs the seats' turns",
    workers: "runs fleet-wide duties",
  };
  const DUTY_WORDS = {
    fleet_shape: "checks that the fleet, as assembled, can do every job",
    mailbox_retirement: "removes mailboxes of seats the company dropped and trims worked mail",
  };
  const CHILD_STATES = {
    running: ["ok", "Running", "running normally"],
    starting: ["warn", "Starting", "being started"],
    backoff: ["warn", "Restarting soon", "exited; waiting a moment before it is started again"],
    stopping: ["warn", "Stopping", "being stopped"],
    exited: ["bad", "Exited", "exited; its supervisor decides what next"],
    stopped: ["bad", "Stopped", "not running"],
    fatal: ["bad", "Failed, gave up", "will not be started again: it kept failing or its configuration is wrong"],
  };
  const OUTCOMES = {
    running: ["ok", "Working…", "the seat is working on this message now"],
    done: ["ok", "Done", "the seat answered"],
    failed: ["bad", "Failed", "the turn failed"],
    deferred: ["warn", "Waiting", "the seat is not taking mail for now"],
    skipped: ["unknown", "Already done", "this message had been worked before: nothing done again"],
    fenced: ["warn", "Handed over", "the seat moved to another node mid-turn; that node works the message"],
    interrupted: ["warn", "Interrupted", "the seat was released mid-turn; the message goes back to its mailbox"],
    unsettled: ["warn", "Not recorded", "worked, but its record could not be written; it will be tried again"],
  };

  function humanize(name) {
    const words = String(name).replace(/[_-]+/g, " ").trim();
    return words.charAt(0).toUpperCase() + words.slice(1);
  }

  /** Who sent a message, in words: a seat, the API under a token's name, crewletctl. */
  function senderWords(sender) {
    if (!sender) return null;
    if (sender.startsWith("api:")) return `from the API (${sender.slice(4)})`;
    return `from ${sender}`;
  }

  function outcomeInfo(outcome) {
    return OUTCOMES[outcome] || ["unknown", humanize(outcome || "unknown"), null];
  }

  // ------------------------------------------------------------------ time

  let skew = 0;  // server clock minus ours, in seconds (from the snapshot)

  function now() {
    return Date.now() / 1000 + skew;
  }

  function ago(ts) {
    if (typeof ts !== "number" || !isFinite(ts)) return "—";
    const d = now() - ts;
    if (d < -5) return "in " + span(-d);
    if (d < 5) return "just now";
    return span(d) + " ago";
  }

  function span(seconds) {
    if (seconds < 60) return `${Math.floor(seconds)} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
    const days = Math.floor(seconds / 86400);
    return days === 1 ? "1 day" : `${days} days`;
  }

  function absolute(ts) {
    return new Date((ts - skew) * 1000).toLocaleString();
  }

  /** A relative time kept fresh by the ticker; the absolute one on hover. */
  function when(ts, prefix) {
    if (typeof ts !== "number" || !isFinite(ts)) return el("span", { class: "muted" }, "—");
    return el("time", {
      "data-ts": ts, "data-prefix": prefix || "", datetime: new Date((ts - skew) * 1000).toISOString(),
      title: absolute(ts),
    }, (prefix || "") + ago(ts));
  }

  function duration(ms) {
    if (typeof ms !== "number" || !isFinite(ms)) return "—";
    if (ms < 1) return "under 1 ms";
    if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
    return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  }

  function excerpt(text, max) {
    text = String(text || "").replace(/\s+/g, " ").trim();
    return text.length > max ? text.slice(0, max - 1) + "…" : text;
  }

  // ------------------------------------------------------------------ token

  let token = null;

  // The token lives in this tab's sessionStorage (gone when the tab is), unless
  // the person ticked "Keep me signed in": then in localStorage. Signing out,
  // or a token the node refuses, clears both.
  function storedToken() {
    for (const store of ["sessionStorage", "localStorage"]) {
      try {
        const value = window[store].getItem(TOKEN_KEY);
        if (value) return value;
      } catch (e) { /* storage refused (private mode): not kept */ }
    }
    return null;
  }

  function storeToken(value, keep) {
    token = value;
    for (const store of ["sessionStorage", "localStorage"]) {
      try {
        const here = store === (keep ? "localStorage" : "sessionStorage");
        if (value && here) window[store].setItem(TOKEN_KEY, value);
        else window[store].removeItem(TOKEN_KEY);
      } catch (e) { /* private mode: kept for this page only */ }
    }
  }

  /** #token=... from the address, taken out of it at once; else the stored one. */
  function initialToken() {
    // Split by hand: URLSearchParams would read a "+" in the token as a space.
    const parts = location.hash.replace(/^#/, "").split("&").filter(Boolean);
    const given = parts.find((part) => part.startsWith("token="));
    if (given !== undefined) {
      let value = given.slice("token=".length);
      try {
        value = decodeURIComponent(value).trim();
      } catch (e) { /* not percent-encoded: taken as it is */ }
      const rest = parts.filter((part) => part !== given).join("&");
      history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
      if (value) {
        storeToken(value);
        return value;
      }
    }
    return storedToken();
  }

  // ------------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, code, detail, body) {
      super(detail);
      this.status = status;
      this.code = code;
      this.body = body || null;   // the problem+json answer, its extra fields included
    }
  }

  async function api(path, options) {
    const { method = "GET", body, signal, with_token = token } = options || {};
    const headers = { Accept: "application/json", Authorization: "Bearer " + with_token };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {
        method, headers, signal, cache: "no-store", credentials: "omit",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, "unreachable", "the node did not answer; is it running?");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (e) { /* not JSON */ }
    if (!response.ok) {
      const detail = (data && typeof data.detail === "string" && data.detail) ||
        `${response.status} ${response.statusText}`;
      const error = new ApiError(response.status, data && data.code, detail,
        data && typeof data === "object" ? data : null);
      if (response.status === 401 && with_token === token) signedOut("refused");
      throw error;
    }
    return data;
  }

  function problemText(error) {
    if (error instanceof ApiError) {
      if (error.status === 403) return "This token is not allowed to do that: " + error.message;
      if (error.status === 503) return "The node could not do it just now (try again shortly): " + error.message;
      return error.message;
    }
    return String(error && error.message || error);
  }

  // ------------------------------------------------------------------ state

  const S = {
    node: null,                 // the node answering
    company: null,              // {name, rev, epoch, digest, seats}
    nodes: new Map(),           // id -> node row
    duties: new Map(),          // name -> {name, node}
    seats: new Map(),           // seat -> {seat, owner, token, pending, in_flight, dead_letters, last_turn}
    turns: [],                  // newest first
    turnIndex: new Map(),       // key -> record
    live: false,
  };

  function turnKey(t) {
    return `${t.seat}\u0000${t.trigger}\u0000${t.started_at}`;
  }

  function keepTurn(record) {
    if (!record || typeof record.seat !== "string") return;
    const key = turnKey(record);
    if (S.turnIndex.has(key)) {
      const i = S.turns.indexOf(S.turnIndex.get(key));
      if (i >= 0) S.turns[i] = record;
    } else {
      S.turns.unshift(record);
      S.turns.sort((a, b) => (b.started_at || 0) - (a.started_at || 0));
    }
    S.turnIndex.set(key, record);
    while (S.turns.length > FEED_MAX) S.turnIndex.delete(turnKey(S.turns.pop()));
    const seat = S.seats.get(record.seat);
    if (seat && record.outcome !== "running") {
      const last = seat.last_turn;
      if (!last || (record.started_at || 0) >= (last.started_at || 0)) seat.last_turn = record;
    }
  }

  const handlers = {
    snapshot(d) {
      if (typeof d.at === "number") skew = d.at - Date.now() / 1000;
      S.node = d.node;
      S.company = d.company || null;
      S.nodes = new Map((d.nodes || []).map((n) => [n.id, n]));
      S.duties = new Map((d.duties || []).map((x) => [x.name, x]));
      S.seats = new Map((d.seats || []).map((s) => [s.seat, s]));
      S.turns = [];
      S.turnIndex = new Map();
      for (const t of (d.turns || []).slice().reverse()) keepTurn(t);
      schedule("all");
      refreshDeadLetters();
      refreshApprovals();
    },
    turn(d) {
      keepTurn(d);
      schedule("feed", "seats", "summary");
      const tools = (d.tool_calls || []).map((c) => String(c.name || ""));
      if (tools.some((n) => n.startsWith("task_"))) softRefresh("tasks");
      if (tools.some((n) => n.startsWith("page_"))) softRefresh("pages");
      // A conversation run's turn: it may have asked for an approval, or resumed after one.
      if (String(d.trigger || "").startsWith(RUN_TRIGGER)) {
        approvalsSoon();
        softRefresh("convs");
      }
    },
    node(d) {
      const old = S.nodes.get(d.id) || {};
      if (d.state === "gone") {
        S.nodes.set(d.id, { ...old, id: d.id, state: "gone", gone_at: d.gone_at, children: null, copy: null });
      } else {
        S.nodes.set(d.id, { ...old, ...d });
      }
      schedule("fleet", "summary");
    },
    seat(d) {
      const row = S.seats.get(d.seat) || { seat: d.seat, pending: null, in_flight: null, dead_letters: 0, last_turn: null };
      row.owner = d.owner;
      row.token = d.token;
      S.seats.set(d.seat, row);
      schedule("seats", "summary", "fleet");
    },
    duty(d) {
      S.duties.set(d.name, { ...(S.duties.get(d.name) || {}), name: d.name, node: d.node });
      schedule("fleet");
    },
    copy(d) {
      const row = S.nodes.get(d.node);
      if (row) row.copy = d.copy;
      schedule("fleet", "summary");
    },
    mailboxes(d) {
      let deadChanged = false;
      for (const m of d.seats || []) {
        const row = S.seats.get(m.seat);
        if (!row) continue;
        if ((row.dead_letters || 0) !== (m.dead_letters || 0)) deadChanged = true;
        row.pending = m.pending;
        row.in_flight = m.in_flight;
        row.dead_letters = m.dead_letters;
      }
      schedule("seats", "summary");
      if (deadChanged) refreshDeadLetters();
    },
    children(d) {
      const row = S.nodes.get(d.node);
      if (row) row.children = d.children;
      schedule("fleet", "summary");
    },
    company(d) {
      const before = S.company;
      S.company = d;
      schedule("header");
      // The first company, or another revision (other seats): start again from a snapshot.
      if (!before || before.rev !== d.rev) resync();
    },
  };

  // ------------------------------------------------------------------ the live feed

  const conn = {
    controller: null, lastId: null, attempt: 0, retry: 1000, timer: null,
    watchdog: null, generation: 0, reconnectAt: null,
  };

  /** Server-Sent Events, parsed as the HTML standard says (the parts we use). */
  class EventParser {
    constructor(onEvent, onRetry) {
      this.onEvent = onEvent;
      this.onRetry = onRetry;
      this.buffer = "";
      this.type = "";
      this.data = [];
      this.id = null;
    }

    push(chunk) {
      this.buffer += chunk;
      const lines = /\r\n|\r|\n/g;
      let start = 0;
      let match;
      while ((match = lines.exec(this.buffer)) !== null) {
        // A \r last in the buffer may be the first half of a \r\n.
        if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
        this.line(this.buffer.slice(start, match.index));
        start = lines.lastIndex;
      }
      this.buffer = this.buffer.slice(start);
    }

    line(line) {
      if (line === "") return this.dispatch();
      if (line.startsWith(":")) return undefined;  // a comment: the keepalive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") this.type = value;
      else if (field === "data") this.data.push(value);
      else if (field === "id" && !value.includes("\u0000")) this.id = value;
      else if (field === "retry" && /^\d+$/.test(value)) this.onRetry(Number(value));
      return undefined;
    }

    dispatch() {
      const type = this.type || "message";
      const data = this.data.join("\n");
      const had = this.data.length > 0;
      this.type = "";
      this.data = [];
      if (had) this.onEvent(type, data, this.id);
      else if (this.id !== null) this.onEvent(null, null, this.id);
    }
  }

  function onEvent(type, raw, id) {
    if (type !== null) {
      let data;
      try {
        data = JSON.parse(raw);
      } catch (e) {
        data = null;
      }
      const handler = handlers[type];
      if (handler && data && typeof data === "object") {
        try {
          handler(data);
        } catch (e) {
          console.error("crewlet dashboard: could not apply a", type, "event", e);
        }
      }
    }
    if (id !== null) conn.lastId = id;
  }

  /** The indicator: its state in words (a live region), and a detail that is
   *  not announced (the reconnect countdown changes every second). */
  function setConnection(state, text, detail) {
    const box = $("conn");
    box.dataset.state = state;
    setText($("conn-text"), text);
    setText($("conn-detail"), detail || "");
    $("retry-now").hidden = state !== "reconnecting";
  }

  function stopStream() {
    conn.generation += 1;
    clearTimeout(conn.timer);
    clearTimeout(conn.watchdog);
    conn.reconnectAt = null;
    if (conn.controller) conn.controller.abort();
    conn.controller = null;
  }

  function resync() {
    conn.lastId = null;
    connect();
  }

  async function connect() {
    stopStream();
    const generation = conn.generation;
    const controller = new AbortController();
    conn.controller = controller;
    setConnection(conn.attempt === 0 && !S.live ? "connecting" : "reconnecting",
      conn.attempt === 0 && !S.live ? "Connecting…" : "Reconnecting…");
    const headers = { Authorization: "Bearer " + token, Accept: "text/event-stream" };
    if (conn.lastId) headers["Last-Event-ID"] = conn.lastId;
    let response;
    try {
      response = await fetch("/v1/events", { headers, signal: controller.signal, cache: "no-store", credentials: "omit" });
    } catch (e) {
      if (generation === conn.generation) retryLater("the node did not answer");
      return;
    }
    if (generation !== conn.generation) return;
    if (response.status === 401) return signedOut("refused");
    if (response.status === 403) {
      return showSignIn("This token may not read this node (it needs the read scope). Sign in with another.");
    }
    if (!response.ok || !response.body) {
      retryLater(`the node answered ${response.status}`);
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new EventParser((type, raw, id) => {
      if (generation === conn.generation) onEvent(type, raw, id);  // not after a resync began
    }, (ms) => { conn.retry = Math.max(250, ms); });
    S.live = true;
    conn.attempt = 0;
    setConnection("live", "Live");
    watch(controller);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || generation !== conn.generation) break;
        watch(controller);
        parser.push(value);
      }
    } catch (e) {
      /* dropped, or aborted by us */
    }
    if (generation === conn.generation) retryLater("the connection dropped");
  }

  /** No byte for SILENT_MAX ms (keepalives come every 15 s): the connection is dead. */
  function watch(controller) {
    clearTimeout(conn.watchdog);
    conn.watchdog = setTimeout(() => controller.abort(), SILENT_MAX);
  }

  function retryLater(why) {
    clearTimeout(conn.watchdog);
    const delay = Math.min(BACKOFF_MAX, conn.retry * 2 ** conn.attempt) * (0.8 + Math.random() * 0.4);
    conn.attempt += 1;
    conn.reconnectAt = Date.now() + delay;
    conn.why = why;
    showReconnecting();
    clearTimeout(conn.timer);
    conn.timer = setTimeout(connect, delay);
  }

  function showReconnecting() {
    if (conn.reconnectAt === null) return;
    const left = Math.max(0, Math.ceil((conn.reconnectAt - Date.now()) / 1000));
    setConnection("reconnecting", "Reconnecting", `${conn.why}; next try in ${left} s`);
  }

  // ------------------------------------------------------------------ sign in

  function showSignIn(message) {
    stopStream();
    S.live = false;
    setConnection("signedout", "Signed out");
    $("main").hidden = true;
    $("sign-out").hidden = true;
    $("signin").hidden = false;
    const error = $("signin-error");
    error.hidden = !message;
    setText(error, message || "");
    $("signin-token").value = "";
    $("signin-keep").checked = false;
    $("signin-token").focus();
  }

  function signedOut(why) {
    storeToken(null);
    showSignIn(why === "refused"
      ? "This node did not accept the saved token (it may have been replaced). Sign in again."
      : "");
  }

  async function onSignIn(event) {
    event.preventDefault();
    const value = $("signin-token").value.trim();
    const error = $("signin-error");
    const button = $("signin-submit");
    if (!value) {
      error.hidden = false;
      setText(error, "Paste the node's API token first.");
      return;
    }
    button.disabled = true;
    setText(button, "Checking…");
    try {
      await api("/v1/fleet", { with_token: value });
    } catch (e) {
      error.hidden = false;
      if (e.status === 401) {
        setText(error, "This node does not accept that token. Check that you copied all of it, " +
          "and that it is this node's token.");
      } else if (e.status === 403) {
        setText(error, "That token is known, but it may not read this node (it needs the read scope).");
      } else {
        setText(error, "Could not check the token: " + problemText(e));
      }
      $("signin-token").select();
      return;
    } finally {
      button.disabled = false;
      setText(button, "Sign in");
    }
    storeToken(value, $("signin-keep").checked);
    start();
  }

  function start() {
    $("signin").hidden = true;
    $("main").hidden = false;
    $("sign-out").hidden = false;
    S.live = false;
    conn.attempt = 0;
    conn.lastId = null;
    connect();
    const panel = currentTab();
    if (panel === "tasks") loadTasks(true);
    if (panel === "pages") loadPages(true);
    if (panel === "convs") loadConversations(true);
    refreshApprovals();
  }

  // ------------------------------------------------------------------ rendering

  const dirty = new Set();
  let frame = null;

  function schedule(...parts) {
    for (const part of parts) dirty.add(part);
    if (frame === null) frame = requestAnimationFrame(render);
  }

  function render() {
    frame = null;
    const all = dirty.has("all");
    if (all || dirty.has("header")) renderHeader();
    if (all || dirty.has("fleet")) renderFleet();
    if (all || dirty.has("seats")) renderSeats();
    if (all || dirty.has("feed")) renderFeed(all);
    if (all || dirty.has("summary") || dirty.has("fleet") || dirty.has("seats")) renderSummary();
    dirty.clear();
  }

  function renderHeader() {
    const c = S.company;
    setText($("company-name"), c ? c.name : "No company applied yet");
    setText($("company-rev"), c ? `revision ${c.rev}` : "");
    $("company-rev").title = c ? `revision ${c.rev}, epoch ${c.epoch}, digest ${c.digest}` : "";
    setText($("via"), S.node ? `answered by node ${S.node}` : "");
    document.title = pageTitle();
  }

  /** The company, and how many approvals wait (seen from another browser tab). */
  function pageTitle() {
    const c = S.company;
    const base = c ? `${c.name} · crewlet` : "crewlet dashboard";
    const waiting = pendingShown().length;
    return waiting ? `(${waiting}) ${base}` : base;
  }

  // -- fleet

  function nodeHealth(n) {
    if (n.state === "gone") return ["bad", "Gone", "its presence lapsed: the node stopped or lost the fleet"];
    const kids = n.children || [];
    const bad = kids.filter((k) => k.state !== "running");
    const copy = n.copy;
    if (bad.length) return ["warn", "Degraded", `${bad.length} of its processes not running`];
    if (copy && (!copy.in_service || copy.lagging)) return ["warn", "Degraded", "its estate copy is not fully in service"];
    if (n.sandbox && n.sandbox.state !== "confined") return ["warn", "Tools unconfined", sandboxWords(n.sandbox)];
    if (n.state === "up") return ["ok", "Up", "its presence is live"];
    return ["unknown", humanize(n.state || "unknown"), null];
  }

  // How a node's seats run their tools (crewlet.sandbox): said wherever an
  // operator looks when they are not confined.
  function sandboxWords(box) {
    const why = box.reason ? `: ${box.reason}` : "";
    return box.state === "refused"
      ? `seats' own tools are refused (sandbox.mode required)${why}`
      : `seats' own tools run unconfined (sandbox.mode ${box.mode})${why}`;
  }

  function copyView(n) {
    const copy = n.copy;
    const isData = (n.roles || []).includes("data");
    if (n.state === "gone") return [pill("unknown", "Not known"), null];
    if (!copy) {
      return isData ? [pill("unknown", "Not reported yet"), null]
        : [pill("unknown", "No copy", "not a data node: it reads another node's copy"), null];
    }
    if (!copy.in_service) return [pill("bad", "Out of service"), copy.reason || "no reason given"];
    if (copy.lagging) return [pill("warn", "Lagging", "far behind the furthest copy; asked after the others"), copy.reason];
    return [pill("ok", "In service"), `${copy.applied} changes applied`];
  }

  const nodeCache = new Map();

  function nodeSig(n) {
    const copy = n.copy ? [n.copy.in_service, n.copy.lagging, n.copy.reason, n.copy.applied] : null;
    const kids = (n.children || []).map((k) => [k.name, k.state, k.pid, k.restarts, k.last_exit && k.last_exit.reason]);
    const box = n.sandbox ? [n.sandbox.state, n.sandbox.reason] : null;
    return JSON.stringify([n.state, n.gone_at, n.roles, copy, box, n.children ? kids : null, n.version, n.started_at,
      n.broker, n.labels, seatsHeldBy(n.id), dutiesOf(n.id), n.id === S.node]);
  }

  function seatsHeldBy(id) {
    let count = 0;
    for (const s of S.seats.values()) if (s.owner === id) count += 1;
    return count;
  }

  function dutiesOf(id) {
    return [...S.duties.values()].filter((d) => d.node === id).map((d) => d.name).sort();
  }

  function buildNode(n) {
    const [kind, label, why] = nodeHealth(n);
    const card = el("article", { class: `node ${kind}`, "data-testid": `node-${n.id}`, "data-state": n.state === "gone" ? "gone" : (kind === "warn" ? "degraded" : n.state), "aria-label": `node ${n.id}` });
    const head = el("header", { class: "node-head" },
      el("h3", {}, n.id),
      n.id === S.node ? el("span", { class: "tag", title: "the node serving this page" }, "this node") : null,
      el("span", { class: "grow" }),
      el("span", { "data-testid": "node-state" }, pill(kind, label, why)));
    card.append(head);
    const facts = el("dl", { class: "facts" });
    const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
    if (n.state === "gone") fact("Gone", when(n.gone_at));
    fact("Roles", (n.roles || []).length
      ? (n.roles || []).map((r, i) => [i ? ", " : "", el("span", { class: "role", title: ROLE_WORDS[r] || null }, r)])
      : el("span", { class: "muted" }, "—"));
    const [copyPill, copyNote] = copyView(n);
    fact("Estate copy", copyPill, copyNote ? el("span", { class: "muted small note" }, " " + copyNote) : null);
    if (n.sandbox) {
      const box = n.sandbox;
      fact("Seats' tools", el("span", { "data-testid": "node-sandbox", "data-state": box.state },
        box.state === "confined"
          ? pill("ok", "Confined", "bubblewrap: each seat's tools see their workspace and nothing of the node")
          : [pill(box.state === "refused" ? "bad" : "warn", box.state === "refused" ? "Refused" : "Unconfined"),
            el("span", { class: "muted small note" }, " " + sandboxWords(box))]));
    }
    if (n.state !== "gone") {
      const held = seatsHeldBy(n.id);
      fact("Seats held", String(held));
      const duties = dutiesOf(n.id);
      fact("Duties", duties.length ? duties.map(humanize).join(", ") : el("span", { class: "muted" }, "none"));
    }
    if (n.started_at) fact("Started", when(n.started_at));
    if (n.version) fact("Version", `${n.version}${n.broker ? " · broker " + n.broker : ""}`);
    card.append(el("div", { class: "node-body" }, facts, childrenView(n)));
    return card;
  }

  function childrenView(n) {
    if (n.state === "gone") return el("p", { class: "muted small" }, "Its processes are not known since it went.");
    if (!n.children) return el("p", { class: "muted small" }, "Its processes have not been reported yet.");
    const rows = n.children.map((k) => {
      const [kind, label, why] = CHILD_STATES[k.state] || ["unknown", humanize(k.state || "unknown"), null];
      const exit = k.last_exit;
      const exitText = exit ? `last exit: ${exit.reason || (exit.signal ? "signal " + exit.signal : "code " + exit.code)}` : null;
      return el("tr", { "data-testid": `child-${k.name}`, "data-state": k.state },
        el("th", { scope: "row", title: CHILD_WORDS[k.name] || null }, k.name),
        el("td", {}, pill(kind, label, why)),
        el("td", { class: "num" + (k.restarts ? " warn-text" : ""), title: exitText },
          String(k.restarts || 0)),
        el("td", { class: "num muted pid" }, k.pid ? String(k.pid) : "—"));
    });
    return el("table", { class: "children" },
      el("caption", { class: "sr-only" }, `processes of node ${n.id}`),
      el("thead", {}, el("tr", {},
        el("th", { scope: "col" }, "Process"), el("th", { scope: "col" }, "State"),
        el("th", { scope: "col", class: "num", title: "times restarted after exiting" }, "Restarts"),
        el("th", { scope: "col", class: "num pid", title: "process id" }, "PID"))),
      el("tbody", {}, rows));
  }

  const dutyCache = new Map();

  function renderFleet() {
    const nodes = [...S.nodes.values()].sort((a, b) =>
      (a.state === "gone") - (b.state === "gone") || String(a.id).localeCompare(String(b.id)));
    reconcile($("nodes"), nodeCache, nodes, (n) => n.id, nodeSig, buildNode);
    if (!nodes.length && !$("nodes").querySelector(".empty")) {
      $("nodes").append(el("p", { class: "muted empty" }, "No node has reported yet."));
    } else if (nodes.length) {
      const empty = $("nodes").querySelector(".empty");
      if (empty) empty.remove();
    }
    const duties = [...S.duties.values()].sort((a, b) => a.name.localeCompare(b.name));
    reconcile($("duties"), dutyCache, duties, (d) => d.name, (d) => JSON.stringify([d.node, S.nodes.get(d.node)?.state]),
      (d) => el("li", { "data-testid": `duty-${d.name}`, "data-node": d.node || "" },
        el("span", { class: "duty-name", title: DUTY_WORDS[d.name] || null }, humanize(d.name)),
        " ",
        d.node ? pill("ok", `held by ${d.node}`) : pill("warn", "held by nobody", "no node runs this duty right now"),
        DUTY_WORDS[d.name] ? el("span", { class: "muted small" }, ` — ${DUTY_WORDS[d.name]}`) : null));
  }

  // -- seats

  function seatStatus(s) {
    if (s.dead_letters > 0) return ["bad", "Dead letters", `${s.dead_letters} message(s) could not be delivered`];
    if (!s.owner) return ["warn", "Not held", "no node holds this seat: its mail waits until one does"];
    if (s.in_flight > 0) return ["ok", "Working", "working on a message now"];
    if (s.pending === null || s.pending === undefined) return ["unknown", "Not measured yet", "its mailbox has not been sampled yet"];
    if (s.pending >= PILE_UP) return ["warn", "Mail piling up", `${s.pending} messages waiting`];
    if (s.pending > 0) return ["info", "Mail waiting", "about to be worked"];
    return ["ok", "Idle", "in service, nothing to do"];
  }

  function count(value, warnAt, kindAbove) {
    if (value === null || value === undefined) return el("span", { class: "muted", title: "not measured yet" }, "—");
    if (value === 0) return el("span", { class: "muted" }, "0");
    const kind = kindAbove && value >= warnAt ? kindAbove : null;
    return el("span", { class: kind ? `count ${kind}` : "count" }, String(value));
  }

  const seatCache = new Map();

  function seatSig(s) {
    const t = s.last_turn;
    return JSON.stringify([s.owner, s.pending, s.in_flight, s.dead_letters,
      t ? [t.outcome, t.started_at, t.took_ms, t.error] : null, S.nodes.get(s.owner)?.state]);
  }

  function buildSeat(s) {
    const [kind, label, why] = seatStatus(s);
    const t = s.last_turn;
    const ownerGone = s.owner && S.nodes.get(s.owner)?.state === "gone";
    let last = el("span", { class: "muted" }, "none yet");
    if (t) {
      const [tk, tl, tw] = outcomeInfo(t.outcome);
      last = el("span", { class: "last-turn" }, pill(tk, tl, t.error || tw), " ", when(t.started_at),
        el("span", { class: "muted" }, ` · ${duration(t.took_ms)}`));
    }
    return el("tr", { "data-testid": `seat-row-${s.seat}`, "data-seat": s.seat, "data-status": kind },
      el("th", { scope: "row" }, el("button", {
        type: "button", class: "link seat-link", "data-seat": s.seat, title: "Show this seat's last turns",
      }, s.seat)),
      el("td", {}, pill(kind, label, why)),
      el("td", {}, s.owner ? el("span", { class: ownerGone ? "bad-text" : null, title: ownerGone ? "that node is gone" : null }, s.owner)
        : el("span", { class: "muted" }, "nobody")),
      el("td", { class: "num", "data-col": "pending" }, count(s.pending, PILE_UP, "warn")),
      el("td", { class: "num", "data-col": "in_flight" }, count(s.in_flight, 1, "ok")),
      el("td", { class: "num", "data-col": "dead_letters" }, count(s.dead_letters, 1, "bad")),
      el("td", {}, last));
  }

  function renderSeats() {
    const filter = $("seat-filter").value.trim().toLowerCase();
    const all = [...S.seats.values()].sort((a, b) => a.seat.localeCompare(b.seat));
    const shown = filter ? all.filter((s) => s.seat.toLowerCase().includes(filter)) : all;
    reconcile($("seat-rows"), seatCache, shown, (s) => s.seat, seatSig, buildSeat);
    const empty = $("seats-empty");
    empty.hidden = shown.length > 0;
    setText(empty, all.length ? `No seat matches “${filter}”.` : "This company has no seats yet.");
    renderMailSeats(all);
  }

  let mailSeatsSig = "";

  function renderMailSeats(all) {
    const names = all.map((s) => s.seat);
    const sig = names.join("\u0000");
    if (sig === mailSeatsSig) return;
    mailSeatsSig = sig;
    const select = $("mail-seat");
    const chosen = select.value;
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(chosen)) select.value = chosen;
    else if (names.includes("ceo")) select.value = "ceo";
  }

  // -- feed

  const feedCache = new Map();

  function buildTurn(t) {
    const [kind, label, why] = outcomeInfo(t.outcome);
    const text = t.error ? t.error : t.reply;
    const tools = (t.tool_calls || []).map((c) => c.name + (c.error ? " (failed)" : ""));
    const meta = [];
    if (t.sender) meta.push(senderWords(t.sender));
    if (t.outcome !== "running" && typeof t.took_ms === "number") meta.push(`took ${duration(t.took_ms)}`);
    if (t.node) meta.push(`on ${t.node}`);
    if (tools.length) meta.push(`tools: ${tools.join(", ")}`);
    if (t.deliveries > 1) meta.push(`try ${t.deliveries}`);
    return el("li", {
      class: `turn ${kind}`, "data-testid": "turn", "data-seat": t.seat, "data-outcome": t.outcome,
      "data-trigger": t.trigger || "",
    },
    el("div", { class: "turn-head" },
      pill(kind, label, why),
      el("strong", { class: "turn-seat" }, t.seat),
      el("span", { class: "grow" }),
      el("span", { class: "small muted" }, when(t.started_at))),
    text ? el("p", { class: "turn-text" + (t.error ? ` ${kind}-note` : ""), title: String(text).slice(0, 2000) },
      excerpt(text, EXCERPT)) : null,
    meta.length ? el("p", { class: "turn-meta muted small" }, meta.join(" · ")) : null);
  }

  function renderFeed(whole) {
    const feed = $("feed");
    // A snapshot rebuilds the list: not fifty announcements to a screen reader.
    if (whole) feed.setAttribute("aria-busy", "true");
    reconcile(feed, feedCache, S.turns, turnKey,
      (t) => JSON.stringify([t.outcome, t.took_ms, t.reply, t.error]), buildTurn);
    if (whole) setTimeout(() => feed.removeAttribute("aria-busy"), 0);
    $("feed-empty").hidden = S.turns.length > 0;
  }

  // -- summary

  function tile(id, kind, value, note) {
    const box = $(`tile-${id}`);
    box.dataset.kind = kind;
    setText($(`sum-${id}`), value);
    setText($(`sum-${id}-note`), note);
  }

  function renderSummary() {
    const nodes = [...S.nodes.values()];
    const up = nodes.filter((n) => n.state !== "gone");
    const gone = nodes.length - up.length;
    const degraded = up.filter((n) => nodeHealth(n)[0] === "warn").length;
    tile("nodes", gone ? "bad" : degraded ? "warn" : nodes.length ? "ok" : "unknown", `${up.length} up`,
      [gone ? `${gone} gone` : "", degraded ? `${degraded} degraded` : "", !gone && !degraded && nodes.length ? "all healthy" : ""]
        .filter(Boolean).join(", "));
    const seats = [...S.seats.values()];
    const unheld = seats.filter((s) => !s.owner).length;
    tile("seats", unheld ? "warn" : seats.length ? "ok" : "unknown", String(seats.length),
      seats.length ? (unheld ? `${unheld} not held by any node` : "all held") : "none");
    const sampled = seats.filter((s) => typeof s.pending === "number");
    const working = seats.reduce((sum, s) => sum + (s.in_flight || 0), 0);
    tile("working", sampled.length ? "ok" : "unknown", sampled.length ? String(working) : "—",
      working === 1 ? "message being worked" : "messages being worked");
    const pending = seats.reduce((sum, s) => sum + (s.pending || 0), 0);
    const piling = seats.filter((s) => (s.pending || 0) >= PILE_UP).length;
    tile("pending", !sampled.length ? "unknown" : piling ? "warn" : "ok", sampled.length ? String(pending) : "—",
      piling ? `piling up at ${piling} seat${piling > 1 ? "s" : ""}` : "in mailboxes");
    const dead = seats.reduce((sum, s) => sum + (s.dead_letters || 0), 0);
    tile("dead", dead ? "bad" : "ok", String(dead), dead ? "need a look" : "none");
    const badge = $("tab-dlq-count");
    setText(badge, dead ? String(dead) : "");
    badge.hidden = !dead;
  }

  // ------------------------------------------------------------------ tabs

  const TABS = ["dlq", "convs", "tasks", "pages", "files"];
  const loaded = { tasks: false, pages: false, convs: false, files: false };

  function currentTab() {
    return TABS.find((t) => $(`tab-${t}`).getAttribute("aria-selected") === "true");
  }

  function selectTab(name, focus) {
    for (const t of TABS) {
      const tab = $(`tab-${t}`);
      const on = t === name;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
      $(`panel-${t}`).hidden = !on;
      if (on && focus) tab.focus();
    }
    if (name === "tasks" && !loaded.tasks) loadTasks(true);
    if (name === "pages" && !loaded.pages) loadPages(true);
    if (name === "convs" && !loaded.convs) loadConversations(true);
    if (name === "files" && !loaded.files) loadFiles(true);
    if (name === "dlq") refreshDeadLetters();
  }

  const soft = {};

  /** Refresh a list the operator has open, at most once a second. */
  function softRefresh(what) {
    if (!loaded[what] || soft[what]) return;
    soft[what] = setTimeout(() => {
      soft[what] = null;
      if (what === "tasks") loadTasks(true);
      if (what === "pages" && !searching) loadPages(true);
      if (what === "convs") {
        loadConversations(true);
        if (convs.chosen) openConversation(convs.chosen, true);
      }
    }, 1000);
  }

  // ------------------------------------------------------------------ dead letters

  const dlq = { rows: [], next: null, loading: null, again: false, cache: new Map() };

  function refreshDeadLetters() {
    if (!token) return;
    if (dlq.loading) {
      dlq.again = true;
      return;
    }
    dlq.loading = loadDeadLetters(false).finally(() => {
      dlq.loading = null;
      if (dlq.again) {
        dlq.again = false;
        refreshDeadLetters();
      }
    });
  }

  async function loadDeadLetters(more) {
    const path = `/v1/dlq?limit=${PAGE}` + (more && dlq.next ? `&cursor=${encodeURIComponent(dlq.next)}` : "");
    try {
      const page = await api(path);
      dlq.rows = more ? dlq.rows.concat(page.items) : page.items;
      dlq.next = page.next;
      renderDeadLetters(null);
    } catch (e) {
      if (e.status !== 401) renderDeadLetters("The dead letters could not be read: " + problemText(e));
    }
  }

  function renderDeadLetters(error) {
    reconcile($("dlq-rows"), dlq.cache, dlq.rows, (d) => String(d.seq), (d) => String(d.seq), buildDeadLetter);
    const empty = $("dlq-empty");
    empty.hidden = dlq.rows.length > 0 && !error;
    empty.classList.toggle("bad-text", Boolean(error));
    setText(empty, error || "No dead letters: every message was worked or is waiting its turn.");
    $("dlq-more").hidden = !dlq.next;
  }

  function buildDeadLetter(d) {
    const button = el("button", {
      type: "button", class: "primary small-button", "data-testid": `requeue-${d.seq}`,
      "aria-label": `Requeue dead letter ${d.seq} for seat ${d.seat}`,
    }, "Requeue");
    button.addEventListener("click", () => requeue(d, button));
    return el("tr", { "data-testid": `dlq-row-${d.seq}`, "data-seq": d.seq, "data-seat": d.seat },
      el("th", { scope: "row" }, d.seat),
      el("td", { class: "letter", title: String(d.text).slice(0, 2000) }, excerpt(d.text, 160),
        d.sender ? el("div", { class: "muted small" }, senderWords(d.sender)) : null),
      el("td", { class: "bad-text reason" }, excerpt(d.reason, 200)),
      el("td", { class: "num" }, String(d.deliveries)),
      el("td", {}, when(d.at)),
      el("td", { class: "actions" }, button));
  }

  async function requeue(d, button) {
    const result = $("dlq-result");
    button.disabled = true;
    setText(button, "Requeuing…");
    try {
      const answer = await api(`/v1/dlq/${encodeURIComponent(d.seq)}/requeue`, { method: "POST" });
      result.dataset.kind = "ok";
      setText(result, `Requeued: the message to ${d.seat} is back in its mailbox ` +
        `(as message #${answer.seq}) and will be tried again.`);
      dlq.rows = dlq.rows.filter((r) => r.seq !== d.seq);
      renderDeadLetters(null);
      // Worked again, it may fail again: look once its turn has had time.
      setTimeout(refreshDeadLetters, 3000);
    } catch (e) {
      result.dataset.kind = "bad";
      if (e.status === 404) {
        setText(result, `Dead letter #${d.seq} is no longer there: it was requeued already, or expired.`);
      } else {
        setText(result, `Could not requeue the message to ${d.seat}: ${problemText(e)}`);
      }
      button.disabled = false;
      setText(button, "Requeue");
    }
    refreshDeadLetters();
  }

  // ------------------------------------------------------------------ approvals

  /* A seat's tool call that needs a person (the company's `approval:` on the
   * seat) ends its run and waits here, its conversation `awaiting_approval`;
   * the decision resumes the conversation as a new run, on whichever node
   * holds the seat. Approvals are not on the live feed: they are read every
   * APPROVALS_EVERY ms, and soon after a conversation run's turn shows in it. */
  const approvals = {
    rows: [],              // pending, as last read: oldest first
    next: null,            // more pending past this page
    read: false,           // read once at least
    loading: null, again: false, soon: null,
    cache: new Map(),      // reconcile's: id -> {el, sig}
    parts: new Map(),      // id -> that item's controls
    done: new Set(),       // decided from this page: never shown again, whatever a slower read says
    deciding: new Map(),   // id -> row: a decision in flight; shown until it is answered, whatever a read says
    kept: new Map(),       // id -> row: decided elsewhere, or gone; kept in place, saying so, until dismissed
  };

  function refreshApprovals() {
    if (!token) return;
    if (approvals.loading) {
      approvals.again = true;
      return;
    }
    approvals.loading = loadApprovals().finally(() => {
      approvals.loading = null;
      if (approvals.again) {
        approvals.again = false;
        refreshApprovals();
      }
    });
  }

  /** Read them again shortly, however many turns asked. */
  function approvalsSoon() {
    if (approvals.soon) return;
    approvals.soon = setTimeout(() => {
      approvals.soon = null;
      refreshApprovals();
    }, 300);
  }

  async function loadApprovals() {
    const note = $("approvals-status");
    try {
      const page = await api(`/v1/approvals?status=pending&limit=${APPROVALS_PAGE}`);
      approvals.rows = page.items || [];
      approvals.next = page.next;
      approvals.read = true;
      note.dataset.kind = "";
      setText(note, "");
    } catch (e) {
      if (e.status === 401) return;
      note.dataset.kind = "bad";
      setText(note, (approvals.read ? "The approvals could not be read again just now; this is the list as last read. "
        : "The approvals could not be read. ") + problemText(e));
    }
    renderApprovals();
  }

  /** The pending ones shown: not those decided here, nor those kept with a word. */
  function pendingShown() {
    return approvals.rows.filter((a) => !approvals.done.has(a.id) && !approvals.kept.has(a.id));
  }

  function renderApprovals() {
    const byId = new Map(pendingShown().map((a) => [a.id, a]));
    for (const [id, a] of approvals.deciding) byId.set(id, a);
    for (const [id, a] of approvals.kept) byId.set(id, a);
    const shown = [...byId.values()]
      .sort((a, b) => (a.seq || 0) - (b.seq || 0) || String(a.id).localeCompare(String(b.id)));
    reconcile($("approvals-list"), approvals.cache, shown, (a) => a.id, (a) => a.id, buildApproval);
    for (const id of [...approvals.parts.keys()]) if (!approvals.cache.has(id)) approvals.parts.delete(id);
    $("approvals-empty").hidden = shown.length > 0 || !approvals.read;
    $("approvals-more").hidden = !approvals.next;
    renderApprovalCount();
  }

  function renderApprovalCount() {
    const n = pendingShown().length;
    const value = `${n}${approvals.next ? "+" : ""}`;
    if (!approvals.read) tile("approvals", "unknown", "—", "");
    else tile("approvals", n ? "warn" : "ok", value, n ? (n === 1 ? "tool call waits for you" : "tool calls wait for you") : "none waiting");
    const badge = $("approvals-count");
    setText(badge, n ? value : "");
    badge.hidden = !n;
    $("approvals").dataset.kind = n ? "warn" : "";
    document.title = pageTitle();
  }

  /** When a pending approval expires, kept fresh by the ticker. */
  function expiry(ts) {
    if (typeof ts !== "number" || !isFinite(ts)) return el("span", { class: "muted" }, "no expiry");
    const node = el("time", {
      class: "expiry", "data-ts": ts, "data-expires": "", datetime: new Date((ts - skew) * 1000).toISOString(),
      title: "expires " + absolute(ts), "data-testid": "approval-expires",
    });
    showExpiry(node, ts);
    return node;
  }

  function showExpiry(node, ts) {
    const left = ts - now();
    let text;
    if (left >= 1) text = "expires in " + span(left);
    else if (left > -5) text = "expires now";
    else text = `expired ${span(-left)} ago`;
    setText(node, text);
    const kind = left < 0 ? "bad" : left < EXPIRY_SOON ? "warn" : "";
    if (node.dataset.kind !== kind) node.dataset.kind = kind;
  }

  function buildApproval(a) {
    const id = String(a.id);
    const titleId = `approval-${id}-title`;
    const noteId = `approval-${id}-note`;
    const argsId = `approval-${id}-args`;
    const args = a.args === undefined ? "(no arguments)" : JSON.stringify(a.args, null, 2);
    const approve = el("button", {
      type: "button", class: "primary", "data-testid": "approve", "aria-label": `Approve ${a.seat}'s call to ${a.tool}`,
    }, "Approve");
    const deny = el("button", {
      type: "button", class: "danger", "data-testid": "deny", "aria-label": `Deny ${a.seat}'s call to ${a.tool}`,
    }, "Deny");
    const note = el("input", {
      id: noteId, type: "text", maxlength: NOTE_MAX, autocomplete: "off", spellcheck: "true",
      "data-testid": "approval-note", placeholder: "why not, if you deny it",
    });
    const message = el("p", { class: "result", role: "status", "aria-live": "polite", "data-testid": "approval-message" });
    const actions = el("div", { class: "approval-actions" },
      el("label", { for: noteId }, "Note ", el("span", { class: "muted small" }, "(optional; a denial's note is told to the seat)")),
      el("div", { class: "approval-buttons" }, note, approve, deny));
    const facts = el("dl", { class: "facts" });
    const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
    fact("Conversation", el("button", {
      type: "button", class: "link", "data-testid": "approval-conversation", title: "Show this conversation",
      onclick: () => showConversation(a.conversation),
    }, a.conversation), el("span", { class: "muted small" }, ` · run ${a.run}`));
    fact("Asked", when(a.requested_at));
    const expires = expiry(a.expires_at);
    const item = el("li", {
      class: "approval", "data-testid": `approval-${id}`, "data-approval": id, "data-seat": a.seat,
      "data-tool": a.tool, "data-state": "pending", "aria-labelledby": titleId,
    },
    el("div", { class: "approval-head" },
      el("h3", { id: titleId },
        el("span", { "data-testid": "approval-seat" }, a.seat), " wants to call ",
        el("code", { class: "tool", "data-testid": "approval-tool" }, a.tool)),
      el("span", { class: "grow" }),
      expires),
    facts,
    el("p", { class: "args-label", id: argsId }, "Its arguments, exactly as the call would run:"),
    el("pre", { class: "args", "data-testid": "approval-args", tabindex: "0", "aria-labelledby": argsId }, args),
    actions,
    message);
    const parts = { item, approve, deny, note, message, actions, expires, busy: false };
    approve.addEventListener("click", () => decide(a, "approve"));
    deny.addEventListener("click", () => decide(a, "deny"));
    approvals.parts.set(id, parts);
    return item;
  }

  async function decide(a, decision) {
    const p = approvals.parts.get(a.id);
    if (!p || p.busy) return;
    p.busy = true;
    approvals.deciding.set(a.id, a);
    const text = p.note.value.trim();
    const approving = decision === "approve";
    p.approve.disabled = true;
    p.deny.disabled = true;
    p.note.readOnly = true;
    setText(approving ? p.approve : p.deny, approving ? "Approving…" : "Denying…");
    p.item.setAttribute("aria-busy", "true");
    p.message.dataset.kind = "";
    setText(p.message, approving ? "Sending the approval…" : "Sending the denial…");
    try {
      await api(`/v1/approvals/${encodeURIComponent(a.id)}`, {
        method: "POST", body: text ? { decision, note: text } : { decision },
      });
      approvals.done.add(a.id);
      approvals.deciding.delete(a.id);
      const result = $("approvals-result");
      result.dataset.kind = "ok";
      setText(result, approving
        ? `Approved: ${a.seat}'s call to ${a.tool} runs now, exactly as it was shown, and conversation ${a.conversation} goes on.`
        : `Denied: ${a.seat}'s call to ${a.tool} will not run. The seat is told` +
          (text ? ` (with your note “${excerpt(text, 120)}”)` : "") + `, and conversation ${a.conversation} goes on.`);
      leave(p, () => renderApprovals());
      softRefresh("convs");
    } catch (e) {
      approvals.deciding.delete(a.id);
      p.item.removeAttribute("aria-busy");
      if (e.status === 409 || e.status === 404) {
        settle(a, p, e);
      } else {
        p.busy = false;
        p.approve.disabled = false;
        p.deny.disabled = false;
        p.note.readOnly = false;
        setText(p.approve, "Approve");
        setText(p.deny, "Deny");
        p.message.dataset.kind = "bad";
        setText(p.message, `Not decided: ${problemText(e)}` + (e.status === 0
          ? " It may or may not have reached the node: sending the same decision again is safe." : ""));
        renderApprovals();  // decided elsewhere meanwhile, a read may have left it out
      }
    }
  }

  /** *change* takes an item away: the focus, if it was in it, goes to the panel's heading. */
  function leave(p, change) {
    const focused = document.activeElement;
    const inside = !focused || focused === document.body || p.item.contains(focused);
    change();
    if (inside && !p.item.isConnected) $("approvals-title").focus();
  }

  /** Someone else decided it, or it is gone: said in place, until dismissed. */
  function settle(a, p, e) {
    approvals.kept.set(a.id, a);
    p.item.dataset.state = "settled";
    p.expires.replaceWith(el("span", { class: "muted small", "data-testid": "approval-expires" }, "no longer waiting"));
    p.message.dataset.kind = "bad";
    setText(p.message, settledText(e));
    const dismiss = el("button", {
      type: "button", class: "ghost", "data-testid": "dismiss", "aria-label": `Dismiss the approval of ${a.seat}'s call to ${a.tool}`,
    }, "Dismiss");
    dismiss.addEventListener("click", () => leave(p, () => {
      approvals.kept.delete(a.id);
      renderApprovals();
    }));
    p.actions.replaceChildren(el("div", { class: "approval-buttons" }, dismiss));
    renderApprovals();
    dismiss.focus();
  }

  function settledText(e) {
    if (e.status === 404) return `This approval is no longer there, so nothing was decided (${e.message}).`;
    const b = e.body || {};
    const at = typeof b.decided_at === "number" ? `, ${ago(b.decided_at)}` : "";
    if (b.decision && b.expired) {
      return `Already decided: it expired${at} before anyone decided, and the seat was told it was denied. Yours was not recorded.`;
    }
    if (b.decision) {
      return `Already decided: it was ${b.decision === "approve" ? "approved" : "denied"}` +
        `${b.by ? " by " + b.by : ""}${at}. Yours was not recorded.`;
    }
    if (typeof b.expires_at === "number") {
      return `Too late to approve: it expired ${ago(b.expires_at)}; the seat will be told it was denied.`;
    }
    return `It could not be decided: ${e.message}`;
  }

  // ------------------------------------------------------------------ conversations

  const CONV_KINDS = {
    idle: ["unknown", "Idle", "no run now: it waits for the next message"],
    running: ["ok", "Running", "a run is working on it now"],
    awaiting_approval: ["warn", "Awaiting approval", "a tool call waits for a person's decision (see Approvals)"],
    error: ["bad", "Error", "its last run failed"],
  };
  const RUN_KINDS = { queued: "info", running: "ok", completed: "unknown", failed: "bad", interrupted: "warn" };
  const convs = { rows: [], next: null, request: 0, chosen: null, opening: 0 };

  function convPill(status) {
    const [kind, label, why] = CONV_KINDS[status] || ["unknown", humanize(status || "unknown"), null];
    return pill(kind, label, why);
  }

  async function loadConversations(fresh) {
    loaded.convs = true;
    const request = ++convs.request;
    const status = $("conv-status").value;
    let path = `/v1/conversations?limit=${PAGE}` + (status ? `&status=${encodeURIComponent(status)}` : "");
    if (!fresh && convs.next) path += `&cursor=${encodeURIComponent(convs.next)}`;
    const note = $("convs-status");
    if (fresh && !convs.rows.length) setText(note, "Loading conversations…");
    try {
      const page = await api(path);
      if (request !== convs.request) return;
      convs.rows = fresh ? page.items : convs.rows.concat(page.items);
      convs.next = page.next;
      note.dataset.kind = "";
      setText(note, convs.rows.length ? "" : (status ? `No conversation is ${(CONV_KINDS[status] || [0, status])[1].toLowerCase()}.` : "No conversations yet."));
      renderConversations();
    } catch (e) {
      if (request !== convs.request) return;
      note.dataset.kind = "bad";
      setText(note, "The conversations could not be read: " + problemText(e));
    }
  }

  function renderConversations() {
    $("convs-list").replaceChildren(...convs.rows.map((c) => el("li", {},
      el("button", {
        type: "button", class: "item" + (convs.chosen === c.id ? " chosen" : ""), "data-testid": `conv-row-${c.id}`,
        "data-status": c.status, "aria-pressed": convs.chosen === c.id ? "true" : "false",
        onclick: () => openConversation(c.id, false),
      },
      el("span", { class: "item-title" }, `with ${c.seat}`),
      convPill(c.status),
      el("span", { class: "item-meta muted small" }, c.id, c.run ? "" : " · no run yet", " · ",
        when(c.updated_at || c.created_at))))));
    $("convs-more").hidden = !convs.next;
  }

  /** The Conversations tab, showing conversation *id*. */
  function showConversation(id) {
    selectTab("convs", false);
    openConversation(id, false);
    $("tab-convs").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  const ROLE_NAMES = { user: "Person", assistant: null, tool: "Tool result", system: "System" };

  function buildMessage(m, seat) {
    const who = m.role === "assistant" ? seat : (ROLE_NAMES[m.role] || humanize(m.role));
    const kind = m.role === "tool" ? (m.error ? "bad" : "ok") : m.role === "user" ? "info" : "unknown";
    return el("li", { class: `message ${kind}`, "data-testid": "conv-message", "data-role": m.role, "data-error": m.error ? "true" : "false" },
      el("div", { class: "muted small" },
        el("strong", { class: "message-who" }, who),
        m.role === "tool" && m.name ? [" of ", el("code", {}, m.name)] : null,
        m.role === "tool" && m.error ? el("span", { class: "bad-text" }, " (not run, or failed)") : null,
        " · ", when(m.at)),
      m.text ? el("div", { class: "body" }, m.text) : null,
      (m.calls || []).map((c) => el("div", { class: "call" },
        el("span", { class: "muted small" }, "Calls "), el("code", {}, c.name),
        el("pre", { class: "args" }, JSON.stringify(c.args, null, 2)))));
  }

  async function openConversation(id, quiet) {
    convs.chosen = id;
    const opening = ++convs.opening;
    for (const b of document.querySelectorAll("#convs-list .item")) {
      const on = b.dataset.testid === `conv-row-${id}`;
      b.classList.toggle("chosen", on);
      b.setAttribute("aria-pressed", on ? "true" : "false");
    }
    const box = $("conv-detail");
    if (!quiet) box.replaceChildren(el("p", { class: "muted" }, `Loading ${id}…`));
    try {
      const d = await api(`/v1/conversations/${encodeURIComponent(id)}?limit=${CONV_MESSAGES}`);
      if (convs.chosen !== id || opening !== convs.opening) return;
      const c = d.conversation;
      const facts = el("dl", { class: "facts" });
      const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
      fact("Status", el("span", { "data-testid": "conv-detail-status", "data-status": c.status }, convPill(c.status)));
      fact("Seat", c.seat);
      if (d.run) fact("Run", el("code", {}, d.run.id), " ", pill(RUN_KINDS[d.run.status] || "unknown", humanize(d.run.status)));
      if (c.status === "awaiting_approval" && c.approval) {
        fact("Awaits", el("button", {
          type: "button", class: "link", onclick: () => $("approvals").scrollIntoView({ behavior: "smooth", block: "start" }),
        }, `a decision on approval ${c.approval}`), el("span", { class: "muted small" }, " (see Approvals)"));
      }
      fact("Started", c.created_by ? `by ${c.created_by}, ` : "", when(c.created_at));
      if (c.metadata && Object.keys(c.metadata).length) fact("Metadata", el("code", {}, JSON.stringify(c.metadata)));
      const messages = d.messages || [];
      const old = box.querySelector(".messages");
      const list = el("ol", { class: "messages", "data-testid": "conv-messages" }, messages.map((m) => buildMessage(m, c.seat)));
      box.replaceChildren();
      append(box, [
        el("h3", { "data-testid": "conv-detail-title" }, `Conversation with ${c.seat} `, el("span", { class: "muted" }, c.id)),
        facts,
        el("h4", {}, `Messages (${messages.length}${d.next ? "+" : ""})`),
        messages.length ? list : el("p", { class: "muted" }, "None yet."),
        d.next ? el("p", { class: "muted small" }, `The first ${messages.length} are shown.`) : null]);
      if (quiet && old) list.scrollTop = old.scrollTop;
    } catch (e) {
      if (convs.chosen !== id || opening !== convs.opening) return;
      box.replaceChildren(el("p", { class: "bad-text" }, `Conversation ${id} could not be read: ${problemText(e)}`));
    }
  }

  // ------------------------------------------------------------------ tasks

  const TASK_KINDS = { open: "info", doing: "ok", blocked: "warn", done: "unknown", cancelled: "unknown" };
  const tasks = { rows: [], next: null, request: 0, chosen: null };

  async function loadTasks(fresh) {
    loaded.tasks = true;
    const request = ++tasks.request;
    const status = $("task-status").value;
    let path = `/v1/tasks?limit=${PAGE}` + (status ? `&status=${encodeURIComponent(status)}` : "");
    if (!fresh && tasks.next) path += `&cursor=${encodeURIComponent(tasks.next)}`;
    const note = $("tasks-status");
    if (fresh && !tasks.rows.length) setText(note, "Loading tasks…");
    try {
      const page = await api(path);
      if (request !== tasks.request) return;
      tasks.rows = fresh ? page.items : tasks.rows.concat(page.items);
      tasks.next = page.next;
      note.dataset.kind = "";
      setText(note, tasks.rows.length ? "" : (status ? `No ${status} tasks.` : "No tasks yet."));
      renderTasks();
    } catch (e) {
      if (request !== tasks.request) return;
      note.dataset.kind = "bad";
      setText(note, "The tasks could not be read: " + problemText(e));
    }
  }

  function renderTasks() {
    const list = $("tasks-list");
    list.replaceChildren(...tasks.rows.map((t) => el("li", {},
      el("button", {
        type: "button", class: "item" + (tasks.chosen === t.id ? " chosen" : ""), "data-testid": `task-row-${t.id}`,
        "aria-pressed": tasks.chosen === t.id ? "true" : "false",
        onclick: () => openTask(t.id),
      },
      el("span", { class: "item-id" }, t.id),
      el("span", { class: "item-title", "data-testid": "task-title" }, t.title),
      pill(TASK_KINDS[t.status] || "unknown", humanize(t.status)),
      el("span", { class: "item-meta muted small" }, t.assignee ? `for ${t.assignee}` : "unassigned",
        " · ", when(t.updated_at || t.created_at))))));
    $("tasks-more").hidden = !tasks.next;
  }

  async function openTask(id) {
    tasks.chosen = id;
    renderTasks();
    const box = $("task-detail");
    box.replaceChildren(el("p", { class: "muted" }, `Loading ${id}…`));
    try {
      const { task, comments } = await api(`/v1/tasks/${encodeURIComponent(id)}`);
      if (tasks.chosen !== id) return;
      const facts = el("dl", { class: "facts" });
      const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
      fact("Status", pill(TASK_KINDS[task.status] || "unknown", humanize(task.status)));
      fact("Assignee", task.assignee || el("span", { class: "muted" }, "nobody"));
      if ((task.labels || []).length) fact("Labels", task.labels.map((l) => el("span", { class: "tag" }, l)));
      if (task.parent) fact("Part of", task.parent);
      fact("Opened", task.created_by ? `by ${task.created_by}, ` : "", when(task.created_at));
      if (task.updated_at && task.updated_at !== task.created_at) {
        fact("Changed", task.updated_by ? `by ${task.updated_by}, ` : "", when(task.updated_at));
      }
      box.replaceChildren(
        el("h3", { "data-testid": "task-detail-title" }, el("span", { class: "muted" }, `${task.id} `), task.title),
        facts,
        task.body ? el("div", { class: "body" }, task.body) : el("p", { class: "muted" }, "No description."),
        el("h4", {}, `Comments (${comments.length})`),
        comments.length ? el("ol", { class: "comments" }, comments.map((c) => el("li", {},
          el("div", { class: "muted small" }, c.created_by || c.author || "someone", " · ", when(c.created_at)),
          el("div", { class: "body" }, c.body)))) : el("p", { class: "muted" }, "None."));
    } catch (e) {
      if (tasks.chosen !== id) return;
      box.replaceChildren(el("p", { class: "bad-text" }, `Task ${id} could not be read: ${problemText(e)}`));
    }
  }

  // ------------------------------------------------------------------ pages and search

  const pages = { rows: [], next: null, request: 0, chosen: null };
  let searching = false;

  async function loadPages(fresh) {
    loaded.pages = true;
    const request = ++pages.request;
    let path = `/v1/pages?limit=${PAGE}`;
    if (!fresh && pages.next) path += `&cursor=${encodeURIComponent(pages.next)}`;
    try {
      const page = await api(path);
      if (request !== pages.request) return;
      pages.rows = fresh ? page.items : pages.rows.concat(page.items);
      pages.next = page.next;
      renderPages();
    } catch (e) {
      if (request !== pages.request || searching) return;
      const note = $("search-status");
      note.dataset.kind = "bad";
      setText(note, "The pages could not be read: " + problemText(e));
    }
  }

  function pageButton(p, extra) {
    return el("li", {}, el("button", {
      type: "button", class: "item" + (pages.chosen === p.path ? " chosen" : ""), "data-testid": `page-row-${p.path}`,
      onclick: () => openPage(p.path),
    },
    el("span", { class: "item-title" }, p.title || p.path),
    el("span", { class: "item-id muted" }, p.path),
    extra || null));
  }

  function renderPages() {
    if (!searching) {
      const note = $("search-status");
      note.dataset.kind = "";
      setText(note, pages.rows.length ? `${pages.rows.length}${pages.next ? "+" : ""} page${pages.rows.length === 1 ? "" : "s"}` : "No pages yet.");
    }
    $("pages-list").replaceChildren(...pages.rows.map((p) => pageButton(p,
      el("span", { class: "item-meta muted small" }, `version ${p.version} · `, when(p.updated_at || p.created_at)))));
    $("pages-more").hidden = !pages.next || searching;
  }

  // ------------------------------------------------------------------ files

  const files = { rows: [], next: null, request: 0 };

  function fileUrl(f) {
    return `/v1/files/${encodeURIComponent(f.project)}/${f.path.split("/").map(encodeURIComponent).join("/")}`;
  }

  function sizeText(n) {
    if (typeof n !== "number") return "?";
    if (n < 1024) return `${n} B`;
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
  }

  async function loadFiles(fresh) {
    loaded.files = true;
    const request = ++files.request;
    let path = `/v1/files?limit=${PAGE}`;
    if (!fresh && files.next) path += `&cursor=${encodeURIComponent(files.next)}`;
    const note = $("files-status");
    try {
      const page = await api(path);
      if (request !== files.request) return;
      files.rows = fresh ? page.items : files.rows.concat(page.items);
      files.next = page.next;
      note.dataset.kind = files.rows.length ? "" : "info";
      setText(note, files.rows.length ? `${files.rows.length}${files.next ? "+" : ""} file${files.rows.length === 1 ? "" : "s"}` : "No files yet.");
      $("files-rows").replaceChildren(...files.rows.map((f) => el("tr", { "data-testid": `file-row-${f.project}/${f.path}` },
        el("td", {}, el("span", { class: "muted" }, `${f.project}/`), f.path),
        el("td", {}, sizeText(f.size)),
        el("td", {}, String(f.version)),
        el("td", { class: "muted" }, f.content_type || "—"),
        el("td", { class: "muted" }, when(f.registered_at), f.registered_by ? ` by ${f.registered_by}` : ""),
        el("td", {}, f.object ? el("button", { type: "button", class: "ghost", "data-testid": `file-download-${f.project}/${f.path}`,
          onclick: () => downloadFile(f) }, "Download") : el("span", { class: "muted small" }, "no bytes stored")))));
      $("files-more").hidden = !files.next;
    } catch (e) {
      if (request !== files.request) return;
      note.dataset.kind = "bad";
      setText(note, "The files could not be read: " + problemText(e));
    }
  }

  /** The bytes come with the token (a plain link would not carry it), then are saved. */
  async function downloadFile(f) {
    const note = $("files-status");
    try {
      const response = await fetch(fileUrl(f), { headers: { Authorization: "Bearer " + token }, cache: "no-store", credentials: "omit" });
      if (!response.ok) {
        let detail = `${response.status} ${response.statusText}`;
        try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
        throw new ApiError(response.status, null, detail, null);
      }
      const url = URL.createObjectURL(await response.blob());
      const a = el("a", { href: url, download: f.path.split("/").pop() });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      note.dataset.kind = "";
      setText(note, `Downloaded ${f.project}/${f.path} (${sizeText(f.size)}).`);
    } catch (e) {
      note.dataset.kind = "bad";
      setText(note, `${f.project}/${f.path} could not be downloaded: ` + problemText(e));
    }
  }

  /** A search snippet: **word** marks a match. Split, never parsed as HTML. */
  function snippet(text) {
    const parts = String(text || "").split("**");
    return el("span", { class: "snippet" }, parts.map((part, i) => (i % 2 ? el("mark", {}, part) : part)));
  }

  async function search(event) {
    event.preventDefault();
    const q = $("search-input").value.trim();
    const note = $("search-status");
    const results = $("search-results");
    if (!q) return clearSearch();
    searching = true;
    $("pages-list").hidden = true;
    $("pages-more").hidden = true;
    $("search-clear").hidden = false;
    results.hidden = false;
    note.dataset.kind = "";
    setText(note, `Searching for “${q}”…`);
    try {
      const answer = await api(`/v1/search?q=${encodeURIComponent(q)}&limit=20`);
      if (!searching || $("search-input").value.trim() !== q) return;
      if (!answer.searched) {
        note.dataset.kind = "warn";
        const why = Object.entries(answer.answers || {}).map(([node, said]) => `${node}: ${said}`).join("; ");
        setText(note, `The knowledge base could not be searched just now: no data node could run the search` +
          (why ? ` (${why})` : "") + `. This is not the same as “no results”; try again shortly.`);
        results.replaceChildren();
        return;
      }
      const hits = answer.hits || [];
      const cov = answer.coverage || {};
      // A partial search says so: the hits are right, only not from every shard.
      const partial = answer.partial ? ` Partial: searched ${cov.searched} of ${cov.of} shards` +
        ((cov.missing || []).length ? `; ${cov.missing.join(", ")} did not answer.` : ".") : "";
      note.dataset.kind = answer.partial ? "warn" : hits.length ? "" : "info";
      setText(note, (hits.length ? `${hits.length} page${hits.length === 1 ? " matches" : "s match"} “${q}”.` : `No page matches “${q}”.`) + partial);
      results.replaceChildren(...hits.map((h) => pageButton({ path: h.path, title: h.title }, snippet(h.snippet))));
    } catch (e) {
      if (!searching) return;
      note.dataset.kind = "bad";
      setText(note, "The search failed: " + problemText(e));
    }
  }

  function clearSearch() {
    searching = false;
    $("search-input").value = "";
    $("search-results").hidden = true;
    $("search-results").replaceChildren();
    $("pages-list").hidden = false;
    $("search-clear").hidden = true;
    renderPages();
  }

  async function openPage(path) {
    pages.chosen = path;
    const box = $("page-detail");
    box.replaceChildren(el("p", { class: "muted" }, `Loading ${path}…`));
    for (const b of document.querySelectorAll("#panel-pages .item")) {
      b.classList.toggle("chosen", b.dataset.testid === `page-row-${path}`);
    }
    try {
      const page = await api(`/v1/pages/${path.split("/").map(encodeURIComponent).join("/")}`);
      if (pages.chosen !== path) return;
      const facts = el("dl", { class: "facts" });
      const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
      fact("Path", el("code", {}, page.path));
      fact("Version", String(page.version));
      fact("Written", page.updated_by ? `by ${page.updated_by}, ` : "", when(page.updated_at || page.created_at));
      box.replaceChildren(el("h3", { "data-testid": "page-detail-title" }, page.title), facts,
        page.body ? el("div", { class: "body" }, page.body) : el("p", { class: "muted" }, "This page is empty."));
    } catch (e) {
      if (pages.chosen !== path) return;
      box.replaceChildren(el("p", { class: "bad-text" }, `Page ${path} could not be read: ${problemText(e)}`));
    }
  }

  // ------------------------------------------------------------------ one seat

  async function openSeat(name) {
    const dialog = $("seat-dialog");
    const body = $("seat-dialog-body");
    setText($("seat-dialog-title"), `Seat ${name}`);
    body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    if (!dialog.open) dialog.showModal();
    try {
      const s = await api(`/v1/seats/${encodeURIComponent(name)}`);
      const [kind, label, why] = seatStatus(s);
      const facts = el("dl", { class: "facts" });
      const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
      fact("Status", pill(kind, label, why));
      fact("Held by", s.owner || el("span", { class: "muted" }, "no node"));
      fact("Waiting", String(s.pending ?? "—"));
      fact("Working", String(s.in_flight ?? "—"));
      if (typeof s.redelivered === "number") fact("Delivered again", String(s.redelivered));
      fact("Dead letters", String(s.dead_letters ?? 0));
      const mail = el("button", { type: "button", class: "primary" }, `Send mail to ${name}`);
      mail.addEventListener("click", () => {
        dialog.close();
        $("mail-seat").value = name;
        $("mail-text").focus();
      });
      const turns = s.last_turns || [];
      body.replaceChildren(facts, el("h3", {}, "Last turns"),
        turns.length ? el("ol", { class: "feed compact" }, turns.map(buildTurn)) : el("p", { class: "muted" }, "None yet."),
        el("div", { class: "row-end" }, mail));
    } catch (e) {
      body.replaceChildren(el("p", { class: "bad-text" }, `Seat ${name} could not be read: ${problemText(e)}`));
    }
  }

  // ------------------------------------------------------------------ mail

  async function sendMail(event) {
    event.preventDefault();
    const seat = $("mail-seat").value;
    const text = $("mail-text").value;
    const result = $("mail-result");
    if (!seat || !text.trim()) {
      result.dataset.kind = "bad";
      setText(result, !seat ? "Choose a seat." : "Write a message first.");
      return;
    }
    const button = $("mail-send");
    button.disabled = true;
    result.dataset.kind = "";
    setText(result, "Sending…");
    try {
      const sent = await api(`/v1/seats/${encodeURIComponent(seat)}/mail`, { method: "POST", body: { text } });
      result.dataset.kind = "ok";
      setText(result, `Sent to ${seat} (message #${sent.seq}). Its turn shows in the feed when it is done.`);
      $("mail-text").value = "";
    } catch (e) {
      result.dataset.kind = "bad";
      setText(result, `Not sent: ${problemText(e)}`);
    } finally {
      button.disabled = false;
    }
  }

  // ------------------------------------------------------------------ wiring

  function tick() {
    for (const t of document.querySelectorAll("time[data-ts]")) {
      if ("expires" in t.dataset) showExpiry(t, Number(t.dataset.ts));
      else setText(t, (t.dataset.prefix || "") + ago(Number(t.dataset.ts)));
    }
    showReconnecting();
  }

  function wire() {
    $("signin-form").addEventListener("submit", onSignIn);
    $("sign-out").addEventListener("click", () => {
      storeToken(null);
      showSignIn("");
    });
    $("retry-now").addEventListener("click", () => connect());
    $("seat-filter").addEventListener("input", () => schedule("seats"));
    $("seat-rows").addEventListener("click", (event) => {
      const button = event.target.closest("button.seat-link");
      if (button) openSeat(button.dataset.seat);
    });
    for (const tileButton of document.querySelectorAll(".tile")) {
      tileButton.addEventListener("click", () => {
        const goto = tileButton.dataset.goto;
        if (goto === "dlq") {
          selectTab("dlq", true);
          $("tab-dlq").scrollIntoView({ behavior: "smooth", block: "start" });
        } else {
          $(goto).scrollIntoView({ behavior: "smooth", block: "start" });
        }
      });
    }
    for (const t of TABS) $(`tab-${t}`).addEventListener("click", () => selectTab(t, false));
    document.querySelector(".tabs").addEventListener("keydown", (event) => {
      const i = TABS.indexOf(currentTab());
      if (event.key === "ArrowRight") selectTab(TABS[(i + 1) % TABS.length], true);
      else if (event.key === "ArrowLeft") selectTab(TABS[(i + TABS.length - 1) % TABS.length], true);
      else return;
      event.preventDefault();
    });
    $("dlq-refresh").addEventListener("click", refreshDeadLetters);
    $("dlq-more").addEventListener("click", () => loadDeadLetters(true));
    $("task-status").addEventListener("change", () => loadTasks(true));
    $("tasks-refresh").addEventListener("click", () => loadTasks(true));
    $("tasks-more").addEventListener("click", () => loadTasks(false));
    $("search-form").addEventListener("submit", search);
    $("search-clear").addEventListener("click", clearSearch);
    $("pages-refresh").addEventListener("click", () => (searching ? $("search-form").requestSubmit() : loadPages(true)));
    $("pages-more").addEventListener("click", () => loadPages(false));
    $("files-refresh").addEventListener("click", () => loadFiles(true));
    $("files-more").addEventListener("click", () => loadFiles(false));
    $("mail-form").addEventListener("submit", sendMail);
    $("approvals-refresh").addEventListener("click", refreshApprovals);
    $("conv-status").addEventListener("change", () => loadConversations(true));
    $("convs-refresh").addEventListener("click", () => {
      loadConversations(true);
      if (convs.chosen) openConversation(convs.chosen, true);
    });
    $("convs-more").addEventListener("click", () => loadConversations(false));
    setInterval(tick, 1000);
    // Dead letters and conversations are not on the live feed: look again now and then while shown.
    setInterval(() => {
      if (!token || !S.live || document.visibilityState !== "visible") return;
      if (currentTab() === "dlq") refreshDeadLetters();
      if (currentTab() === "convs") softRefresh("convs");
    }, 10000);
    // Nor are approvals, which someone is waiting on: read them often, and on coming back to the page.
    const approvalsDue = () => token && !$("main").hidden && document.visibilityState === "visible";
    setInterval(() => {
      if (approvalsDue()) refreshApprovals();
    }, APPROVALS_EVERY);
    document.addEventListener("visibilitychange", () => {
      if (approvalsDue()) refreshApprovals();
    });
  }

  function boot() {
    wire();
    renderSummary();
    token = initialToken();
    if (token) start();
    else showSignIn("");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
