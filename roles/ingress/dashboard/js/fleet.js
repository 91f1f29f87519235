/* The Fleet card: a card per node (its health, roles, estate copy, how its
 * seats' tools run, its processes) and the duties, each held by one node. */

import { api, currentToken } from "./api.js";
import { on } from "./bus.js";
import { $, el, factList, pill, reconcile } from "./dom.js";
import { register } from "./render.js";
import { S } from "./state.js";
import { absolute, when } from "./time.js";
import { CHILD_STATES, CHILD_WORDS, DUTY_WORDS, ROLE_WORDS, humanize, plural, sizeText } from "./words.js";

// This node's own upkeep — its disk, the log's growth, retention (GET /v1/admin/capacity
// and /retention) — read for an admin token only (others are answered 403: not shown),
// at sign-in and every UPKEEP_EVERY ms.
const UPKEEP_EVERY = 30000;
let upkeep = null;

async function readUpkeep() {
  if (!currentToken()) return;
  try {
    const [capacity, retention] = await Promise.all([api("/v1/admin/capacity"), api("/v1/admin/retention")]);
    upkeep = { capacity, retention };
  } catch (e) {
    upkeep = null;  // not an admin's token, or not answered: nothing to show
  }
  renderFleet();
}

function upkeepFacts(fact) {
  const { capacity: c, retention: r } = upkeep;
  const growth = c.growth.log_bytes_per_day;
  fact("Disk", el("span", { "data-testid": "node-capacity" },
    pill(c.disk.low ? "bad" : "ok", `${sizeText(c.disk.free)} free`, `of ${sizeText(c.disk.size)}`),
    el("span", { class: "muted small note" },
      ` · floor ${sizeText(c.disk.floor)} · estate copy ${sizeText(c.copy.bytes)} · log ${plural(c.log.messages, "entry", "entries")} ` +
      `(${c.log.first_seq}–${c.log.last_seq}), ${plural(c.snapshots.length, "snapshot", "snapshots")} · ` +
      (growth ? `grows ~${sizeText(Math.round(growth))} a day` +
        (c.growth.floor_reached_at ? `, the floor met ~${absolute(c.growth.floor_reached_at)}` : "")
        : "no growth measured yet"))));
  const k = r.retention, done = r.removed_in_all || {};
  fact("Retention", el("span", { "data-testid": "node-retention" },
    `turns ${k.turns_days} d · events ${k.events_days} d · mail ${k.mail_days} d`,
    el("span", { class: "muted small note" },
      r.last_sweep ? ` · removed so far: ${done.turns || 0} turns, ${done.mail || 0} mails, ${done.mailboxes || 0} mailboxes`
        : " · no sweep yet")));
}

setInterval(readUpkeep, UPKEEP_EVERY);
on("signed-in", readUpkeep);
on("snapshot", readUpkeep);

export function nodeHealth(n) {
  if (n.state === "gone") return ["bad", "Gone", "its presence lapsed: the node stopped or lost the fleet"];
  // Drained by the operator (crewletctl drain): out of service on purpose, said before anything else.
  if (n.drain === "drained") return ["warn", "Drained", "drained by the operator: it holds no work (crewletctl undrain puts it back)"];
  if (n.drain === "draining") return ["warn", "Draining", "drained by the operator: it is handing its work over"];
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
const dutyCache = new Map();

function nodeSig(n) {
  const copy = n.copy ? [n.copy.in_service, n.copy.lagging, n.copy.reason, n.copy.applied] : null;
  const kids = (n.children || []).map((k) => [k.name, k.state, k.pid, k.restarts, k.last_exit && k.last_exit.reason]);
  const box = n.sandbox ? [n.sandbox.state, n.sandbox.reason] : null;
  const mine = n.id === S.node && upkeep ? JSON.stringify(upkeep) : null;
  return JSON.stringify([n.state, n.drain, n.draining, n.gone_at, n.roles, copy, box, n.children ? kids : null, n.version, n.started_at,
    n.broker, n.labels, seatsHeldBy(n.id), dutiesOf(n.id), n.id === S.node, mine]);
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
  const state = n.state === "gone" ? "gone" : (n.drain || (kind === "warn" ? "degraded" : n.state));
  const card = el("article", { class: `node ${kind}`, "data-testid": `node-${n.id}`, "data-state": state, "aria-label": `node ${n.id}` });
  card.append(el("header", { class: "node-head" },
    el("h3", {}, n.id),
    n.id === S.node ? el("span", { class: "tag", title: "the node serving this page" }, "this node") : null,
    el("span", { class: "grow" }),
    el("span", { "data-testid": "node-state" }, pill(kind, label, why))));
  const { facts, fact } = factList();
  if (n.state === "gone") fact("Gone", when(n.gone_at));
  if (n.draining) {
    fact("Drained", el("span", { "data-testid": "node-drain" }, `by ${n.draining.by || "?"} `, when(n.draining.since),
      typeof n.draining.until === "number" ? el("span", { class: "muted small note" },
        ` · turns still running at ${new Date(n.draining.until * 1000).toLocaleTimeString()} are cut short`) : null));
  }
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
    fact("Seats held", String(seatsHeldBy(n.id)));
    const duties = dutiesOf(n.id);
    fact("Duties", duties.length ? duties.map(humanize).join(", ") : el("span", { class: "muted" }, "none"));
  }
  if (n.id === S.node && upkeep) upkeepFacts(fact);
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
      el("td", { class: "num" + (k.restarts ? " warn-text" : ""), title: exitText }, String(k.restarts || 0)),
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

function renderFleet() {
  const nodes = [...S.nodes.values()].sort((a, b) =>
    (a.state === "gone") - (b.state === "gone") || String(a.id).localeCompare(String(b.id)));
  reconcile($("nodes"), nodeCache, nodes, (n) => n.id, nodeSig, buildNode);
  const empty = $("nodes").querySelector(".empty");
  if (!nodes.length && !empty) $("nodes").append(el("p", { class: "muted empty" }, "No node has reported yet."));
  else if (nodes.length && empty) empty.remove();
  const duties = [...S.duties.values()].sort((a, b) => a.name.localeCompare(b.name));
  reconcile($("duties"), dutyCache, duties, (d) => d.name, (d) => JSON.stringify([d.node, S.nodes.get(d.node)?.state]),
    (d) => el("li", { "data-testid": `duty-${d.name}`, "data-node": d.node || "" },
      el("span", { class: "duty-name", title: DUTY_WORDS[d.name] || null }, humanize(d.name)),
      " ",
      d.node ? pill("ok", `held by ${d.node}`) : pill("warn", "held by nobody", "no node runs this duty right now"),
      DUTY_WORDS[d.name] ? el("span", { class: "muted small" }, ` — ${DUTY_WORDS[d.name]}`) : null));
}

register("fleet", renderFleet);
