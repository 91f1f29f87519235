/* The crewlet dashboard: plain JavaScript modules, no build step, no
 * dependencies, nothing from another origin (the page's CSP allows none).
 *
 * It talks to this node's API (/v1, roles/ingress/api) with the token the
 * operator gave it (api.js):
 *
 *   - the live state comes from GET /v1/events (live.js → state.js), drawn at
 *     most once a frame (render.js) by the cards that registered for it
 *     (summary.js, fleet.js, seats.js, feed.js);
 *   - the Browse tabs (tabs.js) read their lists when shown: dead letters,
 *     conversations and their chat, tasks, the knowledge base, skills and
 *     their drafts, files;
 *   - pending approvals are read every few seconds (approvals.js);
 *   - mail, requeue, a decision, a chat's message and a draft's promotion
 *     are POSTs; a skill's retirement a DELETE.
 *
 * Panels tell each other what happened through bus.js; a panel imports
 * another only for a part it shows inside itself (the conversations panel
 * holds the chat, the chat an approval's card, the card the summary's
 * count). Every piece of data reaches the page through textContent
 * or setAttribute, never as HTML (dom.js). */

import { initialToken } from "./api.js";
import { wireApprovals } from "./approvals.js";
import { wireChat } from "./chat.js";
import { wireConversations } from "./conversations.js";
import { wireDeadLetters } from "./deadletters.js";
import { $ } from "./dom.js";
import "./feed.js";
import { wireFiles } from "./files.js";
import "./fleet.js";
import { connect, showReconnecting } from "./live.js";
import { wireMail } from "./mail.js";
import { wirePages } from "./pages.js";
import { on } from "./bus.js";
import { wireSeats } from "./seats.js";
import { wireSkills } from "./skills.js";
import { showSignIn, start, wireSignIn } from "./signin.js";
import { renderSummary } from "./summary.js";
import { reloadCurrent, selectTab, wireTabs } from "./tabs.js";
import { wireTasks } from "./tasks.js";
import { tick } from "./time.js";

function wire() {
  wireSignIn();
  $("retry-now").addEventListener("click", () => connect());
  wireSeats();
  for (const tileButton of document.querySelectorAll(".tile")) {
    tileButton.addEventListener("click", () => {
      const goto = tileButton.dataset.goto;
      if (goto === "dlq") {
        selectTab("dlq", true);
        $("tab-dlq").scrollIntoView({ behavior: "smooth", block: "start" });
      } else {
        $(goto).scrollIntoView({ behavior: "smooth", block: "start" });
      }
    });
  }
  wireTabs();
  wireDeadLetters();
  wireTasks();
  wirePages();
  wireSkills();
  wireFiles();
  wireMail();
  wireApprovals();
  wireConversations();
  wireChat();
  setInterval(() => {
    tick();
    showReconnecting();
  }, 1000);
  on("signed-in", reloadCurrent);
}

function boot() {
  wire();
  renderSummary();
  if (initialToken()) start();
  else showSignIn("");
}

// A module runs after the document is parsed.
boot();
