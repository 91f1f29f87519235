/* Send mail to a seat (POST /v1/seats/{seat}/mail): its turn shows in the feed. */

import { api, problemText, seg } from "./api.js";
import { $, say } from "./dom.js";

async function sendMail(event) {
  event.preventDefault();
  const seat = $("mail-seat").value;
  const text = $("mail-text").value;
  const result = $("mail-result");
  if (!seat || !text.trim()) {
    say(result, "bad", !seat ? "Choose a seat." : "Write a message first.");
    return;
  }
  const button = $("mail-send");
  button.disabled = true;
  say(result, "", "Sending…");
  try {
    const sent = await api(`/v1/seats/${seg(seat)}/mail`, { method: "POST", body: { text } });
    say(result, "ok", `Sent to ${seat} (message #${sent.seq}). Its turn shows in the feed when it is done.`);
    $("mail-text").value = "";
  } catch (e) {
    say(result, "bad", `Not sent: ${problemText(e)}`);
  } finally {
    button.disabled = false;
  }
}

export function wireMail() {
  $("mail-form").addEventListener("submit", sendMail);
}
