/* The chat: one conversation with a seat, held from the page.
 *
 * What is shown comes from two places. The conversation's messages (the
 * estate) are the runs that have ended; a run going on is shown from its
 * events (RUNS, GET …/runs/{run}/stream): the seat's words as they come,
 * each tool call and then its result, an approval asked, the end. A run's
 * view (RunView) keeps what it showed and the id of the last event it applied
 * in this tab's sessionStorage, so a reload shows the same at once and asks
 * the stream only for what came after (Last-Event-ID): nothing twice. A
 * dropped stream is resumed the same way.
 *
 * Sending while a run goes on follows the chosen strategy, in plain words:
 * wait in line (enqueue), stop it and answer this (interrupt), undo its
 * answer and answer this (rollback), or don't send (reject: the node's 409
 * is told as "busy, retry in N s", not as an error).
 *
 * The conversation is read again (quietly) when a run of it that this page
 * does not watch ends (its turn shows on the live feed), on Refresh, and when
 * the list says it changed: a run started in another tab or by a program
 * shows up here.
 *
 * Keys: Enter sends, Shift+Enter is a new line, Escape stops the answer. */

import { api, problemText, refusal, request, seg } from "./api.js";
import { emit, on } from "./bus.js";
import { $, el, say, setText } from "./dom.js";
import { approvalCard, decide, decidedText, settledText } from "./approvals.js";
import { readEvents } from "./sse.js";
import { when } from "./time.js";
import { RUN_TRIGGER, convPill, humanize, plural } from "./words.js";

const MESSAGES_PAGE = 500;        // messages read a page at a time (the API's most)
const MESSAGES_MAX = 2000;        // messages of a conversation read at most
const SAVE_EVERY = 250;           // ms between saves of a streaming run's view
const SAVED_MAX = 512 * 1024;     // characters of a run's saved view at most (past it: not kept)
const RETRY_MAX = 15000;          // ms between tries to resume a dropped stream, at most
const SILENT_MAX = 45000;         // ms without a byte (heartbeats come every 15 s): the stream is dead
const TERMINAL = new Set(["run.completed", "run.failed", "run.interrupted"]);
const LIVE_RUN = new Set(["queued", "running"]);
const SAVED_PREFIX = "crewlet.chat.";

/* The conversation shown. Invariants: `views` holds a RunView per run shown
 * from its events (live, or ended while watched and not yet read back from
 * the estate), each one's element in #chat-log after the runs drawn from the
 * estate; `approval` is the pending approval shown inline, its item in the log. */
const chat = {
  id: null,            // the conversation shown (null: none)
  seat: null,          // its seat
  status: null,        // its status, as this page last knew it
  opening: 0,          // bumped per open: an older open's answer is dropped
  views: new Map(),    // run id -> RunView
  approval: null,      // {id, card, item}: the approval shown inline, pending
  busyUntil: 0,        // ms: a reject's "retry in" ends
  busyTimer: null,
  sending: null,       // {text, key} of a send in flight, or of one whose answer was lost
  notes: new Map(),    // run id -> a word shown before that run's item (a decision, an undo): kept on re-reads
};

// A tool call's element by the call's id, wherever it is shown: a call asked
// in one run (awaiting approval) gets its result in the run that resumes.
const callParts = new Map();

// ------------------------------------------------------------------ saved views

function savedKey(conversation) {
  return SAVED_PREFIX + conversation;
}

function loadSaved(conversation, run) {
  try {
    const saved = JSON.parse(sessionStorage.getItem(savedKey(conversation)) || "null");
    const model = saved && saved.model;
    const good = saved && saved.run === run && (saved.lastId === null || Number.isInteger(saved.lastId)) &&
      model && Array.isArray(model.parts) && model.parts.every((p) => p && typeof p.key === "string");
    return good ? saved : null;
  } catch (e) {
    return null;
  }
}

function forget(conversation) {
  try {
    sessionStorage.removeItem(savedKey(conversation));
  } catch (e) { /* storage refused: nothing was kept */ }
}

function forgetAll() {
  try {
    for (const key of Object.keys(sessionStorage)) if (key.startsWith(SAVED_PREFIX)) sessionStorage.removeItem(key);
  } catch (e) { /* storage refused: nothing was kept */ }
}

// ------------------------------------------------------------------ parts of the transcript

