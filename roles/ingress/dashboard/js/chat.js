/* The chat: one conversation with a seat, held from the page.
 *
 * What is shown comes from two places. The conversation's messages (the
 * estate) are every run that has ended; a run going on is shown from its
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
 * Keys: Enter sends, Shift+Enter is a new line, Escape stops the answer. */

import { problemText, refusal, request, seg } from "./api.js";
import { emit, on } from "./bus.js";
import { $, el, pill, say, setText } from "./dom.js";
import { approvalCard, decide, decidedText, settledText } from "./approvals.js";
import { readEvents } from "./sse.js";
import { when } from "./time.js";
import { humanize, plural } from "./words.js";

const MESSAGES_PAGE = 500;        // messages read a page at a time (the API's most)
const MESSAGES_MAX = 2000;        // messages of a conversation read at most
const SAVE_EVERY = 250;           // ms between saves of a streaming run's view
const SAVED_MAX = 512 * 1024;     // characters of a run's saved view at most (past it: not kept)
const RETRY_MAX = 15000;          // ms between tries to resume a dropped stream, at most
const SILENT_MAX = 45000;         // ms without a byte (heartbeats come every 15 s): the stream is dead
const TERMINAL = new Set(["run.completed", "run.failed", "run.interrupted"]);
const LIVE_RUN = new Set(["queued", "running"]);

export const CONV_KINDS = {
  idle: ["unknown", "Idle", "no run now: it waits for the next message"],
  running: ["ok", "Answering", "a run is working on it now"],
  awaiting_approval: ["warn", "Awaiting approval", "a tool call waits for a person's decision"],
  error: ["bad", "Error", "its last run failed"],
};

export function convPill(status) {
  const [kind, label, why] = CONV_KINDS[status] || ["unknown", humanize(status || "unknown"), null];
  return pill(kind, label, why);
}

/* The conversation shown. Invariant: `views` holds a RunView per run shown
 * from its events (live, or ended while watched), each one's element in
 * #chat-log; every other run is shown from the estate's messages. */
const chat = {
  id: null,            // the conversation shown (null: none)
  seat: null,          // its seat
  status: null,        // its status, as this page last knew it
  opening: 0,          // bumped per open: an older open's answer is dropped
  views: new Map(),    // run id -> RunView
  approval: null,      // {id, card, item}: the approval shown inline, pending
  busyUntil: 0,        // ms: a reject's "retry in" ends
  busyTimer: null,
};

// A tool call's element by the call's id, wherever it is shown: a call asked
// in one run (awaiting approval) gets its result in the run that resumes.
const callParts = new Map();

// ------------------------------------------------------------------ saved views

function savedKey(conversation) {
  return `crewlet.chat.${conversation}`;
}

function loadSaved(conversation) {
  try {
    const saved = JSON.parse(sessionStorage.getItem(savedKey(conversation)) || "null");
    return saved && typeof saved === "object" && typeof saved.run === "string" ? saved : null;
  } catch (e) {
    return null;
  }
}

