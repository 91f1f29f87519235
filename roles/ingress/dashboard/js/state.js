/* The live state of the node and its fleet, as GET /v1/events tells it: a
 * `snapshot` replaces everything, every other event is a change to apply
 * (apply). Each change marks the parts of the page it touched (render.js). */

import { emit } from "./bus.js";
import { schedule } from "./render.js";
import { setServerTime } from "./time.js";

const FEED_MAX = 100;            // turns kept in the live feed

export const S = {
  node: null,                 // the node answering
  company: null,              // {name, rev, epoch, digest, seats}
  nodes: new Map(),           // id -> node row
  duties: new Map(),          // name -> {name, node}
  seats: new Map(),           // seat -> {seat, owner, token, pending, in_flight, dead_letters, last_turn}
  turns: [],                  // newest first, FEED_MAX at most
  turnIndex: new Map(),       // turnKey -> record: the same records as turns
  live: false,                // the events stream is open
};

export function turnKey(t) {
  return `${t.seat}\u0000${t.trigger}\u0000${t.started_at}`;
}

function keepTurn(record) {
  if (!record || typeof record.seat !== "string") return;
  const key = turnKey(record);
  if (S.turnIndex.has(key)) {
    const i = S.turns.indexOf(S.turnIndex.get(key));
    if (i >= 0) S.turns[i] = record;
  } else {
    S.turns.unshift(record);
    S.turns.sort((a, b) => (b.started_at || 0) - (a.started_at || 0));
  }
  S.turnIndex.set(key, record);
  while (S.turns.length > FEED_MAX) S.turnIndex.delete(turnKey(S.turns.pop()));
  const seat = S.seats.get(record.seat);
  if (seat && record.outcome !== "running") {
    const last = seat.last_turn;
    if (!last || (record.started_at || 0) >= (last.started_at || 0)) seat.last_turn = record;
  }
}

const handlers = {
  snapshot(d) {
    if (typeof d.at === "number") setServerTime(d.at);
    S.node = d.node;
    S.company = d.company || null;
    S.nodes = new Map((d.nodes || []).map((n) => [n.id, n]));
    S.duties = new Map((d.duties || []).map((x) => [x.name, x]));
    S.seats = new Map((d.seats || []).map((s) => [s.seat, s]));
    S.turns = [];
    S.turnIndex = new Map();
    for (const t of (d.turns || []).slice().reverse()) keepTurn(t);
    schedule("all");
    emit("snapshot");
  },
  turn(d) {
    keepTurn(d);
    schedule("feed", "seats", "summary");
    emit("turn", d);
  },
  node(d) {
    const old = S.nodes.get(d.id) || {};
    if (d.state === "gone") {
      S.nodes.set(d.id, { ...old, id: d.id, state: "gone", gone_at: d.gone_at, children: null, copy: null });
    } else {
      S.nodes.set(d.id, { ...old, ...d });
    }
    schedule("fleet", "summary");
  },
  seat(d) {
    const row = S.seats.get(d.seat) || { seat: d.seat, pending: null, in_flight: null, dead_letters: 0, last_turn: null };
    row.owner = d.owner;
    row.token = d.token;
    S.seats.set(d.seat, row);
    schedule("seats", "summary", "fleet");
  },
  duty(d) {
    S.duties.set(d.name, { ...(S.duties.get(d.name) || {}), name: d.name, node: d.node });
    schedule("fleet");
  },
  copy(d) {
    const row = S.nodes.get(d.node);
    if (row) row.copy = d.copy;
    schedule("fleet", "summary");
  },
  mailboxes(d) {
    let deadChanged = false;
    for (const m of d.seats || []) {
      const row = S.seats.get(m.seat);
      if (!row) continue;
      if ((row.dead_letters || 0) !== (m.dead_letters || 0)) deadChanged = true;
      row.pending = m.pending;
      row.in_flight = m.in_flight;
      row.dead_letters = m.dead_letters;
    }
    schedule("seats", "summary");
    if (deadChanged) emit("dead-letters");
  },
  children(d) {
    const row = S.nodes.get(d.node);
    if (row) row.children = d.children;
    schedule("fleet", "summary");
  },
  company(d) {
    const before = S.company;
    S.company = d;
    schedule("header");
    // The first company, or another revision (other seats): start again from a snapshot.
    if (!before || before.rev !== d.rev) emit("resync");
  },
};

/** Apply one event of the live stream; an unknown type is ignored. */
export function apply(type, data) {
  const handler = handlers[type];
  if (!handler || !data || typeof data !== "object") return;
  try {
    handler(data);
  } catch (e) {
    console.error("crewlet dashboard: could not apply a", type, "event", e);
  }
}
