/* Signing in (a token pasted, checked against the node before it is kept),
 * out, and what a refused token does: back to the sign-in box, saying why. */

import { api, problemText, storeToken } from "./api.js";
import { emit, on } from "./bus.js";
import { $, setText } from "./dom.js";
import { restart, setConnection, stopStream } from "./live.js";
import { S } from "./state.js";

const WHY = {
  refused: "This node did not accept the saved token (it may have been replaced). Sign in again.",
  forbidden: "This token may not read this node (it needs the read scope). Sign in with another.",
};

export function showSignIn(message) {
  stopStream();
  S.live = false;
  setConnection("signedout", "Signed out");
  $("main").hidden = true;
  $("sign-out").hidden = true;
  $("signin").hidden = false;
  const error = $("signin-error");
  error.hidden = !message;
  setText(error, message || "");
  $("signin-token").value = "";
  $("signin-keep").checked = false;
  $("signin-token").focus();
}

async function onSignIn(event) {
  event.preventDefault();
  const value = $("signin-token").value.trim();
  const error = $("signin-error");
  const button = $("signin-submit");
  if (!value) {
    error.hidden = false;
    setText(error, "Paste the node's API token first.");
    return;
  }
  button.disabled = true;
  setText(button, "Checking…");
  try {
    await api("/v1/fleet", { with_token: value });
  } catch (e) {
    error.hidden = false;
    if (e.status === 401) {
      setText(error, "This node does not accept that token. Check that you copied all of it, " +
        "and that it is this node's token.");
    } else if (e.status === 403) {
      setText(error, "That token is known, but it may not read this node (it needs the read scope).");
    } else {
      setText(error, "Could not check the token: " + problemText(e));
    }
    $("signin-token").select();
    return;
  } finally {
    button.disabled = false;
    setText(button, "Sign in");
  }
  storeToken(value, $("signin-keep").checked);
  start();
}

/** Signed in: the page shown, the live stream opened, the shown lists read. */
export function start() {
  $("signin").hidden = true;
  $("main").hidden = false;
  $("sign-out").hidden = false;
  restart();
  emit("signed-in");
}

export function wireSignIn() {
  $("signin-form").addEventListener("submit", onSignIn);
  $("sign-out").addEventListener("click", () => {
    storeToken(null);
    emit("signed-out", "by-hand");
  });
}

on("signed-out", (why) => {
  if (why !== "forbidden") storeToken(null);  // a token that may not read is kept: another tab may use it
  showSignIn(WHY[why] || "");
});