function forget(conversation) {
  try {
    sessionStorage.removeItem(savedKey(conversation));
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
  return { node, state, result };
}

function toolResult(part, text, error) {
  part.node.dataset.error = error ? "true" : "false";
  part.node.classList.toggle("bad", Boolean(error));
  setText(part.state, error ? "failed, or not run" : "done");
  part.result.hidden = false;
  setText(part.result, text ?? "");
}

function ending(kind, text) {
  return el("p", { class: `run-end result`, "data-kind": kind, "data-testid": "run-end" }, text);
}

// ------------------------------------------------------------------ a run, from its events

/* A run shown from its events. Its model (what it showed) is plain data,
 * saved as it changes; the DOM is built from it, part by part. */
class RunView {
  constructor(conversation, seat, { run, input = null, saved = null }) {
    this.conversation = conversation;
    this.seat = seat;
    this.run = run;                        // its id
    this.lastId = saved ? saved.lastId : null;  // the last event applied: a resume asks after it
    this.model = saved ? saved.model : { input, parts: [], end: null };
    this.dom = new Map();                  // part key -> its element's parts
    this.controller = new AbortController();
    this.closed = false;
    this.saveTimer = null;
    this.node = el("li", { class: "run", "data-testid": "run", "data-run": run, "data-state": "live" });
    if (this.model.input) this.node.append(you(this.model.input));
    for (const part of this.model.parts) this.draw(part);
    if (this.model.end) this.drawEnd(this.model.end);
  }

  get ended() {
    return this.model.end !== null;
  }

  /** Follow its events, from after the last one applied, until its end
   *  (or until closed): a dropped stream is asked again, backing off. */
  async follow() {
    let delay = 500;
    let response = null;
    while (!this.ended && !this.closed) {
      if (!response) {
        const headers = { Accept: "text/event-stream" };
        if (this.lastId !== null) headers["Last-Event-ID"] = String(this.lastId);
        try {
          response = await request(`/v1/conversations/${seg(this.conversation)}/runs/${seg(this.run)}/stream`,
            { headers, signal: this.controller.signal });
        } catch (e) {
          if (this.closed) return undefined;
          response = null;
        }
        if (response && (response.status === 404 || response.status === 410)) {
          return this.lost((await refusal(response)).message);
        }
        if (response && !response.ok) {
          if (response.status === 401 || response.status === 403) return this.lost((await refusal(response)).message);
          response = null;
        }
      }
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
        response = null;
        if (this.lastId !== before) delay = 500;  // it was getting somewhere: try again soon
        if (this.controller.signal.aborted && !this.closed) this.controller = new AbortController();
      }
      if (this.ended || this.closed) break;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(RETRY_MAX, delay * 2);
    }
    return undefined;
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
      const part = { key: `c${d.call}`, kind: "tool", call: d.call, name: d.name, args: d.args, result: null, error: false };
      if (!parts.some((p) => p.key === part.key)) parts.push(part);
      this.draw(part);
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
        dom.node.setAttribute("aria-busy", "true");
        this.node.append(dom.node);
        this.dom.set(part.key, dom);
      }
      setText(dom.text, part.text);
    } else if (part.kind === "tool") {
      if (!dom) {
        // A result of a call shown in an earlier run (it waited for approval): shown there.
        const asked = part.args === null ? callParts.get(part.call) : null;
        dom = asked && asked.node.isConnected ? asked : toolCall(this.seat, part.name, part.args);
        if (dom !== asked) this.node.append(dom.node);
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
    for (const dom of this.dom.values()) dom.node.removeAttribute("aria-busy");
    this.node.dataset.state = end.type.slice("run.".length);
    const waiting = this.node.querySelector(".run-end[data-kind=info]");
    if (waiting) waiting.remove();  // "waiting in line": it is not
    if (end.type === "run.interrupted") {
      this.node.append(ending("warn", `Stopped${end.error ? ": " + end.error : "."}`));
    } else if (end.type === "run.failed") {
      this.node.append(ending("bad", `It failed${end.error ? ": " + end.error : "."}`));
    } else if (end.awaiting) {
      this.node.append(ending("warn", "Waiting for your decision on the tool call below."));
    }
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

  /** Its events can no longer be read: the estate has what it kept. */
  lost(why) {
    if (!this.closed) emit("chat-lost", this, why);
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
      run = { node: el("li", { class: "run", "data-testid": "run", "data-run": m.run || "", "data-state": "kept" }) };
      byRun.set(m.run, run);
      runs.push(run.node);
    }
    if (m.role === "user") {
      run.node.append(you(m.text, m.at));
    } else if (m.role === "assistant") {
      if (m.text) {
        const part = saying(seat);
        setText(part.text, m.text);
        run.node.append(part.node);
      }
      for (const c of m.calls || []) {
        const part = toolCall(seat, c.name, c.args);
        callParts.set(c.id, part);
        run.node.append(part.node);
      }
    } else if (m.role === "tool") {
      let part = callParts.get(m.call_id);
      if (!part) {
        part = toolCall(seat, m.name || "a tool", null);
        run.node.append(part.node);
      }
      toolResult(part, m.text, m.error);
    } else {
      run.node.append(el("div", { class: "message", "data-testid": "conv-message", "data-role": m.role },
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

function setStatus(status) {
  chat.status = status;
  const holder = $("conv-detail-status");
  holder.dataset.status = status;
  holder.replaceChildren(convPill(status));
  const live = [...chat.views.values()].some((v) => !v.ended);
  $("chat-stop").hidden = !live;
  if (live) say($("chat-status"), "info", `${chat.seat} is answering…`);
  emit("conversation", { id: chat.id, seat: chat.seat, status, ran: log().querySelector("li.run[data-run]") !== null });
}

/** The run views that are still going, newest last. */
function liveViews() {
  return [...chat.views.values()].filter((v) => !v.ended);
}

function addView(view) {
  chat.views.set(view.run, view);
  log().append(view.node);
  stickToBottom();
  return view;
}

function closeViews() {
  for (const view of chat.views.values()) view.close();
  chat.views.clear();
  chat.approval = null;
}

/** Show conversation *id* (quiet: a refresh, the focus left where it is). */
export async function openChat(id, { quiet = false, focus = true } = {}) {
  const opening = ++chat.opening;
  if (chat.id !== id) {
    closeViews();
    callParts.clear();
    chat.id = id;
    following = true;
    say($("chat-status"), "", "");
  }
  const box = $("conv-detail");
  box.dataset.open = "true";
  $("chat-empty").hidden = true;
  $("chat").hidden = false;
  if (!quiet) setText($("chat-title"), `Loading ${id}…`);
  let d;
  const messages = [];
  try {
    for (let cursor = null; ;) {
      const page = await getJSON(`/v1/conversations/${seg(id)}?limit=${MESSAGES_PAGE}` + (cursor ? `&cursor=${seg(cursor)}` : ""));
      if (opening !== chat.opening) return;
      d = d || page;
      messages.push(...(page.messages || []));
      cursor = page.next;
      if (!cursor || messages.length >= MESSAGES_MAX) break;
    }
  } catch (e) {
    if (opening !== chat.opening) return;
    setText($("chat-title"), `Conversation ${id}`);
    say($("chat-status"), "bad", `Conversation ${id} could not be read: ${problemText(e)}`);
    return;
  }
  const c = d.conversation;
  chat.seat = c.seat;
  setText($("chat-title"), `Conversation with ${c.seat}`);
  setText($("chat-id"), c.id);
  setText($("chat-input-label"), `Message to ${c.seat}`);
  $("chat-input").placeholder = `Write to ${c.seat}…`;
  setText($("chat-strategy-label"), `If ${c.seat} is still answering`);
  $("chat-send").setAttribute("aria-label", `Send to ${c.seat}`);
  $("chat-stop").setAttribute("aria-label", `Stop ${c.seat}'s answer`);

  // The run going on (or the last one), and what this tab kept of it.
  const current = d.run;
  const saved = loadSaved(id);
  const live = current && LIVE_RUN.has(current.status);
  const kept = live ? messages.filter((m) => m.run !== current.id) : messages;
  // A run watched on this page stays shown from its events (the estate may
  // not have its last message yet on this copy): its messages are not drawn twice.
  const watched = new Set([...chat.views.values()].map((v) => v.run).filter(Boolean));
  const watching = live ? chat.views.get(current.id) : null;
  log().replaceChildren(...drawMessages(kept.filter((m) => !watched.has(m.run)), c.seat));
  if (!messages.length && !live) log().append(el("li", { class: "muted chat-hello", "data-testid": "chat-hello" },
    `Say something to ${c.seat}. Its answer streams in as it is written.`));
  for (const view of chat.views.values()) log().append(view.node);
  if (chat.approval) log().append(chat.approval.item);
  if (live && !watching) {
    const input = messages.find((m) => m.run === current.id && m.role === "user")?.text ?? current.input ?? null;
    const view = addView(new RunView(id, c.seat, {
      run: current.id, input: input || null, saved: saved && saved.run === current.id ? saved : null,
    }));
    view.follow();
  } else if (!live) {
    forget(id);
  }
  setStatus(live ? "running" : c.status);
  if (c.status === "awaiting_approval" && c.approval) showApproval(c.approval);
  else if (!live) say($("chat-status"), "", c.status === "error" ? "Its last run failed: send again to retry." : "");
  stickToBottom();
  if (!quiet && focus) $("chat-input").focus();
}

async function getJSON(path) {
  const response = await request(path);
  if (!response.ok) throw await refusal(response);
  return response.json();
}

// ------------------------------------------------------------------ an approval, inline

async function showApproval(id) {
  if (chat.approval && chat.approval.id === id) return;
  const conversation = chat.id;
  let a;
  try {
    a = await getJSON(`/v1/approvals/${seg(id)}`);
  } catch (e) {
    say($("chat-status"), "bad", `The tool call waiting for a decision could not be read: ${problemText(e)}`);
    return;
  }
  if (chat.id !== conversation || a.status !== "pending" || (chat.approval && chat.approval.id === id)) return;
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
      setTimeout(() => { if (chat.id === a.conversation) openChat(a.conversation, { quiet: true }); }, 1500);
    }
  }
}

/** A decision taken (here, or in the panel): the run that resumes the conversation, followed. */
function resumed(a, answer, decision, note) {
  if (chat.id !== a.conversation) return;
  const shown = chat.approval && chat.approval.id === a.id ? chat.approval : null;
  if (shown) {
    const hadFocus = shown.item.contains(document.activeElement);
    shown.item.replaceWith(el("li", { class: "run", "data-testid": "chat-decided" },
      ending(decision === "approve" ? "ok" : "warn", decidedText(a, decision, note))));
    chat.approval = null;
    if (hadFocus) $("chat-input").focus();
  }
  const run = answer && answer.resumed_by;
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
  const input = $("chat-input");
  const text = input.value;
  const status = $("chat-status");
  if (!chat.id) return;
  if (!text.trim()) {
    say(status, "bad", "Write a message first.");
    return;
  }
  if (Date.now() < chat.busyUntil && $("chat-strategy").value === "reject") {
    return;  // the countdown is on the page: the node would say the same
  }
  const strategy = $("chat-strategy").value;
  const conversation = chat.id;
  const button = $("chat-send");
  button.disabled = true;
  let response;
  try {
    // Not `stream: true`: the answer names the run at once, and what a
    // rollback removed; the run's events are then read from its start.
    response = await request(`/v1/conversations/${seg(conversation)}/runs`, {
      method: "POST", headers: { "Idempotency-Key": idempotencyKey() },
      body: { input: text, multitask_strategy: strategy },
    });
  } catch (e) {
    button.disabled = false;
    say(status, "bad", `Not sent: ${problemText(e)}`);
    return;
  }
  button.disabled = false;
  if (chat.id !== conversation) return;
  if (response.status === 409) {
    const e = await refusal(response);
    if (e.code === "conversation_busy") return busy(e);
    if (e.code === "pending_approval") {
      say(status, "warn", `${chat.seat} waits for your decision on a tool call first: approve or deny it, then send.`);
      if (e.body && e.body.approval) await showApproval(e.body.approval);
      const card = chat.approval;
      if (card) card.card.approve.focus();
      return;
    }
    say(status, "bad", `Not sent: ${e.message}`);
    return;
  }
  if (!response.ok) {
    say(status, "bad", `Not sent: ${problemText(await refusal(response))}`);
    return;
  }
  input.value = "";
  clearBusy();
  const hello = log().querySelector(".chat-hello");
  if (hello) hello.remove();
  following = true;
  const accepted = await response.json();
  if (accepted.rolled_back) undone(accepted.rolled_back);
  const view = addView(new RunView(conversation, chat.seat, { run: accepted.run.id, input: text }));
  if (accepted.queued) {
    view.node.append(ending("info", `Waiting in line: ${chat.seat} answers this when it has finished.`));
    view.node.dataset.state = "queued";
  }
  setStatus("running");
  view.follow();
}

/** A rollback removed a run's messages: its item goes, a word says what stays done. */
function undone(rolled) {
  const gone = log().querySelector(`li.run[data-run="${CSS.escape(rolled.run)}"]`);
  const view = chat.views.get(rolled.run);
  if (view) {
    view.close();
    chat.views.delete(view.run);
  }
  const tools = (rolled.tool_calls || []).map((c) => c.name).filter(Boolean);
  const note = el("li", { class: "run", "data-testid": "chat-undone" }, ending("info",
    `Undid ${chat.seat}'s last answer (${plural(rolled.messages || 0, "message", "messages")} removed).` +
    (tools.length ? ` The tools it ran stay done: ${tools.join(", ")}.` : "")));
  if (gone) gone.replaceWith(note);
  else log().append(note);
}

/** reject's 409: said as what it is — busy, and when to try again. */
function busy(e) {
  const after = Number((e.body && e.body.retry_after) || 1);
  chat.busyUntil = Date.now() + Math.max(1, after) * 1000;
  showBusy();
  clearInterval(chat.busyTimer);
  chat.busyTimer = setInterval(showBusy, 1000);
}

function showBusy() {
  const left = Math.ceil((chat.busyUntil - Date.now()) / 1000);
  const status = $("chat-status");
  status.dataset.busy = "true";
  if (left > 0) {
    say(status, "info", `${chat.seat} is busy answering, so this was not sent: retry in ${left} s, ` +
      "or choose to wait in line or stop it.");
  } else {
    clearBusy();
    say(status, "info", "You can send it now.");
  }
}

function clearBusy() {
  clearInterval(chat.busyTimer);
  chat.busyTimer = null;
  chat.busyUntil = 0;
  delete $("chat-status").dataset.busy;
}

/** Stop the answer being written (those waiting in line wait on: they start
 *  next); with none being written, the ones waiting. */
async function stop() {
  const live = liveViews();
  const writing = live.filter((v) => v.node.dataset.state !== "queued");
  const views = writing.length ? writing : live;
  if (!views.length) return;
  say($("chat-status"), "info", "Stopping…");
  for (const view of views) {
    try {
      await getJSONPost(`/v1/conversations/${seg(view.conversation)}/runs/${seg(view.run)}/cancel`);
    } catch (e) {
      say($("chat-status"), "bad", `Could not stop it: ${problemText(e)}`);
      return;
    }
  }
}

async function getJSONPost(path) {
  const response = await request(path, { method: "POST" });
  if (!response.ok) throw await refusal(response);
  return response.json();
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
  if (view.conversation !== chat.id) return;
  if (status === "running") {
    if (view.node.dataset.state === "queued") {
      view.node.dataset.state = "live";
      const waiting = view.node.querySelector(".run-end[data-kind=info]");
      if (waiting) waiting.remove();
    }
    setStatus("running");
    return;
  }
  view.save();
  if (liveViews().length) return setStatus("running");
  setStatus(status);
  const end = view.model.end;
  if (status === "awaiting_approval" && end.awaiting) showApproval(end.awaiting);
  else if (end.type === "run.interrupted") say($("chat-status"), "warn", `${chat.seat} stopped.`);
  else if (end.type === "run.failed") say($("chat-status"), "bad", `${chat.seat}'s answer failed.`);
  else if (!$("chat-status").dataset.busy) say($("chat-status"), "ok", `${chat.seat} answered.`);
});
on("chat-lost", (view, why) => {
  if (view.conversation !== chat.id) return;
  // The events are gone (kept an hour) or the run is: read what the estate kept.
  view.close();
  chat.views.delete(view.run);
  forget(view.conversation);
  say($("chat-status"), "info", `Read from the record: ${why}`);
  openChat(view.conversation, { quiet: true });
});
on("approval-decided", ({ approval, answer, note }) => {
  // Decided in the Approvals panel (or here): the conversation shown goes on.
  if (approval.conversation === chat.id) resumed(approval, answer, answer.decision || "approve", note);
});
export function chatShown() {
  return chat.id;
}