function you(text, at) {
  return el("div", { class: "message user", "data-testid": "conv-message", "data-role": "user" },
    el("div", { class: "message-head muted small" }, el("strong", { class: "message-who" }, "You"),
      at ? [" · ", when(at)] : null),
    el("div", { class: "message-text" }, text));
}

function saying(seat) {
  const text = el("div", { class: "message-text" });
  const node = el("div", { class: "message assistant", "data-testid": "conv-message", "data-role": "assistant" },
    el("div", { class: "message-head muted small" }, el("strong", { class: "message-who" }, seat)), text);
  return { node, text };
}

function toolCall(seat, name, args) {
  const state = el("span", { class: "tool-state muted small", "data-testid": "tool-state" }, "running…");
  const result = el("pre", { class: "tool-result", "data-testid": "tool-result", hidden: true });
  const node = el("div", { class: "message tool", "data-testid": "conv-message", "data-role": "tool", "data-error": "false" },
    el("div", { class: "message-head small" },
      el("span", { class: "muted" }, `${seat} calls `), el("code", { "data-testid": "tool-name" }, name), " ", state),
    el("details", { class: "tool-args" }, el("summary", { class: "muted small" }, "its arguments"),
      el("pre", { class: "args", "data-testid": "tool-args" }, JSON.stringify(args ?? {}, null, 2))),
    result);
  return { node, state, result, done: false };
}

function toolResult(part, text, error) {
  part.done = true;
  part.node.dataset.error = error ? "true" : "false";
  part.node.classList.toggle("bad", Boolean(error));
  setText(part.state, error ? "failed, or not run" : "done");
  part.result.hidden = false;
  setText(part.result, text ?? "");
}

/** Calls shown with no result yet, told why: they wait for a decision, or were not run. */
function unfinishedCalls(why) {
  for (const part of callParts.values()) if (!part.done) setText(part.state, why);
}

function ending(kind, text) {
  return el("p", { class: `run-end result`, "data-kind": kind, "data-testid": "run-end" }, text);
}

/** *node*'s text made *text*: what was there already is kept when it is the
 *  start of it (a streamed answer grows; a screen reader hears the new words). */
function grow(node, text) {
  const had = node.textContent;
  if (text.startsWith(had) && node.childNodes.length <= 64) {
    if (text.length > had.length) node.append(text.slice(had.length));
  } else {
    node.textContent = text;
  }
}

// ------------------------------------------------------------------ a run, from its events

/* A run shown from its events. Its model (what it showed) is plain data,
 * saved as it changes; the DOM is built from it, part by part. */
class RunView {
  constructor(conversation, seat, { run, input = null, saved = null, order = null }) {
    this.conversation = conversation;
    this.seat = seat;
    this.run = run;                        // its id
    this.dom = new Map();                  // part key -> its element's parts
    this.controller = new AbortController();
    this.closed = false;
    this.saveTimer = null;
    // data-order: where it goes among the runs (the estate's sequence of its start, or creation).
    this.node = el("li", { class: "run", "data-testid": "run", "data-run": run, "data-state": "live", "data-order": order });
    this.begin(saved ? saved.model : { input, parts: [], end: null }, saved ? saved.lastId : null);
  }

  /** Show *model* (as saved), the last event applied *lastId*. */
  begin(model, lastId) {
    this.model = model;
    this.lastId = lastId;                  // the last event applied: a resume asks after it
    this.dom.clear();
    this.node.replaceChildren();
    this.node.dataset.state = "live";
    if (this.model.input) this.node.append(you(this.model.input));
    for (const part of this.model.parts) this.draw(part);
    if (this.model.end) this.drawEnd(this.model.end);
  }

  get ended() {
    return this.model.end !== null;
  }

  get waiting() {
    return this.node.dataset.state === "queued";
  }

  /** Follow its events, from after the last one applied, until its end
   *  (or until closed): a dropped stream is asked again, backing off. */
  async follow() {
    let delay = 500;
    while (!this.ended && !this.closed) {
      const response = await this.open();
      if (response === "lost" || this.closed) return;
      if (response) {
        const before = this.lastId;
        let watchdog = null;
        const watch = () => {
          clearTimeout(watchdog);
          watchdog = setTimeout(() => this.controller.abort(), SILENT_MAX);
        };
        watch();
        try {
          await readEvents(response, (type, data, id) => this.event(type, data, id), { onBytes: watch });
        } catch (e) { /* dropped, or closed */ }
        clearTimeout(watchdog);
        if (this.lastId !== before) delay = 500;  // it was getting somewhere: try again soon
        if (this.controller.signal.aborted && !this.closed) this.controller = new AbortController();
      }
      if (this.ended || this.closed) break;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(RETRY_MAX, delay * 2);
    }
  }

