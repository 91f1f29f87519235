/* The Skills tab: the company's skills and the learning passes' drafts
 * (roles/ingress/api/skills.py).
 *
 *   - the skills (GET /v1/skills): name, description, revision, files, who
 *     wrote it and when;
 *   - one opened (GET /v1/skills/{name}, ?file= for each of its other
 *     files) with its history (…/revisions), and retired after a
 *     confirmation (DELETE: its pages go, its history stays);
 *   - the drafts (GET /v1/skills/drafts), those waiting first, each read
 *     like a skill and promoted or rejected (POST …/drafts/{name}/promote |
 *     reject): the same decision as its promotion's card in the Approvals
 *     panel, which hears of it ("approval-decided") as this tab hears of the
 *     panel's ("approval-decided", and "promotions": the pending ones it read).
 *
 * A file's text is shown as text (textContent), never as HTML. */

import { api, problemText, seg } from "./api.js";
import { emit, on } from "./bus.js";
import { $, append, el, factList, pill, reconcile, say, setText } from "./dom.js";
import { registerTab, selectTab, softRefresh } from "./tabs.js";
import { when } from "./time.js";
import { excerpt, humanize, plural } from "./words.js";

const LIST = 500;          // skills, and drafts, read at once (the API's most)
const REVISIONS = 50;      // revisions shown, newest first
const EPISODES_SHOWN = 20; // a draft's episodes named by their log seq
const NOTE_MAX = 2000;     // characters of a decision's note (the API's limit)
const SKILL_FILE = "SKILL.md";
const DRAFT_KINDS = {
  pending: ["warn", "Waiting", "waits for a person to promote or reject it"],
  promoted: ["ok", "Promoted", "its files became the skill's next revision"],
  rejected: ["unknown", "Rejected", "it stays a draft; no skill was written"],
};

const skills = {
  rows: [],             // the skills as last read, by name
  drafts: [],           // the drafts as last read: waiting first, then the newest decided
  full: false,          // as many skills as one read holds: there may be more
  request: 0,           // bumped per read: an older read's answer is dropped
  loaded: false,        // read once
  cache: new Map(),     // reconcile's, skills: name -> {el, sig}
  draftCache: new Map(),// reconcile's, drafts
  chosen: null,         // what the detail shows: {kind: "skill" | "draft", name, file}
  opened: 0,            // bumped per open: an older read's answer is dropped
  deciding: new Set(),  // drafts whose decision is on its way
  promotions: null,     // the pending promotions' approval ids, as the Approvals panel last read them
};

const skillPath = (name) => `/v1/skills/${seg(name)}`;
const draftPath = (name) => `/v1/skills/drafts/${seg(name)}`;
const withFile = (path, file) => path + (file ? `?file=${seg(file)}` : "");

function draftKind(status) {
  return DRAFT_KINDS[status] || ["unknown", humanize(status || "unknown"), null];
}

function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "dash-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// ------------------------------------------------------------------ the lists

async function loadSkills() {
  skills.loaded = true;
  const request = ++skills.request;
  const [listed, waiting, all] = await Promise.allSettled([
    api(`/v1/skills?limit=${LIST}`),
    api(`/v1/skills/drafts?status=pending&limit=${LIST}`),
    api(`/v1/skills/drafts?limit=${LIST}`),
  ]);
  if (request !== skills.request) return;
  if (listed.status === "fulfilled") {
    skills.rows = (listed.value && listed.value.items) || [];
    skills.full = skills.rows.length >= LIST;
    const n = skills.rows.length;
    say($("skills-status"), n ? "" : "info", n ? `${n}${skills.full ? "+" : ""} skill${n === 1 ? "" : "s"}`
      : "No skills yet: push one with crewletctl skills push DIR, or promote a draft.");
    renderSkills();
  } else {
    say($("skills-status"), "bad", "The skills could not be read: " + problemText(listed.reason));
  }
  if (waiting.status === "fulfilled" && all.status === "fulfilled") {
    const pending = (waiting.value && waiting.value.items) || [];
    const names = new Set(pending.map((d) => d.name));
    const decided = ((all.value && all.value.items) || [])
      .filter((d) => d.status !== "pending" && !names.has(d.name))
      .sort((a, b) => (b.decided_at || 0) - (a.decided_at || 0) || String(a.name).localeCompare(String(b.name)));
    skills.drafts = pending.concat(decided);
    say($("drafts-status"), skills.drafts.length ? "" : "info", skills.drafts.length
      ? `${pending.length} waiting for a decision · ${decided.length} decided`
      : "No drafts: the learning passes draft a skill when a seat keeps doing the same kind of work.");
    renderDrafts();
  } else {
    const e = waiting.status === "rejected" ? waiting.reason : all.reason;
    say($("drafts-status"), "bad", "The drafts could not be read: " + problemText(e));
  }
}

