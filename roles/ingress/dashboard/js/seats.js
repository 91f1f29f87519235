/* The Seats card (a row per seat: who holds it, its mail, its last turn),
 * one seat's dialog, and the seat choices of the mail form. */

import { api, problemText, seg } from "./api.js";
import { emit } from "./bus.js";
import { $, el, factList, pill, reconcile, setText } from "./dom.js";
import { buildTurn } from "./feed.js";
import { register, schedule } from "./render.js";
import { S } from "./state.js";
import { duration, when } from "./time.js";
import { outcomeInfo } from "./words.js";

export const PILE_UP = 5;        // waiting messages from which a seat's mail is "piling up"

export function seatStatus(s) {
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
  renderSeatChoices(all);
}

let choicesSig = "";

/** Every <select data-seats> on the page lists the company's seats (the ceo first chosen). */
function renderSeatChoices(all) {
  const names = all.map((s) => s.seat);
  const sig = names.join("\u0000");
  if (sig === choicesSig) return;
  choicesSig = sig;
  for (const select of document.querySelectorAll("select[data-seats]")) {
    const chosen = select.value;
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(chosen)) select.value = chosen;
    else if (names.includes("ceo")) select.value = "ceo";
  }
}

async function openSeat(name) {
  const dialog = $("seat-dialog");
  const body = $("seat-dialog-body");
  setText($("seat-dialog-title"), `Seat ${name}`);
  body.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  if (!dialog.open) dialog.showModal();
  try {
    const s = await api(`/v1/seats/${seg(name)}`);
    const [kind, label, why] = seatStatus(s);
    const { facts, fact } = factList();
    fact("Status", pill(kind, label, why));
    fact("Held by", s.owner || el("span", { class: "muted" }, "no node"));
    fact("Waiting", String(s.pending ?? "—"));
    fact("Working", String(s.in_flight ?? "—"));
    if (typeof s.redelivered === "number") fact("Delivered again", String(s.redelivered));
    fact("Dead letters", String(s.dead_letters ?? 0));
    const talk = el("button", { type: "button", class: "primary", "data-testid": "seat-talk" }, `Talk to ${name}`);
    talk.addEventListener("click", () => {
      dialog.close();
      emit("talk", name);
    });
    const mail = el("button", { type: "button", class: "ghost" }, `Send mail to ${name}`);
    mail.addEventListener("click", () => {
      dialog.close();
      $("mail-seat").value = name;
      $("mail-text").focus();
    });
    const turns = s.last_turns || [];
    body.replaceChildren(facts, el("h3", {}, "Last turns"),
      turns.length ? el("ol", { class: "feed compact" }, turns.map(buildTurn)) : el("p", { class: "muted" }, "None yet."),
      el("div", { class: "row-end" }, mail, talk));
  } catch (e) {
    body.replaceChildren(el("p", { class: "bad-text" }, `Seat ${name} could not be read: ${problemText(e)}`));
  }
}

export function wireSeats() {
  $("seat-filter").addEventListener("input", () => schedule("seats"));
  $("seat-rows").addEventListener("click", (event) => {
    const button = event.target.closest("button.seat-link");
    if (button) openSeat(button.dataset.seat);
  });
}

register("seats", renderSeats);
