// Reading the timeline page by page: the first page, "Load more", merges and "Refresh".

import { readMarker, saveMarker } from "./markers.js";
import { live } from "./stream.js";
import {
  advanceNewest,
  belowLoaded,
  clearTimeline,
  goneFrom,
  insertRead,
  keyPage,
  oldestKey,
  readPage,
  removePost,
  timeline,
  updateEmpty,
} from "./timeline.js";
import { $, clearMessage, formatTime, showError, showMessage } from "./ui.js";

// The first page: the list starts over, and the live stream starts after its newest item
// (the home timeline's: a list has no stream and no read marker, "Refresh" brings its news).
export async function loadTimeline() {
  clearTimeline();
  if (timeline.listId) live.stop();
  const generation = timeline.generation;
  clearMessage("timeline-message");
  $("timeline").setAttribute("aria-busy", "true");
  try {
    const page = await readPage({});
    if (generation !== timeline.generation) return;
    keyPage(page.items);
    page.items.forEach((post) => insertRead(page, post));
    timeline.continuation = page.continuation;
    advanceNewest(page.items[0], page.newest);
    if (!timeline.listId) {
      live.start();
      readMarker(page, generation);
    }
    // a page that showed nothing but has more: look further now, not behind "Load more"
    for (let pages = 0; pages < 5 && !timeline.posts.size && timeline.continuation; pages += 1) {
      await loadMore();
    }
  } catch (error) {
    if (generation === timeline.generation) showError("timeline-message", error);
  } finally {
    $("timeline").removeAttribute("aria-busy");
    updateEmpty();
  }
}

export async function loadMore() {
  const button = $("load-more");
  if (timeline.continuation === null) return;
  const generation = timeline.generation;
  button.disabled = true;
  button.textContent = "Loading…";
  try {
    const page = await readPage({ continuation: timeline.continuation });
    if (generation !== timeline.generation) return;
    keyPage(page.items, oldestKey());
    page.items.forEach((post) => insertRead(page, post));
    timeline.continuation = page.continuation;
    if (!timeline.newest) advanceNewest(page.items[0], page.newest);
    updateEmpty();
  } catch (error) {
    if (generation === timeline.generation) showError("timeline-message", error);
  } finally {
    button.disabled = false;
    button.textContent = "Load more";
  }
}

// The first page merged into the list: what landed below the newest item shown (a follow's
// backfill, or a post that landed while the stream was connecting) shows in its place,
// and what the page no longer holds (a post deleted, or purged by an unfollow, while the
// list was shown) goes away. Used after a follow, when the stream connects, and by
// "Refresh".
export async function mergeFirstPage() {
  const generation = timeline.generation;
  const before = timeline.shown;
  try {
    const page = await readPage({});
    if (generation !== timeline.generation) return 0;
    keyPage(page.items);
    let added = 0;
    goneFrom(page, before).forEach(removePost);
    page.items.forEach((post) => {
      if (!belowLoaded(post) && insertRead(page, post, { fresh: true })) added += 1;
    });
    // everything was loaded: now older pages may have appeared below the first
    if (timeline.continuation === null) timeline.continuation = page.continuation;
    advanceNewest(page.items[0], page.newest);
    updateEmpty();
    return added;
  } catch (error) {
    if (generation === timeline.generation) showError("timeline-message", error);
    return 0;
  }
}

// A follow's (or a list member's) backfill of their recent posts is asynchronous: the first
// page is merged in twice, later.
export function mergeBackfill() {
  const generation = timeline.generation;
  for (const delay of [1500, 5000]) {
    setTimeout(() => {
      if (generation === timeline.generation) mergeFirstPage();
    }, delay);
  }
}

// "Refresh": the newer items (``?since=``, page by page), then the first page merged in
// for items that landed late below the newest one shown.
export async function refresh() {
  const added = await refreshNewer({ quiet: true });
  const late = await mergeFirstPage();
  showMessage("timeline-message", added + late ? `${added + late} new` : "Up to date.");
  if (!timeline.listId) saveMarker(timeline.generation).catch(() => {});
}

// Newer items than the newest one shown (``?since=``), page by page; without a position
// yet, the first page is merged in.
async function refreshNewer({ quiet = false } = {}) {
  const generation = timeline.generation;
  let continuation = null;
  let added = 0;
  const since = timeline.newest; // repeated on every page of this read, as the API asks
  try {
    for (let pages = 0; pages < 10; pages += 1) {
      const page = await readPage({ since, continuation });
      if (generation !== timeline.generation) return 0;
      keyPage(page.items);
      let fromPage = 0;
      page.items.forEach((post) => {
        if (insertRead(page, post, { fresh: true })) fromPage += 1;
      });
      added += fromPage;
      if (pages === 0) advanceNewest(page.items[0], page.newest);
      continuation = page.continuation;
      if (!continuation || !since || (page.items.length && !fromPage)) break;
    }
    if (!quiet) showMessage("timeline-message", added ? `${added} new` : "Up to date.");
  } catch (error) {
    if (generation === timeline.generation) showError("timeline-message", error);
  }
  return added;
}

// "Load more", "Refresh", and relative times that stay true.
export function wirePaging() {
  $("load-more").addEventListener("click", loadMore);
  $("refresh").addEventListener("click", () => refresh());

  // relative times ("3 min ago") stay true
  setInterval(() => {
    for (const { post, element } of timeline.posts.values()) {
      element.querySelector(".post-time").textContent = formatTime(post.created_at);
    }
  }, 30000);
}
