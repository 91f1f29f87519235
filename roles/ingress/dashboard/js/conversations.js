/* The Conversations tab: the list (by status, newest first, its statuses
 * kept live from the chat and read again every few seconds while shown), a
 * new conversation with any seat, and the chat (chat.js) of the one chosen.
 * The chosen one is in the address (#conversation=<id>): a reload, or a link
 * sent to a colleague, opens it again. */

import { api, currentToken, problemText, seg } from "./api.js";
import { on } from "./bus.js";
import { $, el, reconcile, say, setText } from "./dom.js";
import { chatShown, listed, openChat, refreshChat } from "./chat.js";
import { currentTab, registerTab, selectTab, softRefresh } from "./tabs.js";
import { when } from "./time.js";
import { CONV_KINDS, RUN_TRIGGER, convPill } from "./words.js";

const PAGE = 50;
const LIST_EVERY = 5000;         // ms between reads of the list while it is shown
const HASH_KEY = "conversation=";

const convs = {
  rows: [], next: null,
  request: 0,          // bumped per read: an older read's answer is dropped
  loaded: false,       // read once
  cache: new Map(),    // reconcile's: a row rebuilt only when it changed (focus kept)
  starting: false,     // a "new conversation" in flight: one at a time
};

async function loadConversations(fresh) {
  convs.loaded = true;
  const request = ++convs.request;
  const status = $("conv-status").value;
  let path = `/v1/conversations?limit=${PAGE}` + (status ? `&status=${seg(status)}` : "");
  if (!fresh && convs.next) path += `&cursor=${seg(convs.next)}`;
  const note = $("convs-status");
  if (fresh && !convs.rows.length) setText(note, "Loading conversations…");
  try {
    const page = await api(path);
    if (request !== convs.request) return;
    convs.rows = fresh ? page.items : convs.rows.concat(page.items);
    convs.next = page.next;
    say(note, "", convs.rows.length ? "" : (status
      ? `No conversation is ${(CONV_KINDS[status] || [0, status])[1].toLowerCase()}.`
      : "No conversations yet: start one above."));
    renderConversations();
    for (const row of page.items) listed(row);
  } catch (e) {
    if (request !== convs.request) return;
    say(note, "bad", "The conversations could not be read: " + problemText(e));
  }
}

function renderConversations() {
  const chosen = chatShown();
  reconcile($("convs-list"), convs.cache, convs.rows, (c) => c.id,
    (c) => JSON.stringify([c.status, Boolean(c.run), c.updated_at, chosen === c.id]),
    (c) => el("li", {},
      el("button", {
        type: "button", class: "item" + (chosen === c.id ? " chosen" : ""), "data-testid": `conv-row-${c.id}`,
        "data-status": c.status, "aria-current": chosen === c.id ? "true" : null,
        onclick: () => choose(c.id),
      },
      el("span", { class: "item-title" }, `with ${c.seat}`),
      el("span", { "data-testid": "conv-row-status" }, convPill(c.status)),
      el("span", { class: "item-meta muted small" }, c.id, c.run ? "" : " · no run yet", " · ",
        when(c.updated_at || c.created_at)))));
  $("convs-more").hidden = !convs.next;
}

/** Open conversation *id* in the chat, and say so in the address. */
function choose(id, focus = true) {
  const parts = location.hash.replace(/^#/, "").split("&").filter((p) => p && !p.startsWith(HASH_KEY));
  parts.push(HASH_KEY + encodeURIComponent(id));
  history.replaceState(history.state, "", location.pathname + location.search + "#" + parts.join("&"));
  openChat(id, { focus });
  renderConversations();
}

function fromAddress() {
  const part = location.hash.replace(/^#/, "").split("&").find((p) => p.startsWith(HASH_KEY));
  if (!part) return null;
  try {
    return decodeURIComponent(part.slice(HASH_KEY.length)) || null;
  } catch (e) {
    return null;
  }
}

/** A new conversation with *seat*, opened, the focus in its message box;
 *  *result* says how it went. */
async function startConversation(seat, result) {
  if (!seat || convs.starting) return;
  convs.starting = true;
  say(result, "", `Starting a conversation with ${seat}…`);
  try {
    const c = await api("/v1/conversations", { method: "POST", body: { seat } });
    say(result, "", "");
    selectTab("convs", false);
    convs.rows = [c, ...convs.rows.filter((r) => r.id !== c.id)];
    choose(c.id);
    $("panel-convs").scrollIntoView({ behavior: "smooth", block: "start" });
    loadConversations(true);
  } catch (e) {
    say(result, "bad", `Could not start a conversation with ${seat}: ${problemText(e)}`);
  } finally {
    convs.starting = false;
  }
}

/** The Conversations tab, showing conversation *id*. */
function show(id) {
  selectTab("convs", false);
  choose(id);
  $("tab-convs").scrollIntoView({ behavior: "smooth", block: "start" });
}

export function wireConversations() {
  $("conv-status").addEventListener("change", () => loadConversations(true));
  $("convs-refresh").addEventListener("click", () => {
    loadConversations(true);
    refreshChat();
  });
  $("convs-more").addEventListener("click", () => loadConversations(false));
  $("conv-new").addEventListener("submit", (event) => {
    event.preventDefault();
    startConversation($("conv-new-seat").value, $("conv-new-result"));
  });
  $("talk-form").addEventListener("submit", (event) => {
    event.preventDefault();
    startConversation($("talk-seat").value, $("talk-result"));
  });
  setInterval(() => {
    if (currentToken() && !$("main").hidden && currentTab() === "convs" && document.visibilityState === "visible") {
      loadConversations(true);
    }
  }, LIST_EVERY);
}

registerTab("convs", {
  shown: (fresh) => {
    if (fresh || !convs.loaded) loadConversations(true);
    const id = fromAddress();
    if (id && chatShown() !== id) openChat(id, { focus: false });
  },
  refresh: () => loadConversations(true),
  loaded: () => convs.loaded,
});

on("signed-in", () => {
  // A conversation in the address (a reload, a link): its tab is the one shown.
  if (fromAddress() && currentTab() !== "convs") selectTab("convs", false);
});
on("signed-out", () => {
  convs.rows = [];
  convs.next = null;
  convs.loaded = false;
  renderConversations();
});
on("turn", (d) => {
  if (String(d.trigger || "").startsWith(RUN_TRIGGER)) softRefresh("convs");
});
on("conversation", ({ id, status, ran }) => {
  // The chat knows first: the row says it at once.
  const row = convs.rows.find((c) => c.id === id);
  if (row && (row.status !== status || (ran && !row.run))) {
    row.status = status;
    if (ran && !row.run) row.run = true;  // "no run yet" no more; its id comes with the next read
    renderConversations();
  }
});
on("open-conversation", show);
on("talk", (seat) => startConversation(seat, $("talk-result")));
