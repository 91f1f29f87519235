/* The header (the company, the node answering) and the "At a glance" tiles. */

import { $, setText } from "./dom.js";
import { nodeHealth } from "./fleet.js";
import { register } from "./render.js";
import { PILE_UP } from "./seats.js";
import { S } from "./state.js";

let waiting = null;  // approvals waiting, as last read (null: not read yet)

export function tile(id, kind, value, note) {
  $(`tile-${id}`).dataset.kind = kind;
  setText($(`sum-${id}`), value);
  setText($(`sum-${id}-note`), note);
}

/** The approvals panel read *n* waiting (more: past its page). */
export function setWaiting(n, more) {
  waiting = n;
  tile("approvals", n ? "warn" : "ok", `${n}${more ? "+" : ""}`,
    n ? (n === 1 ? "waits for your decision" : "wait for your decision") : "none waiting");
  document.title = pageTitle();
}

/** The company, and how many approvals wait (seen from another browser tab). */
function pageTitle() {
  const c = S.company;
  const base = c ? `${c.name} · crewlet` : "crewlet dashboard";
  return waiting ? `(${waiting}) ${base}` : base;
}

function renderHeader() {
  const c = S.company;
  setText($("company-name"), c ? c.name : "No company applied yet");
  setText($("company-rev"), c ? `revision ${c.rev}` : "");
  $("company-rev").title = c ? `revision ${c.rev}, epoch ${c.epoch}, digest ${c.digest}` : "";
  setText($("via"), S.node ? `answered by node ${S.node}` : "");
  document.title = pageTitle();
}

export function renderSummary() {
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
  if (waiting === null) tile("approvals", "unknown", "—", "");
}

register("header", renderHeader);
register("summary", renderSummary, ["fleet", "seats"]);