  /** Its stream, after the last event applied: the response, null (try
   *  again later), or "lost" (its events cannot be read: told to the chat). */
  async open() {
    const headers = { Accept: "text/event-stream" };
    if (this.lastId !== null) headers["Last-Event-ID"] = String(this.lastId);
    let response;
    try {
      response = await request(`/v1/conversations/${seg(this.conversation)}/runs/${seg(this.run)}/stream`,
        { headers, signal: this.controller.signal });
    } catch (e) {
      return null;
    }
    if (response.ok) return response;
    const e = await refusal(response);
    if (response.status === 400 && e.code === "bad_last_event_id" && this.lastId !== null) {
      // What this tab kept is not of the stream the node has: shown again from its start.
      this.begin({ input: this.model.input, parts: [], end: null }, null);
      return null;
    }
    if ([401, 403, 404, 410].includes(response.status)) {
      if (!this.closed && response.status !== 401) emit("chat-lost", this, e.message);
      return "lost";
    }
    return null;
  }

  /** One event of its stream, applied once (an id at or below the last is a resend). */
  event(type, data, id) {
    if (this.closed) return;
    const seq = id !== null && /^\d+$/.test(id) ? Number(id) : null;
    if (seq !== null && this.lastId !== null && seq <= this.lastId) return;
    if (type !== null && data && typeof data === "object") this.apply(type, data);
    if (seq !== null) this.lastId = seq;
    this.saveSoon();
  }

  apply(type, d) {
    const parts = this.model.parts;
    if (type === "run.started") {
      emit("chat-run", this, "running");
    } else if (type === "message.delta") {
      const key = `t${d.round}`;
      let part = parts.find((p) => p.key === key);
      if (!part) {
        part = { key, kind: "text", text: "" };
        parts.push(part);
      }
      part.text = (d.restart ? "" : part.text) + String(d.text ?? "");
      this.draw(part);
    } else if (type === "tool.call") {
      const key = `c${d.call}`;
      if (!parts.some((p) => p.key === key)) {
        parts.push({ key, kind: "tool", call: d.call, name: d.name, args: d.args ?? null, result: null, error: false });
      }
      this.draw(parts.find((p) => p.key === key));
    } else if (type === "tool.result") {
      let part = parts.find((p) => p.key === `c${d.call}`);
      if (!part) {
        part = { key: `c${d.call}`, kind: "tool", call: d.call, name: d.name, args: null };
        parts.push(part);
      }
      part.result = typeof d.result === "string" ? d.result : JSON.stringify(d.result);
      part.error = Boolean(d.error);
      this.draw(part);
    } else if (type === "approval.requested") {
      const part = { key: `a${d.approval}`, kind: "approval", approval: d.approval, tool: d.tool };
      if (!parts.some((p) => p.key === part.key)) parts.push(part);
      this.draw(part);
      emit("approval-requested", d.approval);
    } else if (TERMINAL.has(type)) {
      this.model.end = { type, awaiting: d.awaiting_approval || null, error: d.error || null };
      this.drawEnd(this.model.end);
      this.save();
      emit("chat-run", this, d.awaiting_approval ? "awaiting_approval" : type === "run.failed" ? "error" : "idle");
    }
  }

  /** A part's element, made or brought up to date. */
  draw(part) {
    let dom = this.dom.get(part.key);
    if (part.kind === "text") {
      if (!dom) {
        dom = saying(this.seat);
        this.node.append(dom.node);
        this.dom.set(part.key, dom);
      }
      grow(dom.text, part.text);
    } else if (part.kind === "tool") {
      if (!dom || !dom.node.isConnected) {
        // A call shown already and waiting for its result (asked in the run that
        // waited for approval), or this view's own drawn again from the record:
        // shown there, not twice. (Call ids are a turn's own: another run's
        // finished call of the same id is another call.)
        const shown = callParts.get(part.call);
        const same = shown && shown.node.isConnected && (dom || !shown.done);
        dom = same ? shown : toolCall(this.seat, part.name, part.args);
        if (!same) this.node.append(dom.node);
        this.dom.set(part.key, dom);
        callParts.set(part.call, dom);
      }
      if (part.result !== null && part.result !== undefined) toolResult(dom, part.result, part.error);
    } else if (part.kind === "approval" && !dom) {
      dom = { node: el("div", { class: "message approval-ask", "data-role": "approval" },
        el("p", { class: "muted small" }, `${this.seat} asks to call `, el("code", {}, part.tool), ": it waits for a decision.")) };
      this.node.append(dom.node);
      this.dom.set(part.key, dom);
    }
    stickToBottom();
  }