function renderSkills() {
  reconcile($("skills-list"), skills.cache, skills.rows, (s) => s.name, (s) => `${s.seq}`, skillRow);
  markChosen();
}

function skillRow(s) {
  const files = s.files || [];
  return el("li", {}, el("button", {
    type: "button", class: "item", "data-testid": `skill-row-${s.name}`, "data-seq": s.seq, "aria-pressed": "false",
    onclick: () => openSkill(s.name),
  },
  el("span", { class: "item-title", "data-testid": "skill-name" }, s.name),
  el("span", { class: "item-id", "data-testid": "skill-seq", title: "its revision: the estate log seq of its write" },
    `revision ${s.seq}`),
  el("span", { class: "item-meta stack" },
    el("span", { "data-testid": "skill-description" }, excerpt(s.description || "", 240)),
    el("span", { class: "muted small", "data-testid": "skill-files" },
      plural(files.length, "file", "files"), files.length ? ": " + files.join(", ") : ""),
    el("span", { class: "muted small", "data-testid": "skill-written" }, s.by ? `by ${s.by}, ` : "", when(s.at)))));
}

function renderDrafts() {
  reconcile($("drafts-list"), skills.draftCache, skills.drafts, (d) => d.name,
    (d) => [d.status, d.seq, d.decided_at, d.decided_by].join("|"), draftRow);
  markChosen();
}

function draftRow(d) {
  const [kind, label, why] = draftKind(d.status);
  const description = (d.meta && d.meta.description) || "";
  return el("li", {
    class: "draft", "data-testid": `draft-row-${d.name}`, "data-status": d.status, "data-approval": d.approval,
  },
  el("div", { class: "draft-head" },
    el("button", {
      type: "button", class: "link draft-name", "data-testid": "draft-open", title: "Read this draft",
      onclick: () => openDraft(d.name),
    }, d.name),
    pill(kind, label, why)),
  description ? el("p", { "data-testid": "draft-description" }, excerpt(description, 240)) : null,
  el("p", { class: "muted small", "data-testid": "draft-source" }, draftSource(d), " · drafted ", when(d.at)),
  d.status === "pending" ? draftActions(d, "row")
    : el("p", { class: "muted small", "data-testid": "draft-decided" }, `${label} by ${d.decided_by || "?"}, `,
      when(d.decided_at)));
}

/** "From N episodes of seat S · cluster C". */
function draftSource(d) {
  return [`From ${plural((d.episodes || []).length, "episode", "episodes")} of seat `,
    el("strong", { "data-testid": "draft-seat" }, d.seat), ` · cluster ${d.cluster}`];
}

/** What the detail shows, marked in the lists. */
function markChosen() {
  const c = skills.chosen;
  for (const [name, entry] of skills.cache) {
    const on = Boolean(c && c.kind === "skill" && c.name === name);
    const button = entry.el.firstElementChild;
    button.classList.toggle("chosen", on);
    button.setAttribute("aria-pressed", on ? "true" : "false");
  }
  for (const [name, entry] of skills.draftCache) {
    entry.el.classList.toggle("chosen", Boolean(c && c.kind === "draft" && c.name === name));
  }
}

// ------------------------------------------------------------------ a draft's decision

