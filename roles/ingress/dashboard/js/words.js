/* What the node's names mean, in words a person reads. */

import { pill } from "./dom.js";

// A conversation run's turn: its trigger is "run=<run id>.<n>".
export const RUN_TRIGGER = "run=";

export const CONV_KINDS = {
  idle: ["unknown", "Idle", "no run now: it waits for the next message"],
  running: ["ok", "Answering", "a run is working on it now"],
  awaiting_approval: ["warn", "Awaiting approval", "a tool call waits for a person's decision"],
  error: ["bad", "Error", "its last run failed"],
};

export const ROLE_WORDS = {
  data: "keeps a copy of the estate (tasks, pages, turns)",
  ingress: "serves the API and this dashboard",
  seats: "runs seats: the agents' turns",
  workers: "runs fleet-wide duties",
};
export const CHILD_WORDS = {
  broker: "the message broker (NATS) the fleet talks through",
  fleet: "fleet membership: presence and leases",
  data_applier: "keeps this node's estate copy up to date",
  ingress: "serves the API and this dashboard",
  seats: "runs the seats' turns",
  workers: "runs fleet-wide duties",
};
export const DUTY_WORDS = {
  fleet_shape: "checks that the fleet, as assembled, can do every job",
  mailbox_retirement: "removes mailboxes of seats the company dropped and trims worked mail",
  reconcile: "asks GitHub to send again the webhook deliveries no node took",
};
export const CHILD_STATES = {
  running: ["ok", "Running", "running normally"],
  starting: ["warn", "Starting", "being started"],
  backoff: ["warn", "Restarting soon", "exited; waiting a moment before it is started again"],
  stopping: ["warn", "Stopping", "being stopped"],
  exited: ["bad", "Exited", "exited; its supervisor decides what next"],
  stopped: ["bad", "Stopped", "not running"],
  fatal: ["bad", "Failed, gave up", "will not be started again: it kept failing or its configuration is wrong"],
};
const OUTCOMES = {
  running: ["ok", "Working…", "the seat is working on this message now"],
  done: ["ok", "Done", "the seat answered"],
  failed: ["bad", "Failed", "the turn failed"],
  deferred: ["warn", "Waiting", "the seat is not taking mail for now"],
  skipped: ["unknown", "Already done", "this message had been worked before: nothing done again"],
  fenced: ["warn", "Handed over", "the seat moved to another node mid-turn; that node works the message"],
  interrupted: ["warn", "Interrupted", "the seat was released mid-turn; the message goes back to its mailbox"],
  unsettled: ["warn", "Not recorded", "worked, but its record could not be written; it will be tried again"],
};

export function humanize(name) {
  const words = String(name).replace(/[_-]+/g, " ").trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** Who sent a message, in words: a seat, the API under a token's name, crewletctl. */
export function senderWords(sender) {
  if (!sender) return null;
  if (sender.startsWith("api:")) return `from the API (${sender.slice(4)})`;
  return `from ${sender}`;
}

export function outcomeInfo(outcome) {
  return OUTCOMES[outcome] || ["unknown", humanize(outcome || "unknown"), null];
}

export function convPill(status) {
  const [kind, label, why] = CONV_KINDS[status] || ["unknown", humanize(status || "unknown"), null];
  return pill(kind, label, why);
}

export function excerpt(text, max) {
  text = String(text || "").replace(/\s+/g, " ").trim();
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

export function sizeText(n) {
  if (typeof n !== "number") return "?";
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}