  drawEnd(end) {
    this.node.dataset.state = end.type.slice("run.".length);
    const waiting = this.node.querySelector(".run-end[data-kind=info]");
    if (waiting) waiting.remove();  // "waiting in line": it is not
    if (end.type === "run.interrupted") {
      this.node.append(ending("warn", `Stopped${end.error ? ": " + end.error : "."}`));
    } else if (end.type === "run.failed") {
      this.node.append(ending("bad", `It failed${end.error ? ": " + end.error : "."}`));
    } else if (end.awaiting) {
      this.node.append(ending("warn", "It asked for a person's decision before running a tool."));
    }
    unfinishedCalls(end.awaiting ? "waits for your decision" : "not run");
    stickToBottom();
  }

  saveSoon() {
    if (this.saveTimer !== null) return;
    this.saveTimer = setTimeout(() => this.save(), SAVE_EVERY);
  }

  save() {
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    if (this.closed) return;
    try {
      const text = JSON.stringify({ run: this.run, lastId: this.lastId, model: this.model });
      if (text.length <= SAVED_MAX) sessionStorage.setItem(savedKey(this.conversation), text);
      else forget(this.conversation);
    } catch (e) { /* storage full or refused: a reload reads the run from its start */ }
  }

  close() {
    this.closed = true;
    clearTimeout(this.saveTimer);
    this.controller.abort();
  }
}

// ------------------------------------------------------------------ the estate's messages

/** The ended runs' messages, a run to an item: the seat's words, each tool
 *  call with its result (in the item of the run that asked it), as a run's
 *  view shows them. */
function drawMessages(messages, seat) {
  const runs = [];
  const byRun = new Map();
  for (const m of messages) {
    let run = byRun.get(m.run);
    if (!run) {
      run = el("li", { class: "run", "data-testid": "run", "data-run": m.run || "", "data-state": "kept",
        "data-order": Array.isArray(m.place) ? m.place[0] : m.seq });
      byRun.set(m.run, run);
      runs.push(run);
    }
    if (m.role === "user") {
      run.append(you(m.text, m.at));
    } else if (m.role === "assistant") {
      if (m.text) {
        const part = saying(seat);
        setText(part.text, m.text);
        run.append(part.node);
      }
      for (const c of m.calls || []) {
        const part = toolCall(seat, c.name, c.args);
        callParts.set(c.id, part);
        run.append(part.node);
      }
    } else if (m.role === "tool") {
      let part = callParts.get(m.call_id);   // the latest call of that id: ids are a turn's own
      if (!part || part.done) {
        part = toolCall(seat, m.name || "a tool", null);
        run.append(part.node);
      }
      toolResult(part, m.text, m.error);
    } else {
      run.append(el("div", { class: "message", "data-testid": "conv-message", "data-role": m.role },
        el("div", { class: "message-head muted small" }, humanize(m.role || "note")),
        el("div", { class: "message-text" }, m.text || "")));
    }
  }
  return runs;
}

// ------------------------------------------------------------------ the view

function log() {
  return $("chat-log");
}

/** Keep the newest in sight, unless the person scrolled up to read. */
let following = true;

function stickToBottom() {
  const box = log();
  if (following) box.scrollTop = box.scrollHeight;
}

/** The run views that are still going, newest last. */
function liveViews() {
  return [...chat.views.values()].filter((v) => !v.ended);
}

/** The conversation's status shown, and told to the list; the Stop button
 *  and the log's busy state follow the runs still going. */
function setStatus(status) {
  chat.status = status;
  const holder = $("conv-detail-status");
  holder.dataset.status = status;
  holder.replaceChildren(convPill(status));
  const live = liveViews().length > 0;
  const stop = $("chat-stop");
  if (!live && !stop.hidden && stop.contains(document.activeElement)) $("chat-input").focus();
  stop.hidden = !live;
  // Words streaming in are not announced one by one: the log is busy while a run is written.
  if (live) $("chat-log-box").setAttribute("aria-busy", "true");
  else $("chat-log-box").removeAttribute("aria-busy");
  if (live && !chat.busyUntil) say($("chat-status"), "info", `${chat.seat} is answering…`);
  emit("conversation", { id: chat.id, status, ran: log().querySelector("li.run[data-run]") !== null });
}

