/* Approvals: a seat's tool call that needs a person (the company's
 * `approval:` on the seat) ends its run and waits, its conversation
 * `awaiting_approval`; the decision resumes the conversation as a new run
 * (`resumed_by` in the answer), on whichever node holds the seat.
 *
 * A drafted skill's promotion is an approval too (kind "promotion", of no
 * conversation nor run: its tool is skill.promote, its args name the draft,
 * its cluster, its description and how many episodes it came from). Its card
 * says so in words; deciding it is the same POST /v1/approvals/{id}, and the
 * Skills tab (skills.js) hears of it ("approval-decided", "promotions").
 *
 * The panel lists every pending one (read every APPROVALS_EVERY ms, and soon
 * after a conversation run's turn shows in the feed: they are not on the live
 * stream); the chat shows its conversation's inline. Both build the card with
 * approvalCard() and send the decision with decide(); either tells the other
 * ("approval-decided"). */

import { api, currentToken, problemText, seg } from "./api.js";
import { emit, on } from "./bus.js";
import { $, el, factList, reconcile, say, setText } from "./dom.js";
import { setWaiting } from "./summary.js";
import { ago, expiry, when } from "./time.js";
import { RUN_TRIGGER, excerpt, plural } from "./words.js";

const APPROVALS_PAGE = 100;      // pending approvals read at once (oldest first)
const APPROVALS_EVERY = 5000;    // ms between reads of the pending approvals
const NOTE_MAX = 2000;           // characters of a decision's note (the API's limit)

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

// ------------------------------------------------------------------ shared: the card and the decision

/** An approval's card: who wants to call what, its exact arguments, a note
 *  and the two buttons. *place* makes its ids unique on the page; *extra*
 *  are facts to show. Its test id is `<place>-<approval id>`. Returns the card's parts; the caller wires the buttons. */
export function approvalCard(a, place, extra) {
  const id = `${place}-${a.id}`;
  const titleId = `${id}-title`;
  const noteId = `${id}-note`;
  const argsId = `${id}-args`;
  const promotion = isPromotion(a);
  const what = promotion ? `the promotion of drafted skill ${promotedName(a)}` : `${a.seat}'s call to ${a.tool}`;
  const approve = el("button", {
    type: "button", class: "primary", "data-testid": "approve", "aria-label": `Approve ${what}`,
  }, "Approve");
  const deny = el("button", {
    type: "button", class: "danger", "data-testid": "deny", "aria-label": `Deny ${what}`,
  }, "Deny");
  const note = el("input", {
    id: noteId, type: "text", maxlength: NOTE_MAX, autocomplete: "off", spellcheck: "true",
    "data-testid": "approval-note", placeholder: promotion ? "why, for the record" : "why not, if you deny it",
  });
  const message = el("p", { class: "result", role: "status", "aria-live": "polite", "data-testid": "approval-message" });
  const actions = el("div", { class: "approval-actions" },
    el("label", { for: noteId }, "Note ", el("span", { class: "muted small" },
      promotion ? "(optional; kept with the decision)" : "(optional; a denial's note is told to the seat)")),
    el("div", { class: "approval-buttons" }, note, approve, deny));
  const { facts, fact } = factList();
  if (extra) extra(fact);
  fact("Asked", when(a.requested_at));
  const expires = expiry(a.expires_at);
  const item = el("li", {
    class: "approval", "data-testid": id, "data-approval": a.id, "data-seat": a.seat,
    "data-tool": a.tool, "data-approval-kind": promotion ? "promotion" : "tool", "data-state": "pending",
    "aria-labelledby": titleId,
  },
  el("div", { class: "approval-head" },
    el("h3", { id: titleId, "data-testid": "approval-title" }, promotion ? promotionTitle(a) : [
      el("span", { "data-testid": "approval-seat" }, a.seat), " wants to call ",
      el("code", { class: "tool", "data-testid": "approval-tool" }, a.tool)]),
    el("span", { class: "grow" }),
    expires),
  facts,
  // A promotion's args are shown as facts (by the caller's *extra*): they are no call's arguments.
  promotion ? null : [
    el("p", { class: "args-label", id: argsId }, "Its arguments, exactly as the call would run:"),
    el("pre", { class: "args", "data-testid": "approval-args", tabindex: "0", "aria-labelledby": argsId },
      a.args === undefined ? "(no arguments)" : JSON.stringify(a.args, null, 2))],
  actions,
  message);
  return { item, approve, deny, note, message, actions, expires, busy: false };
}

