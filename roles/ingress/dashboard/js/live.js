/* The live state's stream, GET /v1/events: read with fetch, reconnecting
 * after a drop with Last-Event-ID, backing off; a stream silent for longer
 * than its keepalives would be is taken for dead. The indicator in the header
 * says where it stands. */

import { currentToken, request } from "./api.js";
import { emit, on } from "./bus.js";
import { $, setText } from "./dom.js";
import { readEvents } from "./sse.js";
import { S, apply } from "./state.js";

const BACKOFF_MAX = 30000;       // ms between reconnects, at most
const SILENT_MAX = 45000;        // ms without a byte (keepalives come every 15 s): reconnect

const conn = {
  controller: null,   // the open stream's, aborted to end it
  lastId: null,       // the last event's id: a reconnect resumes after it
  attempt: 0,         // reconnects since the last success
  retry: 1000,        // ms: the node's `retry:`, the backoff's base
  timer: null, watchdog: null,
  generation: 0,      // bumped by every stop: a stream of an older generation applies nothing
  reconnectAt: null, why: "",
};

/** The indicator: its state in words (a live region), and a detail that is
 *  not announced (the reconnect countdown changes every second). */
export function setConnection(state, text, detail) {
  $("conn").dataset.state = state;
  setText($("conn-text"), text);
  setText($("conn-detail"), detail || "");
  $("retry-now").hidden = state !== "reconnecting";
}

export function stopStream() {
  conn.generation += 1;
  clearTimeout(conn.timer);
  clearTimeout(conn.watchdog);
  conn.reconnectAt = null;
  if (conn.controller) conn.controller.abort();
  conn.controller = null;
}

/** Start again from a snapshot. */
export function resync() {
  conn.lastId = null;
  connect();
}

/** Open the stream from the start (a fresh sign-in). */
export function restart() {
  S.live = false;
  conn.attempt = 0;
  conn.lastId = null;
  connect();
}

export async function connect() {
  stopStream();
  const generation = conn.generation;
  const controller = new AbortController();
  conn.controller = controller;
  const first = conn.attempt === 0 && !S.live;
  setConnection(first ? "connecting" : "reconnecting", first ? "Connecting…" : "Reconnecting…");
  const headers = { Accept: "text/event-stream" };
  if (conn.lastId) headers["Last-Event-ID"] = conn.lastId;
  let response;
  try {
    response = await request("/v1/events", { headers, signal: controller.signal });
  } catch (e) {
    if (generation === conn.generation) retryLater("the node did not answer");
    return;
  }
  if (generation !== conn.generation) return;
  if (response.status === 401) return emit("signed-out", "refused");  // this stream's token: the current one
  if (response.status === 403) {
    return emit("signed-out", "forbidden");
  }
  if (!response.ok || !response.body) {
    retryLater(`the node answered ${response.status}`);
    return;
  }
  S.live = true;
  conn.attempt = 0;
  setConnection("live", "Live");
  watch(controller);
  try {
    await readEvents(response, (type, data, id) => {
      if (generation !== conn.generation) return;  // not after a resync began
      if (type !== null) apply(type, data);
      if (id !== null) conn.lastId = id;
    }, {
      onBytes: () => watch(controller),
      onRetry: (ms) => { conn.retry = Math.max(250, ms); },
    });
  } catch (e) {
    /* dropped, or aborted by us */
  }
  if (generation === conn.generation) retryLater("the connection dropped");
}

/** No byte for SILENT_MAX ms (keepalives come every 15 s): the connection is dead. */
function watch(controller) {
  clearTimeout(conn.watchdog);
  conn.watchdog = setTimeout(() => controller.abort(), SILENT_MAX);
}

function retryLater(why) {
  clearTimeout(conn.watchdog);
  const delay = Math.min(BACKOFF_MAX, conn.retry * 2 ** conn.attempt) * (0.8 + Math.random() * 0.4);
  conn.attempt += 1;
  conn.reconnectAt = Date.now() + delay;
  conn.why = why;
  showReconnecting();
  clearTimeout(conn.timer);
  conn.timer = setTimeout(connect, delay);
}

/** The countdown to the next try (the ticker calls it every second). */
export function showReconnecting() {
  if (conn.reconnectAt === null) return;
  const left = Math.max(0, Math.ceil((conn.reconnectAt - Date.now()) / 1000));
  setConnection("reconnecting", "Reconnecting", `${conn.why}; next try in ${left} s`);
}

on("resync", () => {
  if (currentToken()) resync();
});