function addView(view) {
  chat.views.set(view.run, view);
  log().append(view.node);
  if (chat.approval) log().append(chat.approval.item);  // the decision stays last
  stickToBottom();
  return view;
}

function closeViews() {
  for (const view of chat.views.values()) view.close();
  chat.views.clear();
  chat.approval = null;
  callParts.clear();
}

/** Nothing shown: the chat's parts back to their empty state. */
function reset() {
  closeViews();
  clearBusy();
  chat.id = null;
  chat.seat = null;
  chat.status = null;
  chat.sending = null;
  chat.notes.clear();
  following = true;
  log().replaceChildren();
  say($("chat-status"), "", "");
}

/** The chat's words for *seat*. */
function label(seat) {
  setText($("chat-title"), seat ? `Conversation with ${seat}` : "Conversation");
  setText($("chat-input-label"), seat ? `Message to ${seat}` : "Message");
  $("chat-input").placeholder = seat ? `Write to ${seat}…` : "";
  setText($("chat-strategy-label"), `If ${seat || "it"} is still answering`);
  $("chat-send").setAttribute("aria-label", seat ? `Send to ${seat}` : "Send");
  $("chat-stop").setAttribute("aria-label", seat ? `Stop ${seat}'s answer` : "Stop");
}

/** Show conversation *id* (quiet: read it again, the focus left where it is). */
export async function openChat(id, { quiet = false, focus = true } = {}) {
  const opening = ++chat.opening;
  if (chat.id !== id) {
    reset();
    chat.id = id;
    quiet = false;
  }
  $("chat-empty").hidden = true;
  $("chat").hidden = false;
  if (!quiet) {
    label(null);
    setText($("chat-title"), `Loading ${id}…`);
    setText($("chat-id"), id);
  }
  let d;
  const messages = [];
  try {
    for (let cursor = null; ;) {
      const page = await api(`/v1/conversations/${seg(id)}?limit=${MESSAGES_PAGE}` + (cursor ? `&cursor=${seg(cursor)}` : ""));
      if (opening !== chat.opening) return;
      d = d || page;
      messages.push(...(page.messages || []));
      cursor = page.next;
      if (!cursor || messages.length >= MESSAGES_MAX) break;
    }
  } catch (e) {
    if (opening !== chat.opening) return;
    if (!quiet) {
      // Nothing of another conversation stays under this one's name, nor can be sent to.
      $("chat").hidden = true;
      $("chat-empty").hidden = false;
      say($("chat-empty"), "bad", `Conversation ${id} could not be read: ${problemText(e)}`);
    }
    return;
  }
  const c = d.conversation;
  chat.seat = c.seat;
  label(c.seat);
  setText($("chat-id"), c.id);

  // The run going on (or the last one), and what this tab kept of it.
  const current = d.run;
  const live = current && LIVE_RUN.has(current.status);
  const recorded = new Set(messages.map((m) => m.run));
  // A run watched here and completed is drawn from the record once the record
  // has it (this copy may not yet, a moment after its end): not both. One
  // stopped or failed stays as watched: the record keeps no half-written answer.
  for (const [run, view] of [...chat.views]) {
    if (view.ended && view.model.end.type === "run.completed" && recorded.has(run)) {
      view.close();
      chat.views.delete(run);
    }
  }
  if (chat.approval && (c.status !== "awaiting_approval" || c.approval !== chat.approval.id)) chat.approval = null;
  const watched = new Set(chat.views.keys());
  if (live) watched.add(current.id);
  callParts.clear();
  const items = [...drawMessages(messages.filter((m) => !watched.has(m.run)), c.seat),
    ...[...chat.views.values()].map((v) => v.node)];
  // In the order the runs started (a view not placed yet last: it is the newest).
  const order = (item) => (item.dataset.order ? Number(item.dataset.order) : Infinity);
  log().replaceChildren(...items.sort((x, y) => order(x) - order(y)));
  if (!messages.length && !live && !chat.views.size) {
    log().append(el("li", { class: "muted chat-hello", "data-testid": "chat-hello" },
      `Say something to ${c.seat}. Its answer streams in as it is written.`));
  }
  for (const view of chat.views.values()) {
    for (const part of view.model.parts) if (part.kind === "tool") view.draw(part);  // its calls known again
  }
  if (chat.approval) log().append(chat.approval.item);
  placeNotes();
  if (c.status === "awaiting_approval") unfinishedCalls("waits for your decision");
  if (live && !chat.views.has(current.id)) {
    const input = messages.find((m) => m.run === current.id && m.role === "user")?.text ?? current.input ?? null;
    const view = addView(new RunView(id, c.seat, { run: current.id, input: input || null,
      saved: loadSaved(id, current.id), order: current.started_seq ?? current.seq }));
    if (current.status === "queued") view.node.dataset.state = "queued";
    view.follow();
  } else if (!live) {
    forget(id);
  }
  setStatus(live ? "running" : c.status);
  if (c.status === "awaiting_approval" && c.approval) showApproval(c.approval);
  else if (!live && !quiet) say($("chat-status"), "", c.status === "error" ? "Its last run failed: send again to retry." : "");
  stickToBottom();
  if (!quiet && focus) $("chat-input").focus();
}