/** A drafted skill's promotion (kind "promotion"), not a seat's tool call. */
export function isPromotion(a) {
  return Boolean(a) && a.kind === "promotion";
}

function promotionArgs(a) {
  return a.args && typeof a.args === "object" ? a.args : {};
}

/** The skill a promotion would write (its draft's name). */
export function promotedName(a) {
  const args = promotionArgs(a);
  return String(args.skill || args.draft || "?");
}

/** "Promote drafted skill NAME (from N episodes of seat SEAT)", as nodes. */
function promotionTitle(a) {
  const n = promotionArgs(a).episodes;
  return ["Promote drafted skill ", el("code", { class: "tool", "data-testid": "approval-skill" }, promotedName(a)),
    " (from ", typeof n === "number" ? plural(n, "episode", "episodes") : "episodes", " of seat ",
    el("span", { "data-testid": "approval-seat" }, a.seat || "?"), ")"];
}

/** Send *decision* on approval *a* (its note from the card *p*), the card
 *  saying so meanwhile: the answer, or the ApiError with the card usable again
 *  (a 409 or 404: it was decided elsewhere, or is gone — the caller settles it). */
export async function decide(a, p, decision) {
  const text = p.note.value.trim();
  const approving = decision === "approve";
  p.busy = true;
  p.approve.disabled = true;
  p.deny.disabled = true;
  p.note.readOnly = true;
  setText(approving ? p.approve : p.deny, approving ? "Approving…" : "Denying…");
  p.item.setAttribute("aria-busy", "true");
  say(p.message, "", approving ? "Sending the approval…" : "Sending the denial…");
  try {
    const answer = await api(`/v1/approvals/${seg(a.id)}`, {
      method: "POST", body: text ? { decision, note: text } : { decision },
    });
    emit("approval-decided", { approval: a, answer, note: text });
    return answer;
  } catch (e) {
    p.item.removeAttribute("aria-busy");
    if (e.status !== 409 && e.status !== 404) {
      p.busy = false;
      p.approve.disabled = false;
      p.deny.disabled = false;
      p.note.readOnly = false;
      setText(p.approve, "Approve");
      setText(p.deny, "Deny");
      say(p.message, "bad", `Not decided: ${problemText(e)}` + (e.status === 0
        ? " It may or may not have reached the node: sending the same decision again is safe." : ""));
    }
    throw e;
  }
}

/** What a decision's answer means, in words. */
export function decidedText(a, decision, note) {
  if (isPromotion(a)) {
    const name = promotedName(a);
    return decision === "approve"
      ? `Promoted: drafted skill ${name} is now a skill; the seats it applies to see it from their next turn.`
      : `Rejected: drafted skill ${name} stays a draft, rejected; no skill was written.`;
  }
  return decision === "approve"
    ? `Approved: ${a.seat}'s call to ${a.tool} runs now, exactly as it was shown, and conversation ${a.conversation} goes on.`
    : `Denied: ${a.seat}'s call to ${a.tool} will not run. The seat is told` +
      (note ? ` (with your note “${excerpt(note, 120)}”)` : "") + `, and conversation ${a.conversation} goes on.`;
}

