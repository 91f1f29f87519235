/* Server-Sent Events read from a fetch response (EventSource cannot send an
 * Authorization header, nor POST), parsed as the HTML standard says (the
 * parts crewlet sends: event, data, id, retry, comments). */

export class EventParser {
  /** onEvent(type, data, id): type null for an id-only event; onRetry(ms). */
  constructor(onEvent, onRetry) {
    this.onEvent = onEvent;
    this.onRetry = onRetry || (() => {});
    this.buffer = "";
    this.type = "";
    this.data = [];
    this.id = null;
  }

  push(chunk) {
    this.buffer += chunk;
    const lines = /\r\n|\r|\n/g;
    let start = 0;
    let match;
    while ((match = lines.exec(this.buffer)) !== null) {
      // A \r last in the buffer may be the first half of a \r\n.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      this.line(this.buffer.slice(start, match.index));
      start = lines.lastIndex;
    }
    this.buffer = this.buffer.slice(start);
  }

  line(line) {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return undefined;  // a comment: the keepalive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\u0000")) this.id = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.onRetry(Number(value));
    return undefined;
  }

  dispatch() {
    const type = this.type || "message";
    const data = this.data.join("\n");
    const had = this.data.length > 0;
    this.type = "";
    this.data = [];
    if (had) this.onEvent(type, data, this.id);
    else if (this.id !== null) this.onEvent(null, null, this.id);
  }
}

/** Read *response*'s events until it ends: onEvent(type, parsed JSON or null,
 *  id) for each, onBytes() on every chunk (a liveness watch). Resolves when
 *  the stream ends; rejects when it broke (or was aborted). */
export async function readEvents(response, onEvent, { onBytes, onRetry } = {}) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new EventParser((type, raw, id) => {
    let data = null;
    if (type !== null) {
      try {
        data = JSON.parse(raw);
      } catch (e) {
        data = null;
      }
    }
    onEvent(type, data, id);
  }, onRetry);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    if (onBytes) onBytes();
    parser.push(value);
  }
}