/** The words said before runs' items (a decision that resumed one, an undo
 *  one followed: chat.notes), put back before them after a re-read. */
function placeNotes() {
  for (const [run, node] of chat.notes) {
    const item = log().querySelector(`li.run[data-run="${CSS.escape(run)}"]`);
    if (item && item.previousElementSibling !== node) item.before(node);
    else if (!item && !node.isConnected) log().append(node);
  }
}

/** The conversation shown (its id), or null. */
export function chatShown() {
  return chat.id;
}

/** What the list read of conversation *row*: if it says other than the chat
 *  knows (a run started elsewhere), the chat reads it again. */
export function listed(row) {
  if (row.id !== chat.id || chat.status === null) return;
  const mine = liveViews().length ? "running" : chat.status;
  if (row.status !== mine) openChat(chat.id, { quiet: true });
}

/** Read the shown conversation again (Refresh). */
export function refreshChat() {
  if (chat.id) openChat(chat.id, { quiet: true });
}

// ------------------------------------------------------------------ an approval, inline

async function showApproval(id) {
  if (chat.approval && chat.approval.id === id) return;
  const conversation = chat.id;
  let a;
  try {
    a = await api(`/v1/approvals/${seg(id)}`);
  } catch (e) {
    say($("chat-status"), "bad", `The tool call waiting for a decision could not be read: ${problemText(e)}`);
    return;
  }
  if (chat.id !== conversation || !a || a.status !== "pending" || (chat.approval && chat.approval.id === id)) return;
  const card = approvalCard(a, "chat-approval");
  const item = el("li", { class: "run approval-inline", "data-testid": "chat-approval", role: "group",
    "aria-label": `${a.seat} asks to call ${a.tool}` }, el("ol", { class: "approvals" }, card.item));
  chat.approval = { id, card, item };
  card.approve.addEventListener("click", () => decideHere(a, card, "approve"));
  card.deny.addEventListener("click", () => decideHere(a, card, "deny"));
  log().append(item);
  setStatus("awaiting_approval");
  say($("chat-status"), "warn", `${a.seat} waits for your decision on its call to ${a.tool}.`);
  stickToBottom();
}

async function decideHere(a, card, decision) {
  if (card.busy) return;
  try {
    await decide(a, card, decision);  // its "approval-decided" resumes the view (below)
  } catch (e) {
    if (e.status === 409 || e.status === 404) {
      say(card.message, "bad", settledText(e));
      if (chat.approval && chat.approval.id === a.id) chat.approval = null;  // settled: not shown again
      setTimeout(() => { if (chat.id === a.conversation) openChat(a.conversation, { quiet: true }); }, 1500);
    }
  }
}

/** A decision taken (here, or in the panel): said in place of the card, and
 *  the run that resumes the conversation followed. */
function resumed(a, answer, note) {
  if (chat.id !== a.conversation) return;
  const decision = (answer && answer.decision) || "approve";
  const shown = chat.approval && chat.approval.id === a.id ? chat.approval : null;
  const run = answer && answer.resumed_by;
  if (shown) {
    const hadFocus = shown.item.contains(document.activeElement);
    const said = el("li", { class: "run-note", "data-testid": "chat-decided" },
      ending(decision === "approve" ? "ok" : "warn", decidedText(a, decision, note)));
    shown.item.replaceWith(said);
    chat.approval = null;
    if (run) chat.notes.set(run, said);
    if (hadFocus) $("chat-input").focus();
  }
  if (!run || chat.views.has(run)) return;
  addView(new RunView(a.conversation, chat.seat, { run })).follow();
  setStatus("running");
}

