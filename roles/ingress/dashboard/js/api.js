/* The node's API, with the token the person signed in with.
 *
 * The token lives in this tab's sessionStorage (gone when the tab is), unless
 * the person ticked "Keep me signed in": then in localStorage. Signing out,
 * or a token the node refuses, clears both. It is sent in a request header,
 * never in a link. */

import { emit } from "./bus.js";

const TOKEN_KEY = "crewlet.token";

let token = null;

export function currentToken() {
  return token;
}

function storedToken() {
  for (const store of ["sessionStorage", "localStorage"]) {
    try {
      const value = window[store].getItem(TOKEN_KEY);
      if (value) return value;
    } catch (e) { /* storage refused (private mode): not kept */ }
  }
  return null;
}

export function storeToken(value, keep) {
  token = value;
  for (const store of ["sessionStorage", "localStorage"]) {
    try {
      const here = store === (keep ? "localStorage" : "sessionStorage");
      if (value && here) window[store].setItem(TOKEN_KEY, value);
      else window[store].removeItem(TOKEN_KEY);
    } catch (e) { /* private mode: kept for this page only */ }
  }
}

/** #token=... from the address, taken out of it at once; else the stored one. */
export function initialToken() {
  // Split by hand: URLSearchParams would read a "+" in the token as a space.
  const parts = location.hash.replace(/^#/, "").split("&").filter(Boolean);
  const given = parts.find((part) => part.startsWith("token="));
  if (given !== undefined) {
    let value = given.slice("token=".length);
    try {
      value = decodeURIComponent(value).trim();
    } catch (e) { /* not percent-encoded: taken as it is */ }
    const rest = parts.filter((part) => part !== given).join("&");
    history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    if (value) {
      storeToken(value);
      return value;
    }
  }
  token = storedToken();
  return token;
}

export class ApiError extends Error {
  constructor(status, code, detail, body) {
    super(detail);
    this.status = status;
    this.code = code;
    this.body = body || null;   // the problem+json answer, its extra fields included
  }
}

// The token each response's request was sent with: a refusal of a token that
// is no longer the page's (a request in flight while the person signed in
// again) signs nobody out.
const sentWith = new WeakMap();

/** A request with the token: the fetch Response (a stream is read by its caller).
 *  `headers` are added; `body` is sent as JSON. Unreachable: ApiError status 0. */
export async function request(path, options) {
  const { method = "GET", body, signal, headers = {}, with_token = token } = options || {};
  const all = { Accept: "application/json", Authorization: "Bearer " + with_token, ...headers };
  if (body !== undefined) all["Content-Type"] = "application/json";
  try {
    const response = await fetch(path, {
      method, headers: all, signal, cache: "no-store", credentials: "omit",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    sentWith.set(response, with_token);
    return response;
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "unreachable", "the node did not answer; is it running?");
  }
}

/** A refusal as an ApiError (its problem+json read); a 401 of the page's
 *  current token (the one the request was sent with, or *with_token*) signs
 *  the page out. */
export async function refusal(response, with_token = sentWith.get(response)) {
  let data = null;
  try {
    data = await response.json();
  } catch (e) { /* not JSON */ }
  const detail = (data && typeof data.detail === "string" && data.detail) ||
    `${response.status} ${response.statusText}`;
  // Checked after the body was read: the page may have signed in again meanwhile.
  if (response.status === 401 && (with_token === undefined || with_token === token)) emit("signed-out", "refused");
  return new ApiError(response.status, data && data.code, detail, data && typeof data === "object" ? data : null);
}

/** A JSON request: its answer, or an ApiError. */
export async function api(path, options) {
  const response = await request(path, options);
  if (!response.ok) throw await refusal(response, (options || {}).with_token);
  try {
    return await response.json();
  } catch (e) {
    return null;
  }
}

export function problemText(error) {
  if (error instanceof ApiError) {
    if (error.status === 403) return "This token is not allowed to do that: " + error.message;
    if (error.status === 503) return "The node could not do it just now (try again shortly): " + error.message;
    return error.message;
  }
  return String(error && error.message || error);
}

/** A path segment, escaped. */
export const seg = encodeURIComponent;
