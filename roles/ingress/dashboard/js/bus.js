/* A few named happenings one part of the page tells the others about, so
 * panels do not import each other: "snapshot", "turn" (a live turn record),
 * "signed-out", "approval-decided" ({approval, answer}), "conversation"
 * (a conversation's row changed, as this page saw it), "promotions" (the
 * pending promotions the Approvals panel read), "open-draft" (a drafted
 * skill's name: read it in the Skills tab). */

const listeners = new Map();

export function on(name, fn) {
  if (!listeners.has(name)) listeners.set(name, []);
  listeners.get(name).push(fn);
}

export function emit(name, ...args) {
  for (const fn of listeners.get(name) || []) {
    try {
      fn(...args);
    } catch (e) {
      setTimeout(() => { throw e; });  // the other listeners still hear it
    }
  }
}
