/* DOM helpers: every piece of data reaches the page through textContent or
 * setAttribute, never as HTML. */

export const $ = (id) => document.getElementById(id);

/** An element: attrs set with setAttribute (or as a property for `text`,
 *  `hidden`, `disabled`, `on*`), children as nodes or text. Never HTML. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "hidden" || key === "disabled") node[key] = Boolean(value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function setText(node, text) {
  text = String(text);
  if (node.textContent !== text) node.textContent = text;
}

/** A result line's words and kind (ok | bad | warn | info | ""), one call. */
export function say(node, kind, text) {
  node.dataset.kind = kind || "";
  setText(node, text || "");
}

/** Keep *container*'s children one element per item, in order: an item's
 *  element is built again only when its signature changed, so rows that did
 *  not change keep their focus and their buttons stay clickable. */
export function reconcile(container, cache, items, keyOf, sigOf, build) {
  const seen = new Set();
  let previous = null;
  for (const item of items) {
    const key = keyOf(item);
    seen.add(key);
    const sig = sigOf(item);
    let entry = cache.get(key);
    if (!entry) {
      entry = { el: build(item), sig };
      cache.set(key, entry);
    } else if (entry.sig !== sig) {
      const fresh = build(item);
      if (entry.el.parentNode) entry.el.replaceWith(fresh);
      entry.el = fresh;
      entry.sig = sig;
    }
    const wanted = previous ? previous.nextSibling : container.firstChild;
    if (wanted !== entry.el) container.insertBefore(entry.el, wanted);
    previous = entry.el;
  }
  for (const [key, entry] of cache) {
    if (!seen.has(key)) {
      entry.el.remove();
      cache.delete(key);
    }
  }
}

/** A coloured state label. kind: ok | warn | bad | unknown | info. */
export function pill(kind, text, title) {
  return el("span", { class: `pill ${kind}`, title: title || null, "data-kind": kind }, text);
}

/** A definition list and the function that adds a term and its value. */
export function factList() {
  const facts = el("dl", { class: "facts" });
  const fact = (term, ...value) => facts.append(el("dt", {}, term), el("dd", {}, ...value));
  return { facts, fact };
}
