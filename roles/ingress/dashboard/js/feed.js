/* The live feed: each turn a seat finished (or is working), newest first. */

import { $, el, pill, reconcile } from "./dom.js";
import { register } from "./render.js";
import { S, turnKey } from "./state.js";
import { duration, when } from "./time.js";
import { excerpt, outcomeInfo, senderWords } from "./words.js";

const EXCERPT = 220;             // characters of a reply shown in the feed
const feedCache = new Map();

export function buildTurn(t) {
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

register("feed", renderFeed);
