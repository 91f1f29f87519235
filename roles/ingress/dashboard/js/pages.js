/* The Knowledge base tab: its pages, a page at a time, the search across
 * the data nodes' shards, and one page read in full. */

import { api, problemText, seg } from "./api.js";
import { on } from "./bus.js";
import { $, el, factList, say } from "./dom.js";
import { registerTab, softRefresh } from "./tabs.js";
import { when } from "./time.js";

const PAGE = 50;
const pages = {
  rows: [], next: null,
  request: 0,        // bumped per read: an older read's answer is dropped
  chosen: null,      // the path shown
  loaded: false,     // read once
  searching: false,  // search results are shown instead of the list
};

async function loadPages(fresh) {
  pages.loaded = true;
  const request = ++pages.request;
  let path = `/v1/pages?limit=${PAGE}`;
  if (!fresh && pages.next) path += `&cursor=${seg(pages.next)}`;
  try {
    const page = await api(path);
    if (request !== pages.request) return;
    pages.rows = fresh ? page.items : pages.rows.concat(page.items);
    pages.next = page.next;
    renderPages();
  } catch (e) {
    if (request !== pages.request || pages.searching) return;
    say($("search-status"), "bad", "The pages could not be read: " + problemText(e));
  }
}

function pageButton(p, extra) {
  return el("li", {}, el("button", {
    type: "button", class: "item" + (pages.chosen === p.path ? " chosen" : ""), "data-testid": `page-row-${p.path}`,
    onclick: () => openPage(p.path),
  },
  el("span", { class: "item-title" }, p.title || p.path),
  el("span", { class: "item-id muted" }, p.path),
  extra || null));
}

function renderPages() {
  if (!pages.searching) {
    const n = pages.rows.length;
    say($("search-status"), "", n ? `${n}${pages.next ? "+" : ""} page${n === 1 ? "" : "s"}` : "No pages yet.");
  }
  $("pages-list").replaceChildren(...pages.rows.map((p) => pageButton(p,
    el("span", { class: "item-meta muted small" }, `version ${p.version} · `, when(p.updated_at || p.created_at)))));
  $("pages-more").hidden = !pages.next || pages.searching;
}

/** A search snippet: **word** marks a match. Split, never parsed as HTML. */
function snippet(text) {
  const parts = String(text || "").split("**");
  return el("span", { class: "snippet" }, parts.map((part, i) => (i % 2 ? el("mark", {}, part) : part)));
}

async function search(event) {
  event.preventDefault();
  const q = $("search-input").value.trim();
  const note = $("search-status");
  const results = $("search-results");
  if (!q) return clearSearch();
  pages.searching = true;
  $("pages-list").hidden = true;
  $("pages-more").hidden = true;
  $("search-clear").hidden = false;
  results.hidden = false;
  say(note, "", `Searching for “${q}”…`);
  try {
    const answer = await api(`/v1/search?q=${seg(q)}&limit=20`);
    if (!pages.searching || $("search-input").value.trim() !== q) return;
    if (!answer.searched) {
      const why = Object.entries(answer.answers || {}).map(([node, said]) => `${node}: ${said}`).join("; ");
      say(note, "warn", `The knowledge base could not be searched just now: no data node could run the search` +
        (why ? ` (${why})` : "") + `. This is not the same as “no results”; try again shortly.`);
      results.replaceChildren();
      return;
    }
    const hits = answer.hits || [];
    const cov = answer.coverage || {};
    // A partial search says so: the hits are right, only not from every shard.
    const partial = answer.partial ? ` Partial: searched ${cov.searched} of ${cov.of} shards` +
      ((cov.missing || []).length ? `; ${cov.missing.join(", ")} did not answer.` : ".") : "";
    say(note, answer.partial ? "warn" : hits.length ? "" : "info",
      (hits.length ? `${hits.length} page${hits.length === 1 ? " matches" : "s match"} “${q}”.` : `No page matches “${q}”.`) + partial);
    results.replaceChildren(...hits.map((h) => pageButton({ path: h.path, title: h.title }, snippet(h.snippet))));
  } catch (e) {
    if (!pages.searching) return;
    say(note, "bad", "The search failed: " + problemText(e));
  }
}

function clearSearch() {
  pages.searching = false;
  $("search-input").value = "";
  $("search-results").hidden = true;
  $("search-results").replaceChildren();
  $("pages-list").hidden = false;
  $("search-clear").hidden = true;
  renderPages();
}

async function openPage(path) {
  pages.chosen = path;
  const box = $("page-detail");
  box.replaceChildren(el("p", { class: "muted" }, `Loading ${path}…`));
  for (const b of document.querySelectorAll("#panel-pages .item")) {
    b.classList.toggle("chosen", b.dataset.testid === `page-row-${path}`);
  }
  try {
    const page = await api(`/v1/pages/${path.split("/").map(seg).join("/")}`);
    if (pages.chosen !== path) return;
    const { facts, fact } = factList();
    fact("Path", el("code", {}, page.path));
    fact("Version", String(page.version));
    fact("Written", page.updated_by ? `by ${page.updated_by}, ` : "", when(page.updated_at || page.created_at));
    box.replaceChildren(el("h3", { "data-testid": "page-detail-title" }, page.title), facts,
      page.body ? el("div", { class: "body" }, page.body) : el("p", { class: "muted" }, "This page is empty."));
  } catch (e) {
    if (pages.chosen !== path) return;
    box.replaceChildren(el("p", { class: "bad-text" }, `Page ${path} could not be read: ${problemText(e)}`));
  }
}

export function wirePages() {
  $("search-form").addEventListener("submit", search);
  $("search-clear").addEventListener("click", clearSearch);
  $("pages-refresh").addEventListener("click", () => (pages.searching ? $("search-form").requestSubmit() : loadPages(true)));
  $("pages-more").addEventListener("click", () => loadPages(false));
}

registerTab("pages", {
  shown: (fresh) => { if (fresh || !pages.loaded) loadPages(true); },
  refresh: () => { if (!pages.searching) loadPages(true); },
  loaded: () => pages.loaded,
});
on("turn", (d) => {
  if ((d.tool_calls || []).some((c) => String(c.name || "").startsWith("page_"))) softRefresh("pages");
});