/** A note, Promote and Reject for a waiting draft. *place* makes its ids unique. */
function draftActions(d, place) {
  const noteId = `draft-${place}-${d.name}-note`;
  const note = el("input", {
    id: noteId, type: "text", maxlength: NOTE_MAX, autocomplete: "off", spellcheck: "true",
    "data-testid": "draft-note", placeholder: "why, for the record",
  });
  const promote = el("button", {
    type: "button", class: "primary", "data-testid": "draft-promote", "aria-label": `Promote draft ${d.name}`,
  }, "Promote");
  const reject = el("button", {
    type: "button", class: "danger", "data-testid": "draft-reject", "aria-label": `Reject draft ${d.name}`,
  }, "Reject");
  const message = el("p", { class: "result", role: "status", "aria-live": "polite", "data-testid": "draft-message" });
  const parts = { note, promote, reject, message };
  promote.addEventListener("click", () => decideDraft(d, "promote", parts));
  reject.addEventListener("click", () => decideDraft(d, "reject", parts));
  return el("div", { class: "draft-actions" },
    el("label", { for: noteId, class: "small" }, "Note ", el("span", { class: "muted" }, "(optional; kept with the decision)")),
    el("div", { class: "approval-buttons" }, note, promote, reject),
    message);
}

async function decideDraft(d, verdict, p) {
  if (skills.deciding.has(d.name)) return;
  skills.deciding.add(d.name);
  const promoting = verdict === "promote";
  const text = p.note.value.trim();
  p.promote.disabled = true;
  p.reject.disabled = true;
  p.note.readOnly = true;
  setText(promoting ? p.promote : p.reject, promoting ? "Promoting…" : "Rejecting…");
  say(p.message, "", promoting ? "Sending the promotion…" : "Sending the rejection…");
  let settled = true;
  try {
    const answer = await api(`${draftPath(d.name)}/${verdict}`, { method: "POST", body: text ? { note: text } : {} });
    const skill = answer && answer.skill;
    say($("skills-result"), "ok", promoting
      ? `Promoted: draft ${d.name} is now skill ${skill ? skill.name : d.name}` +
        (skill ? ` (revision ${skill.seq})` : "") + "; the seats it applies to see it from their next turn."
      : `Rejected: draft ${d.name} stays a draft, rejected; no skill was written.`);
    // The same approval: the Approvals panel drops its card. (The answer's approval is
    // without its args: the draft they name is this one.)
    if (answer && answer.approval) {
      const approval = { args: { skill: d.name, draft: d.name }, ...answer.approval };
      emit("approval-decided", { approval, answer: answer.approval, note: text });
    }
  } catch (e) {
    if (e.status === 409 || e.status === 404) {
      say($("skills-result"), "warn", `Draft ${d.name} was not ${promoting ? "promoted" : "rejected"} here: ` +
        (e.status === 404 ? `it is no longer there (${e.message}).` : `it was decided already (${e.message}).`));
    } else {
      settled = false;
      p.promote.disabled = false;
      p.reject.disabled = false;
      p.note.readOnly = false;
      setText(p.promote, "Promote");
      setText(p.reject, "Reject");
      say(p.message, "bad", `Not decided: ${problemText(e)}` + (e.status === 0
        ? " It may or may not have reached the node: sending the same decision again is safe." : ""));
    }
  } finally {
    skills.deciding.delete(d.name);
  }
  if (!settled) return;
  await loadSkills();
  const c = skills.chosen;
  if (c && c.kind === "draft" && c.name === d.name) openDraft(d.name, c.file);
}

// ------------------------------------------------------------------ one skill, one draft

function detail() {
  return $("skill-detail");
}

/** The detail's contents replaced by *parts* (nodes, text, lists of them; null skipped). */
function show(...parts) {
  const box = detail();
  box.replaceChildren();
  append(box, parts);
}