// ------------------------------------------------------------------ sending

function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "dash-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function send(event) {
  if (event) event.preventDefault();
  if (!chat.id || (chat.sending && chat.sending.busy)) return;  // one send at a time
  const input = $("chat-input");
  const text = input.value;
  const status = $("chat-status");
  if (!text.trim()) {
    say(status, "bad", "Write a message first.");
    return;
  }
  const strategy = $("chat-strategy").value;
  if (Date.now() < chat.busyUntil && strategy === "reject") return;  // the countdown says when
  // The same message sent again (its answer was lost) keeps its key: the node answers it once.
  if (!chat.sending || chat.sending.text !== text || chat.sending.strategy !== strategy) {
    chat.sending = { text, strategy, key: idempotencyKey() };
  }
  const sending = chat.sending;
  const conversation = chat.id;
  const button = $("chat-send");
  sending.busy = true;
  button.disabled = true;
  let response;
  try {
    // Not `stream: true`: the answer names the run at once, and what a
    // rollback removed; the run's events are then read from its start.
    response = await request(`/v1/conversations/${seg(conversation)}/runs`, {
      method: "POST", headers: { "Idempotency-Key": sending.key },
      body: { input: text, multitask_strategy: strategy },
    });
  } catch (e) {
    say(status, "bad", `Not sent: ${problemText(e)} Sending it again is safe: it is answered once.`);
    return;
  } finally {
    sending.busy = false;
    button.disabled = false;
  }
  if (chat.id !== conversation) return;
  if (response.status === 409) {
    chat.sending = null;
    const e = await refusal(response);
    if (e.code === "conversation_busy") return busy(e);
    if (e.code === "pending_approval") {
      say(status, "warn", `${chat.seat} waits for your decision on a tool call first: approve or deny it, then send.`);
      if (e.body && e.body.approval) await showApproval(e.body.approval);
      if (chat.approval) chat.approval.card.approve.focus();
      return;
    }
    say(status, "bad", `Not sent: ${e.message}`);
    return;
  }
  if (!response.ok) {
    chat.sending = null;
    say(status, "bad", `Not sent: ${problemText(await refusal(response))}`);
    return;
  }
  let accepted;
  try {
    accepted = await response.json();
  } catch (e) {
    accepted = null;
  }
  if (chat.id !== conversation || !accepted || !accepted.run) return;
  chat.sending = null;
  if (input.value === text) input.value = "";
  clearBusy();
  const hello = log().querySelector(".chat-hello");
  if (hello) hello.remove();
  following = true;
  if ((strategy === "interrupt" || strategy === "rollback") && chat.approval) {
    // The node denied the pending call for this run: the card is not waiting any more.
    chat.approval.item.remove();
    chat.approval = null;
  }
  if (accepted.rolled_back) undone(accepted.rolled_back, accepted.run.id);
  if (chat.views.has(accepted.run.id)) return;  // a resend answered with its run
  const view = addView(new RunView(conversation, chat.seat, { run: accepted.run.id, input: text,
    order: accepted.run.started_seq ?? accepted.run.seq }));
  if (accepted.queued) {
    view.node.append(ending("info", `Waiting in line: ${chat.seat} answers this when it has finished.`));
    view.node.dataset.state = "queued";
  }
  setStatus("running");
  view.follow();
}

/** A rollback removed a run's messages: its item goes, a word says what stays done. */
function undone(rolled, next) {
  const gone = log().querySelector(`li.run[data-run="${CSS.escape(rolled.run)}"]`);
  const view = chat.views.get(rolled.run);
  if (view) {
    view.close();
    chat.views.delete(rolled.run);
  }
  const tools = (rolled.calls || []).map((c) => c && c.name).filter(Boolean);
  const said = el("li", { class: "run-note", "data-testid": "chat-undone" }, ending("info",
    `Undid ${chat.seat}'s last answer (${plural(rolled.removed || 0, "message", "messages")} removed).` +
    (tools.length ? ` The tools it ran stay done: ${tools.join(", ")}.` : "")));
  if (gone) gone.replaceWith(said);
  else log().append(said);
  chat.notes.set(next, said);
}

