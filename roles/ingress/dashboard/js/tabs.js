/* The Browse card's tabs (WAI-ARIA tabs: arrows move between them). Each
 * panel registers what to do when it is shown and how to read itself again;
 * lists the live stream does not carry are read when shown, and again
 * (softRefresh) when a turn may have changed them. */

import { $ } from "./dom.js";

export const TABS = ["dlq", "convs", "tasks", "pages", "skills", "files"];
const hooks = {};   // tab -> {shown(fresh), refresh(), loaded()}
const soft = {};    // tab -> the pending softRefresh's timer

export function registerTab(name, panel) {
  hooks[name] = panel;
}

export function currentTab() {
  return TABS.find((t) => $(`tab-${t}`).getAttribute("aria-selected") === "true");
}

export function selectTab(name, focus) {
  for (const t of TABS) {
    const tab = $(`tab-${t}`);
    const on = t === name;
    tab.setAttribute("aria-selected", on ? "true" : "false");
    tab.tabIndex = on ? 0 : -1;
    $(`panel-${t}`).hidden = !on;
    if (on && focus) tab.focus();
  }
  if (hooks[name]) hooks[name].shown(false);
}

/** The shown tab, read afresh (a sign-in). */
export function reloadCurrent() {
  const name = currentTab();
  if (hooks[name]) hooks[name].shown(true);
}

/** Read a list the operator has open again, at most once a second. */
export function softRefresh(name) {
  const panel = hooks[name];
  if (!panel || !panel.loaded() || soft[name]) return;
  soft[name] = setTimeout(() => {
    soft[name] = null;
    panel.refresh();
  }, 1000);
}

export function wireTabs() {
  for (const t of TABS) $(`tab-${t}`).addEventListener("click", () => selectTab(t, false));
  document.querySelector(".tabs").addEventListener("keydown", (event) => {
    const i = TABS.indexOf(currentTab());
    if (event.key === "ArrowRight") selectTab(TABS[(i + 1) % TABS.length], true);
    else if (event.key === "ArrowLeft") selectTab(TABS[(i + TABS.length - 1) % TABS.length], true);
    else if (event.key === "Home") selectTab(TABS[0], true);
    else if (event.key === "End") selectTab(TABS[TABS.length - 1], true);
    else return;
    event.preventDefault();
  });
}