async function openSkill(name, file, { focus = false } = {}) {
  const opened = ++skills.opened;
  const moved = skills.chosen && skills.chosen.kind === "skill" && skills.chosen.name === name;
  skills.chosen = { kind: "skill", name, file: file || null };
  markChosen();
  if (!moved) show(el("p", { class: "muted" }, `Loading skill ${name}…`));
  const [read, history] = await Promise.allSettled([
    api(withFile(skillPath(name), file)),
    api(`${skillPath(name)}/revisions?limit=${REVISIONS}`),
  ]);
  if (opened !== skills.opened) return;
  const revisions = history.status === "fulfilled" ? (history.value && history.value.items) || [] : null;
  const historyView = revisionsView(revisions, history.reason);
  if (read.status === "rejected") {
    const e = read.reason;
    const last = revisions && revisions[0];
    if (e.status === 404 && last && last.retired && !file) {
      show(
        el("h3", { "data-testid": "skill-detail-title" }, name, " ", pill("unknown", "Retired")),
        el("p", { class: "muted", "data-testid": "skill-retired" }, last.by ? `Retired by ${last.by}, ` : "Retired ",
          when(last.at), ` (revision ${last.seq}): no seat sees it any more; its history stays.`),
        historyView);
    } else {
      show(
        el("h3", { "data-testid": "skill-detail-title" }, name),
        el("p", { class: "bad-text", "data-testid": "skill-detail-error" },
          `${file ? `File ${file} of skill ${name}` : `Skill ${name}`} could not be read: ${problemText(e)}`),
        file ? el("button", { type: "button", class: "link", onclick: () => openSkill(name) }, `Read its ${SKILL_FILE}`) : null,
        historyView);
    }
    return;
  }
  const { skill, file: shown } = read.value;
  const meta = skill.meta || {};
  const { facts, fact } = factList();
  fact("Revision", el("span", { "data-testid": "skill-detail-seq" }, String(skill.seq)),
    skill.draft ? el("span", { class: "muted" }, ` · promoted from draft ${skill.draft}`) : null);
  fact("Written", skill.by ? `by ${skill.by}, ` : "", when(skill.at));
  if (skill.note) fact("Note", skill.note);
  fact("Applies to", (meta.seats || []).length ? meta.seats.map((s) => el("span", { class: "tag" }, s))
    : el("span", { class: "muted" }, "every seat"));
  if ((meta.tools || []).length) fact("About the tools", meta.tools.map((t) => el("span", { class: "tag" }, t)));
  if ((meta.allowed_tools || []).length) fact("Allowed tools", meta.allowed_tools.map((t) => el("span", { class: "tag" }, t)));
  if (meta.license) fact("License", meta.license);
  if (meta.compatibility) fact("Compatibility", meta.compatibility);
  show(
    el("h3", { "data-testid": "skill-detail-title" }, skill.name),
    el("p", { "data-testid": "skill-detail-description" }, skill.description || meta.description || ""),
    facts,
    filesView(skill.name, skill.files || [], shown, openSkill),
    historyView,
    retireView(skill));
  if (focus) focusFile();
}

