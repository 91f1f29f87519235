/* Rendering the live state at most once a frame: a change marks the parts it
 * touched (schedule), the next animation frame draws them in the order they
 * were registered. "all" is every part (a snapshot). */

const parts = [];       // [{name, draw, also}] in drawing order
const dirty = new Set();
let frame = null;

/** *draw(all)* redraws part *name*; it is also drawn when any of *also* is. */
export function register(name, draw, also) {
  parts.push({ name, draw, also: also || [] });
}

export function schedule(...names) {
  for (const name of names) dirty.add(name);
  if (frame === null) frame = requestAnimationFrame(render);
}

function render() {
  frame = null;
  const all = dirty.has("all");
  for (const part of parts) {
    if (all || dirty.has(part.name) || part.also.some((name) => dirty.has(name))) {
      try {
        part.draw(all);
      } catch (e) {
        // Thrown again on its own: the other parts still draw, and the error is seen.
        setTimeout(() => { throw e; });
      }
    }
  }
  dirty.clear();
}
