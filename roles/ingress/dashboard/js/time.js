/* Times as a person reads them, on the node's clock: relative ones are kept
 * fresh by tick() (main.js runs it every second). */

import { el, setText } from "./dom.js";

const EXPIRY_SOON = 300;  // seconds left from which an approval's expiry shows amber

let skew = 0;  // server clock minus ours, in seconds (from the snapshot)

/** The node said its time is *at* (seconds): ours is read on its clock from now on. */
export function setServerTime(at) {
  skew = at - Date.now() / 1000;
}

export function now() {
  return Date.now() / 1000 + skew;
}

export function span(seconds) {
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  const days = Math.floor(seconds / 86400);
  return days === 1 ? "1 day" : `${days} days`;
}

export function ago(ts) {
  if (typeof ts !== "number" || !isFinite(ts)) return "—";
  const d = now() - ts;
  if (d < -5) return "in " + span(-d);
  if (d < 5) return "just now";
  return span(d) + " ago";
}

export function absolute(ts) {
  return new Date((ts - skew) * 1000).toLocaleString();
}

function iso(ts) {
  return new Date((ts - skew) * 1000).toISOString();
}

/** A relative time kept fresh by the ticker; the absolute one on hover. */
export function when(ts, prefix) {
  if (typeof ts !== "number" || !isFinite(ts)) return el("span", { class: "muted" }, "—");
  return el("time", { "data-ts": ts, "data-prefix": prefix || "", datetime: iso(ts), title: absolute(ts) },
    (prefix || "") + ago(ts));
}

export function duration(ms) {
  if (typeof ms !== "number" || !isFinite(ms)) return "—";
  if (ms < 1) return "under 1 ms";
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

/** When a pending approval expires, kept fresh by the ticker. */
export function expiry(ts) {
  if (typeof ts !== "number" || !isFinite(ts)) return el("span", { class: "muted" }, "no expiry");
  const node = el("time", {
    class: "expiry", "data-ts": ts, "data-expires": "", datetime: iso(ts),
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

/** Every relative time on the page, said again. */
export function tick() {
  for (const t of document.querySelectorAll("time[data-ts]")) {
    if ("expires" in t.dataset) showExpiry(t, Number(t.dataset.ts));
    else setText(t, (t.dataset.prefix || "") + ago(Number(t.dataset.ts)));
  }
}