async function openDraft(name, file, { focus = false } = {}) {
  const opened = ++skills.opened;
  const moved = skills.chosen && skills.chosen.kind === "draft" && skills.chosen.name === name;
  skills.chosen = { kind: "draft", name, file: file || null };
  markChosen();
  if (!moved) show(el("p", { class: "muted" }, `Loading draft ${name}…`));
  let answer;
  try {
    answer = await api(withFile(draftPath(name), file));
  } catch (e) {
    if (opened !== skills.opened) return;
    show(
      el("h3", { "data-testid": "skill-detail-title" }, el("span", { class: "muted" }, "Draft "), name),
      el("p", { class: "bad-text", "data-testid": "skill-detail-error" },
        `${file ? `File ${file} of draft ${name}` : `Draft ${name}`} could not be read: ${problemText(e)}`),
      file ? el("button", { type: "button", class: "link", onclick: () => openDraft(name) }, `Read its ${SKILL_FILE}`) : null);
    return;
  }
  if (opened !== skills.opened) return;
  const { draft, file: shown } = answer;
  const [kind, label, why] = draftKind(draft.status);
  const episodes = draft.episodes || [];
  const { facts, fact } = factList();
  fact("Status", el("span", { "data-testid": "draft-detail-status", "data-status": draft.status }, pill(kind, label, why)),
    draft.decided_at ? [` by ${draft.decided_by || "?"}, `, when(draft.decided_at)] : null);
  fact("From", draftSource(draft), el("span", { class: "muted small" }, ` (episodes at log seqs ` +
    episodes.slice(0, EPISODES_SHOWN).join(", ") + (episodes.length > EPISODES_SHOWN ? ", …" : "") + ")"));
  fact("Drafted", draft.by ? `by ${draft.by}, ` : "", when(draft.at));
  fact("Its approval", el("code", {}, draft.approval));
  show(
    el("h3", { "data-testid": "skill-detail-title" }, el("span", { class: "muted" }, "Draft "), draft.name),
    el("p", { "data-testid": "skill-detail-description" }, (draft.meta && draft.meta.description) || ""),
    facts,
    draft.status === "pending" ? draftActions(draft, "detail") : null,
    filesView(draft.name, draft.files || [], shown, openDraft));
  if (focus) focusFile();
}

/** Its files, each a button that opens it, and the one shown: as text. */
function filesView(name, files, shown, open) {
  return [
    el("h4", {}, `Files (${files.length})`),
    el("ul", { class: "skill-files", "data-testid": "skill-files-list" }, files.map((path) => el("li", {},
      el("button", {
        type: "button", class: "link", "data-testid": `skill-file-${path}`,
        "aria-current": path === shown.path ? "true" : null,
        onclick: () => open(name, path, { focus: true }),
      }, path)))),
    el("h4", { "data-testid": "skill-file-path" }, shown.path),
    el("pre", {
      class: "body skill-body", "data-testid": "skill-file-body", tabindex: "0", "aria-label": `${shown.path} of ${name}`,
    }, shown.body),
  ];
}

function focusFile() {
  const body = detail().querySelector("[data-testid=skill-file-body]");
  if (body) body.focus();
}

function revisionsView(revisions, error) {
  return [
    el("h4", {}, "Revisions ", el("span", { class: "muted small" }, "— newest first")),
    revisions ? el("ol", { class: "revisions", "data-testid": "skill-revisions" }, revisions.map((r) => el("li", {
      "data-testid": `revision-${r.seq}`, "data-retired": r.retired ? "true" : "false",
    },
    el("strong", {}, `revision ${r.seq}`), " · ",
    r.retired ? pill("unknown", "Retired") : plural((r.files || []).length, "file", "files"),
    " · ", r.by ? `by ${r.by}, ` : "", when(r.at),
    r.draft ? ` · promoted from draft ${r.draft}` : "",
    r.note ? el("div", { class: "muted small" }, r.note) : null)))
      : el("p", { class: "bad-text" }, "Its revisions could not be read: " + problemText(error)),
  ];
}

/** Retire, asked twice: the button, then a question with its own Retire and Cancel. */
function retireView(skill) {
  const message = el("p", { class: "result", role: "status", "aria-live": "polite", "data-testid": "skill-retire-message" });
  const ask = el("button", { type: "button", class: "danger", "data-testid": "skill-retire" }, "Retire this skill…");
  ask.addEventListener("click", () => {
    const key = idempotencyKey();   // one per question: retried, the same retirement lands once
    const questionId = `skill-retire-question-${skill.name}`;
    const confirm = el("button", { type: "button", class: "danger", "data-testid": "skill-retire-confirm" },
      `Retire ${skill.name}`);
    const cancel = el("button", { type: "button", class: "ghost", "data-testid": "skill-retire-cancel" }, "Cancel");
    const question = el("div", { class: "confirm", role: "group", "aria-labelledby": questionId, "data-testid": "skill-retire-question" },
      el("p", { id: questionId }, `Retire skill ${skill.name}? It leaves this list and every seat's prompt from its ` +
        `next turn, and its pages go; its history stays.`),
      el("div", { class: "approval-buttons" }, confirm, cancel));
    cancel.addEventListener("click", () => {
      question.replaceWith(ask);
      say(message, "", "");
      ask.focus();
    });
    confirm.addEventListener("click", () => retire(skill, key, confirm, cancel, message));
    ask.replaceWith(question);
    cancel.focus();
  });
  return el("div", { class: "retire-box" }, el("h4", {}, "Retire"), ask, message);
}

