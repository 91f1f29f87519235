/* The Tasks tab: the tracker's tasks, a page at a time, and one task read in full. */

import { api, problemText, seg } from "./api.js";
import { on } from "./bus.js";
import { $, el, factList, pill, say, setText } from "./dom.js";
import { registerTab, softRefresh } from "./tabs.js";
import { when } from "./time.js";
import { humanize } from "./words.js";

const PAGE = 50;
const TASK_KINDS = { open: "info", doing: "ok", blocked: "warn", done: "unknown", cancelled: "unknown" };
const tasks = {
  rows: [], next: null,
  request: 0,      // bumped per read: an older read's answer is dropped
  chosen: null,    // the task shown
  loaded: false,   // read once: the tab is worth refreshing
};

async function loadTasks(fresh) {
  tasks.loaded = true;
  const request = ++tasks.request;
  const status = $("task-status").value;
  let path = `/v1/tasks?limit=${PAGE}` + (status ? `&status=${seg(status)}` : "");
  if (!fresh && tasks.next) path += `&cursor=${seg(tasks.next)}`;
  const note = $("tasks-status");
  if (fresh && !tasks.rows.length) setText(note, "Loading tasks…");
  try {
    const page = await api(path);
    if (request !== tasks.request) return;
    tasks.rows = fresh ? page.items : tasks.rows.concat(page.items);
    tasks.next = page.next;
    say(note, "", tasks.rows.length ? "" : (status ? `No ${status} tasks.` : "No tasks yet."));
    renderTasks();
  } catch (e) {
    if (request !== tasks.request) return;
    say(note, "bad", "The tasks could not be read: " + problemText(e));
  }
}

function renderTasks() {
  $("tasks-list").replaceChildren(...tasks.rows.map((t) => el("li", {},
    el("button", {
      type: "button", class: "item" + (tasks.chosen === t.id ? " chosen" : ""), "data-testid": `task-row-${t.id}`,
      "aria-pressed": tasks.chosen === t.id ? "true" : "false",
      onclick: () => openTask(t.id),
    },
    el("span", { class: "item-id" }, t.id),
    el("span", { class: "item-title", "data-testid": "task-title" }, t.title),
    pill(TASK_KINDS[t.status] || "unknown", humanize(t.status)),
    el("span", { class: "item-meta muted small" }, t.assignee ? `for ${t.assignee}` : "unassigned",
      " · ", when(t.updated_at || t.created_at))))));
  $("tasks-more").hidden = !tasks.next;
}

async function openTask(id) {
  tasks.chosen = id;
  renderTasks();
  const box = $("task-detail");
  box.replaceChildren(el("p", { class: "muted" }, `Loading ${id}…`));
  try {
    const { task, comments } = await api(`/v1/tasks/${seg(id)}`);
    if (tasks.chosen !== id) return;
    const { facts, fact } = factList();
    fact("Status", pill(TASK_KINDS[task.status] || "unknown", humanize(task.status)));
    fact("Assignee", task.assignee || el("span", { class: "muted" }, "nobody"));
    if ((task.labels || []).length) fact("Labels", task.labels.map((l) => el("span", { class: "tag" }, l)));
    if (task.parent) fact("Part of", task.parent);
    fact("Opened", task.created_by ? `by ${task.created_by}, ` : "", when(task.created_at));
    if (task.updated_at && task.updated_at !== task.created_at) {
      fact("Changed", task.updated_by ? `by ${task.updated_by}, ` : "", when(task.updated_at));
    }
    box.replaceChildren(
      el("h3", { "data-testid": "task-detail-title" }, el("span", { class: "muted" }, `${task.id} `), task.title),
      facts,
      task.body ? el("div", { class: "body" }, task.body) : el("p", { class: "muted" }, "No description."),
      el("h4", {}, `Comments (${comments.length})`),
      comments.length ? el("ol", { class: "comments" }, comments.map((c) => el("li", {},
        el("div", { class: "muted small" }, c.created_by || c.author || "someone", " · ", when(c.created_at)),
        el("div", { class: "body" }, c.body)))) : el("p", { class: "muted" }, "None."));
  } catch (e) {
    if (tasks.chosen !== id) return;
    box.replaceChildren(el("p", { class: "bad-text" }, `Task ${id} could not be read: ${problemText(e)}`));
  }
}

export function wireTasks() {
  $("task-status").addEventListener("change", () => loadTasks(true));
  $("tasks-refresh").addEventListener("click", () => loadTasks(true));
  $("tasks-more").addEventListener("click", () => loadTasks(false));
}

registerTab("tasks", {
  shown: (fresh) => { if (fresh || !tasks.loaded) loadTasks(true); },
  refresh: () => loadTasks(true),
  loaded: () => tasks.loaded,
});
on("turn", (d) => {
  if ((d.tool_calls || []).some((c) => String(c.name || "").startsWith("task_"))) softRefresh("tasks");
});