/** reject's 409: said once as what it is — busy — and when to try again
 *  counted down beside it (not in the live region: not announced each second). */
function busy(e) {
  const after = Number((e.body && e.body.retry_after) || 1);
  chat.busyUntil = Date.now() + Math.max(1, after) * 1000;
  const status = $("chat-status");
  status.dataset.busy = "true";
  say(status, "info", `${chat.seat} is busy answering, so this was not sent: ` +
    "retry shortly, or choose to wait in line or stop it.");
  showBusy();
  clearInterval(chat.busyTimer);
  chat.busyTimer = setInterval(showBusy, 1000);
}

function showBusy() {
  const left = Math.ceil((chat.busyUntil - Date.now()) / 1000);
  const retry = $("chat-retry");
  retry.hidden = false;
  if (left > 0) {
    setText(retry, `busy, retry in ${left} s`);
  } else {
    clearBusy();
    say($("chat-status"), "info", "You can send it now.");
  }
}

function clearBusy() {
  clearInterval(chat.busyTimer);
  chat.busyTimer = null;
  chat.busyUntil = 0;
  delete $("chat-status").dataset.busy;
  $("chat-retry").hidden = true;
  setText($("chat-retry"), "");
}

/** Stop the answer being written (those waiting in line wait on: they start
 *  next); with none being written, the ones waiting. */
async function stop() {
  const live = liveViews();
  const writing = live.filter((v) => !v.waiting);
  const views = writing.length ? writing : live;
  if (!views.length) return;
  say($("chat-status"), "info", "Stopping…");
  for (const view of views) {
    try {
      await api(`/v1/conversations/${seg(view.conversation)}/runs/${seg(view.run)}/cancel`, { method: "POST" });
    } catch (e) {
      say($("chat-status"), "bad", `Could not stop it: ${problemText(e)}`);
      return;
    }
  }
}

// ------------------------------------------------------------------ wiring

export function wireChat() {
  $("chat-form").addEventListener("submit", send);
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(null);
    } else if (event.key === "Escape" && liveViews().length) {
      event.preventDefault();
      stop();
    }
  });
  $("chat-stop").addEventListener("click", stop);
  log().addEventListener("scroll", () => {
    const box = log();
    following = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  });
}

on("chat-run", (view, status) => {
  if (view.conversation !== chat.id || view.closed) return;
  if (status === "running") {
    if (view.waiting) {
      view.node.dataset.state = "live";
      const waiting = view.node.querySelector(".run-end[data-kind=info]");
      if (waiting) waiting.remove();
    }
    setStatus("running");
    return;
  }
  if (liveViews().length) return setStatus("running");
  setStatus(status);
  const end = view.model.end;
  if (status === "awaiting_approval" && end.awaiting) showApproval(end.awaiting);
  else if (chat.busyUntil) return;
  else if (end.type === "run.interrupted") say($("chat-status"), "warn", `${chat.seat} stopped.`);
  else if (end.type === "run.failed") say($("chat-status"), "bad", `${chat.seat}'s answer failed.`);
  else say($("chat-status"), "ok", `${chat.seat} answered.`);
});
on("chat-lost", (view, why) => {
  if (view.conversation !== chat.id || view.closed) return;
  // The events are gone (kept an hour) or the run is: what the estate kept is shown.
  view.close();
  chat.views.delete(view.run);
  forget(view.conversation);
  say($("chat-status"), "info", `Read from the record: ${why}`);
  openChat(view.conversation, { quiet: true });
});
on("approval-decided", ({ approval, answer, note }) => {
  // Decided in the Approvals panel (or here): the conversation shown goes on.
  // (A skill's promotion is of no conversation: none goes on.)
  if (approval.conversation && approval.conversation === chat.id) resumed(approval, answer, note);
});
on("turn", (d) => {
  // A run of the conversation shown ended that this page does not watch (a
  // program's, another tab's): read it again.
  const trigger = String(d.trigger || "");
  if (!chat.id || !trigger.startsWith(RUN_TRIGGER)) return;
  const run = trigger.slice(RUN_TRIGGER.length).split(".")[0];
  if (!chat.views.has(run)) openChat(chat.id, { quiet: true });
});
on("signed-out", () => {
  // Nothing of a conversation stays in the tab, nor streams, once signed out.
  reset();
  forgetAll();
  $("chat").hidden = true;
  $("chat-empty").hidden = false;
  say($("chat-empty"), "", "Choose a conversation, or start one with any seat.");
});
