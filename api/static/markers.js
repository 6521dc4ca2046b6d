// The read marker (GET/PUT .../markers/home): "You were here", and moving it forward.

import { api, session, userPath } from "./api.js";
import { keyPage, newerFirst, readPage, timeline } from "./timeline.js";

// Where this user stopped reading, shared by its devices (GET/PUT .../markers/home): the
// first page shows a "You were here" line above the newest post read last time (the items
// newer than the marker, read with ``?since=``, are the ones above it), then the marker
// moves to this page's newest. Best effort: a marker that fails never hinders the list.
export const marker = { position: null, version: 0 };

function markerPath() {
  return userPath(session.user_id, "markers", "home");
}

export async function readMarker(page, generation) {
  try {
    const stored = await api("GET", markerPath());
    if (generation !== timeline.generation) return;
    Object.assign(marker, stored);
    if (stored.position && page.newest && stored.position !== page.newest) {
      const newer = await readPage({ since: stored.position });
      if (generation !== timeline.generation) return;
      keyPage(newer.items);
      if (newer.continuation === null) showWhereYouWere(page, newer);
      if (!passes(timeline.newestPost, newer)) return; // another device read further
    }
    await saveMarker(generation);
  } catch (_) {
    // best effort: the timeline works without the marker
  }
}

// The line goes inside the newest post not newer than the marker, so posts that arrive
// later take their places above or below it without splitting the two.
function showWhereYouWere(page, newer) {
  document.querySelectorAll("#timeline-list .you-were-here").forEach((line) => line.remove());
  const fresh = new Set(newer.items.map((post) => post.post_id));
  const seen = page.items.find((post) => !fresh.has(post.post_id));
  const entry = seen && timeline.posts.get(seen.post_id);
  if (!entry || !fresh.size) return;
  const line = document.createElement("div");
  line.className = "you-were-here";
  line.id = "you-were-here";
  line.textContent = "You were here";
  entry.element.prepend(line);
}

// Move the marker to the newest position read; a 409 means another device moved it since:
// read it again and write once more from its version, unless it is past this position
// (then it stays: the marker never moves back on a conflict).
export async function saveMarker(generation) {
  const position = timeline.newest;
  const post = timeline.newestPost;
  if (!position || position === marker.position) return;
  for (let attempt = 0; attempt < 2; attempt += 1) {
    try {
      const saved = await api("PUT", markerPath(), { body: { position, version: marker.version } });
      if (generation === timeline.generation) Object.assign(marker, saved);
      return;
    } catch (error) {
      if (error.status !== 409 || generation !== timeline.generation) return;
      Object.assign(marker, await api("GET", markerPath()));
      if (marker.position === position) return;
      if (marker.position) {
        const newer = await readPage({ since: marker.position });
        keyPage(newer.items);
        if (generation !== timeline.generation || !passes(post, newer)) return;
      }
    }
  }
}

// Whether ``post`` is newer than the marker a ``?since=<marker>`` page was read from: it
// is as new as one of that page's items (all newer than the marker). Unsure (the page
// holds only newer ones, and more follow) counts as no, so a marker never moves back.
function passes(post, newer) {
  return Boolean(post) && newer.items.some((item) => newerFirst(post, item) <= 0);
}
