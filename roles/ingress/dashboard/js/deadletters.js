/* The Dead letters tab: mail a seat could not work, even after retrying;
 * Requeue puts one back in its seat's mailbox. Not on the live stream: read
 * when shown, when a seat's dead-letter count changes, and every few seconds
 * while shown. */

import { api, currentToken, problemText, seg } from "./api.js";
import { on } from "./bus.js";
import { $, el, reconcile, say, setText } from "./dom.js";
import { S } from "./state.js";
import { currentTab, registerTab } from "./tabs.js";
import { when } from "./time.js";
import { excerpt, senderWords } from "./words.js";

const PAGE = 50;
const dlq = {
  rows: [],             // as last read, newest first
  next: null,           // the cursor of the next page
  loading: null,        // the read in flight
  again: false,         // asked again while one was in flight: read once more after it
  cache: new Map(),     // reconcile's
};

export function refreshDeadLetters() {
  if (!currentToken()) return;
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
  const path = `/v1/dlq?limit=${PAGE}` + (more && dlq.next ? `&cursor=${seg(dlq.next)}` : "");
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
    const answer = await api(`/v1/dlq/${seg(d.seq)}/requeue`, { method: "POST" });
    say(result, "ok", `Requeued: the message to ${d.seat} is back in its mailbox ` +
      `(as message #${answer.seq}) and will be tried again.`);
    dlq.rows = dlq.rows.filter((r) => r.seq !== d.seq);
    renderDeadLetters(null);
    // Worked again, it may fail again: look once its turn has had time.
    setTimeout(refreshDeadLetters, 3000);
  } catch (e) {
    say(result, "bad", e.status === 404
      ? `Dead letter #${d.seq} is no longer there: it was requeued already, or expired.`
      : `Could not requeue the message to ${d.seat}: ${problemText(e)}`);
    button.disabled = false;
    setText(button, "Requeue");
  }
  refreshDeadLetters();
}

export function wireDeadLetters() {
  $("dlq-refresh").addEventListener("click", refreshDeadLetters);
  $("dlq-more").addEventListener("click", () => loadDeadLetters(true));
  // Not on the live stream: looked at again now and then while shown.
  setInterval(() => {
    if (currentToken() && S.live && document.visibilityState === "visible" && currentTab() === "dlq") refreshDeadLetters();
  }, 10000);
}

registerTab("dlq", { shown: refreshDeadLetters, refresh: refreshDeadLetters, loaded: () => true });
on("snapshot", refreshDeadLetters);
on("dead-letters", refreshDeadLetters);