/** Why a decision was refused: someone else decided, it expired, or it is gone. */
export function settledText(e) {
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

// ------------------------------------------------------------------ the panel

export function refreshApprovals() {
  if (!currentToken()) return;
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
export function approvalsSoon() {
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
    say(note, "", "");
    // The drafted skills waiting: the Skills tab counts them, and reads its drafts again when they change.
    emit("promotions", approvals.rows.filter(isPromotion));
  } catch (e) {
    if (e.status === 401) return;
    say(note, "bad", (approvals.read ? "The approvals could not be read again just now; this is the list as last read. "
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
  const n = pendingShown().length;
  if (approvals.read) setWaiting(n, approvals.next);
  const badge = $("approvals-count");
  setText(badge, n ? `${n}${approvals.next ? "+" : ""}` : "");
  badge.hidden = !n;
  $("approvals").dataset.kind = n ? "warn" : "";
}

function buildApproval(a) {
  const p = approvalCard(a, "approval", isPromotion(a) ? (fact) => {
    const args = a.args || {};
    fact("Draft", el("button", {
      type: "button", class: "link", "data-testid": "approval-draft", title: "Read the draft in the Skills tab",
      onclick: () => emit("open-draft", String(args.draft || promotedName(a))),
    }, String(args.draft || promotedName(a))));
    if (args.description) fact("Description", el("span", { "data-testid": "approval-description" }, String(args.description)));
    if (args.cluster) fact("Cluster", String(args.cluster));
  } : (fact) => fact("Conversation", el("button", {
    type: "button", class: "link", "data-testid": "approval-conversation", title: "Talk in this conversation",
    onclick: () => emit("open-conversation", a.conversation),
  }, a.conversation), el("span", { class: "muted small" }, ` · run ${a.run}`)));
  p.approve.addEventListener("click", () => decideHere(a, "approve"));
  p.deny.addEventListener("click", () => decideHere(a, "deny"));
  approvals.parts.set(String(a.id), p);
  return p.item;
}

async function decideHere(a, decision) {
  const p = approvals.parts.get(a.id);
  if (!p || p.busy) return;
  approvals.deciding.set(a.id, a);
  const note = p.note.value.trim();
  try {
    await decide(a, p, decision);
    approvals.done.add(a.id);
    approvals.deciding.delete(a.id);
    say($("approvals-result"), "ok", decidedText(a, decision, note));
    leave(p, () => renderApprovals());
  } catch (e) {
    approvals.deciding.delete(a.id);
    if (e.status === 409 || e.status === 404) settle(a, p, e);
    else renderApprovals();  // decided elsewhere meanwhile, a read may have left it out
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
  say(p.message, "bad", settledText(e));
  const dismiss = el("button", {
    type: "button", class: "ghost", "data-testid": "dismiss", "aria-label": isPromotion(a) ? `Dismiss the promotion of drafted skill ${promotedName(a)}`
      : `Dismiss the approval of ${a.seat}'s call to ${a.tool}`,
  }, "Dismiss");
  dismiss.addEventListener("click", () => leave(p, () => {
    approvals.kept.delete(a.id);
    renderApprovals();
  }));
  p.actions.replaceChildren(el("div", { class: "approval-buttons" }, dismiss));
  renderApprovals();
  dismiss.focus();
}

export function wireApprovals() {
  $("approvals-refresh").addEventListener("click", refreshApprovals);
  // Approvals are not on the live stream, and someone waits on them: read them
  // often, and on coming back to the page.
  const due = () => currentToken() && !$("main").hidden && document.visibilityState === "visible";
  setInterval(() => {
    if (due()) refreshApprovals();
  }, APPROVALS_EVERY);
  document.addEventListener("visibilitychange", () => {
    if (due()) refreshApprovals();
  });
}

on("snapshot", refreshApprovals);
on("signed-in", refreshApprovals);
on("turn", (d) => {
  // A conversation run's turn: it may have asked for an approval, or resumed after one.
  if (String(d.trigger || "").startsWith(RUN_TRIGGER)) approvalsSoon();
});
on("approval-decided", ({ approval }) => {
  // Decided in a chat: the panel drops it at once.
  if (approvals.deciding.has(approval.id)) return;
  approvals.done.add(approval.id);
  renderApprovals();
});
on("approval-requested", approvalsSoon);