async function retire(skill, key, confirm, cancel, message) {
  confirm.disabled = true;
  cancel.disabled = true;
  setText(confirm, "Retiring…");
  say(message, "", "");
  try {
    const done = await api(skillPath(skill.name), { method: "DELETE", headers: { "Idempotency-Key": key } });
    say($("skills-result"), "ok", `Retired skill ${skill.name} (revision ${done ? done.seq : "?"}): no seat sees it ` +
      `from its next turn; its history stays.`);
  } catch (e) {
    if (e.status !== 404) {
      confirm.disabled = false;
      cancel.disabled = false;
      setText(confirm, `Retire ${skill.name}`);
      say(message, "bad", `Not retired: ${problemText(e)}` + (e.status === 0
        ? " It may or may not have reached the node: retiring it again from here is safe." : ""));
      return;
    }
    say($("skills-result"), "warn", `Skill ${skill.name} was not retired here: ${e.message}`);
  }
  await loadSkills();
  const c = skills.chosen;
  if (c && c.kind === "skill" && c.name === skill.name) openSkill(skill.name);
}

function reopen() {
  const c = skills.chosen;
  if (!c) return;
  if (c.kind === "skill") openSkill(c.name, c.file);
  else openDraft(c.name, c.file);
}

// ------------------------------------------------------------------ wiring

export function wireSkills() {
  $("skills-refresh").addEventListener("click", () => {
    loadSkills();
    reopen();
  });
}

registerTab("skills", {
  shown: (fresh) => {
    if (fresh || !skills.loaded) loadSkills();
    if (fresh) reopen();
  },
  refresh: () => loadSkills(),
  loaded: () => skills.loaded,
});

on("approval-decided", ({ approval }) => {
  // A promotion decided in the Approvals panel: a new skill, a draft decided.
  if (!approval || approval.kind !== "promotion") return;
  const draft = approval.args && approval.args.draft;
  if (draft && skills.deciding.has(draft)) return;   // decided here: read again already
  softRefresh("skills");
});
on("promotions", (rows) => {
  // The pending promotions the Approvals panel read: counted on the tab; a change is read again.
  const badge = $("tab-skills-count");
  setText(badge, rows.length ? String(rows.length) : "");
  badge.hidden = !rows.length;
  const ids = rows.map((a) => a.id).sort().join(" ");
  if (skills.promotions !== null && ids !== skills.promotions) softRefresh("skills");
  skills.promotions = ids;
});
on("open-draft", (name) => {
  // From a promotion's card: the draft, read in this tab.
  selectTab("skills", false);
  $("tab-skills").scrollIntoView({ behavior: "smooth", block: "start" });
  openDraft(name);
});
on("turn", (d) => {
  // A seat may write a skill's pages (skills/<name>/…) with page_write.
  if ((d.tool_calls || []).some((c) => /^page_(write|delete)$/.test(String(c.name || "")))) softRefresh("skills");
});
on("signed-out", () => {
  // Nothing read with the token stays on the page.
  skills.request++;
  skills.opened++;
  skills.rows = [];
  skills.drafts = [];
  skills.loaded = false;
  skills.chosen = null;
  skills.promotions = null;
  for (const cache of [skills.cache, skills.draftCache]) cache.clear();
  $("skills-list").replaceChildren();
  $("drafts-list").replaceChildren();
  for (const id of ["skills-status", "drafts-status", "skills-result"]) say($(id), "", "");
  setText($("tab-skills-count"), "");
  $("tab-skills-count").hidden = true;
  show(el("p", { class: "muted" }, "Choose a skill or a draft to read it."));
});
