/* The Files tab: the company's files (their rows are in every copy of the
 * estate, their bytes in the store the fleet shares); Download fetches the
 * bytes with the token (a plain link would not carry it). */

import { ApiError, api, problemText, refusal, request, seg } from "./api.js";
import { $, el, say } from "./dom.js";
import { registerTab } from "./tabs.js";
import { when } from "./time.js";
import { sizeText } from "./words.js";

const PAGE = 50;
const files = { rows: [], next: null, request: 0, loaded: false };

function fileUrl(f) {
  return `/v1/files/${seg(f.project)}/${f.path.split("/").map(seg).join("/")}`;
}

async function loadFiles(fresh) {
  files.loaded = true;
  const request = ++files.request;
  let path = `/v1/files?limit=${PAGE}`;
  if (!fresh && files.next) path += `&cursor=${seg(files.next)}`;
  const note = $("files-status");
  try {
    const page = await api(path);
    if (request !== files.request) return;
    files.rows = fresh ? page.items : files.rows.concat(page.items);
    files.next = page.next;
    const n = files.rows.length;
    say(note, n ? "" : "info", n ? `${n}${files.next ? "+" : ""} file${n === 1 ? "" : "s"}` : "No files yet.");
    $("files-rows").replaceChildren(...files.rows.map((f) => el("tr", { "data-testid": `file-row-${f.project}/${f.path}` },
      el("td", {}, el("span", { class: "muted" }, `${f.project}/`), f.path),
      el("td", {}, sizeText(f.size)),
      el("td", {}, String(f.version)),
      el("td", { class: "muted" }, f.content_type || "—"),
      el("td", { class: "muted" }, when(f.registered_at), f.registered_by ? ` by ${f.registered_by}` : ""),
      el("td", {}, f.object ? el("button", { type: "button", class: "ghost", "data-testid": `file-download-${f.project}/${f.path}`,
        onclick: () => downloadFile(f) }, "Download") : el("span", { class: "muted small" }, "no bytes stored")))));
    $("files-more").hidden = !files.next;
  } catch (e) {
    if (request !== files.request) return;
    say(note, "bad", "The files could not be read: " + problemText(e));
  }
}

async function downloadFile(f) {
  const note = $("files-status");
  try {
    const response = await request(fileUrl(f), { headers: { Accept: "*/*" } });
    if (!response.ok) throw await refusal(response);
    const url = URL.createObjectURL(await response.blob());
    const a = el("a", { href: url, download: f.path.split("/").pop() });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    say(note, "", `Downloaded ${f.project}/${f.path} (${sizeText(f.size)}).`);
  } catch (e) {
    say(note, "bad", `${f.project}/${f.path} could not be downloaded: ` + problemText(e instanceof ApiError ? e : String(e)));
  }
}

export function wireFiles() {
  $("files-refresh").addEventListener("click", () => loadFiles(true));
  $("files-more").addEventListener("click", () => loadFiles(false));
}

registerTab("files", {
  shown: (fresh) => { if (fresh || !files.loaded) loadFiles(true); },
  refresh: () => loadFiles(true),
  loaded: () => files.loaded,
});
