// The timeline shown (home, or one of the user's lists): its order, state, drawing, inserting
// and removing posts, page reads.

import { api, session, userPath, withQuery } from "./api.js";
import { confirmDelete } from "./compose.js";
import { marker } from "./markers.js";
import { $, formatTime } from "./ui.js";

// Items are kept in timeline order, newest first: a post id starts with its creation ticks
// (16 hex digits), and ties go to the smaller id, as the storage's row keys order them. A
// repost sorts where it was reposted, which its item does not say: it gets the key of the
// item above it on its page ("~" sorts it just below that one), or now's ticks when it
// comes first or live.
const sortKey = (post) => post.sortKey || post.post_id;

export function newerFirst(a, b) {
  const ka = sortKey(a);
  const kb = sortKey(b);
  const ta = ka.slice(0, 16);
  const tb = kb.slice(0, 16);
  if (ta !== tb) return ta > tb ? -1 : 1;
  if (ka === kb) return 0;
  return ka < kb ? -1 : 1;
}

const DOTNET_EPOCH_MS = 62135596800000n;

export function nowKey() {
  return ((BigInt(Date.now()) + DOTNET_EPOCH_MS) * 10000n).toString(16).padStart(16, "0");
}

// Sort keys for a page's items, in page order; ``above`` is the key of what comes before.
// (A page read for the marker gets them too, so its reposts compare like the list's.)
export function keyPage(items, above = null) {
  let previous = above;
  for (const post of items) {
    const known = timeline.posts.get(post.post_id); // shown already: the same place
    if (post.reposted_by && !post.sortKey) {
      post.sortKey = known ? sortKey(known.post) : previous ? `${previous}~` : nowKey();
    }
    previous = sortKey(post);
  }
}

export function oldestKey() {
  let oldest = null;
  for (const entry of timeline.posts.values()) {
    if (!oldest || newerFirst(entry.post, oldest) > 0) oldest = entry.post;
  }
  return oldest ? sortKey(oldest) : null;
}

export const timeline = {
  listId: null, // the list whose timeline is shown (lists.js), or null: the home timeline
  posts: new Map(), // post_id -> {post, element}
  continuation: null,
  newest: null, // the position of the newest item read from a page or the stream ...
  newestPost: null, // ... and that item
  generation: 0, // bumped on sign-out/reload so late answers of an old session are dropped
  shown: 0, // counts insertions: a page read judges only what was shown before it began
};

// Other scripts (social.js) add to each post as it is drawn: actions, names, links.
export const decorators = [];

export function profileLink(link, userId) {
  link.href = `#/u/${encodeURIComponent(userId)}`;
  link.dataset.userId = userId;
}

export function renderPost(post, { fresh = false } = {}) {
  const element = $("post-template").content.firstElementChild.cloneNode(true);
  element.dataset.postId = post.post_id;
  element.dataset.author = post.author;
  element.querySelector(".avatar").textContent = (post.author[0] || "?").toUpperCase();
  element.querySelector(".post-author").textContent = `@${post.author}`;
  profileLink(element.querySelector(".post-author-link"), post.author);
  if (post.reposted_by) {
    element.dataset.repostedBy = post.reposted_by;
    const by = element.querySelector(".post-reposter");
    by.textContent = `@${post.reposted_by}`;
    profileLink(by, post.reposted_by);
    element.querySelector(".post-repost").hidden = false;
  }
  if (post.reply_to && typeof post.reply_to.author === "string") {
    const to = element.querySelector(".post-replied");
    to.textContent = `@${post.reply_to.author}`;
    profileLink(to, post.reply_to.author);
    element.querySelector(".post-reply-to").hidden = false;
  }
  const time = element.querySelector(".post-time");
  time.dateTime = post.created_at;
  time.title = new Date(post.created_at).toLocaleString();
  time.textContent = formatTime(post.created_at);
  element.querySelector(".post-text").textContent = post.text;
  element.dataset.visibility = post.visibility || "public";
  element.querySelector(".post-visibility").hidden = post.visibility !== "followers";
  const remove = element.querySelector(".post-delete");
  if (session && post.author === session.user_id) {
    remove.hidden = false;
    remove.addEventListener("click", () => confirmDelete(element, post));
  }
  decorators.forEach((decorate) => decorate(element, post));
  if (fresh) {
    element.classList.add("fresh");
    setTimeout(() => element.classList.remove("fresh"), 4000);
  }
  return element;
}

// Insert a post at its place (deduplicated by post id); returns whether it was new.
export function insertPost(post, options = {}) {
  if (!post || typeof post.post_id !== "string" || timeline.posts.has(post.post_id)) return false;
  const element = renderPost(post, options);
  let before = null;
  for (const entry of timeline.posts.values()) {
    if (newerFirst(post, entry.post) < 0 && (!before || newerFirst(entry.post, before.post) < 0)) {
      before = entry;
    }
  }
  $("timeline-list").insertBefore(element, before ? before.element : null);
  timeline.shown += 1;
  const local = Boolean(options.local); // composed here: a page may not hold it yet
  timeline.posts.set(post.post_id, { post, element, shown: timeline.shown, local });
  updateEmpty();
  return true;
}

// Below the oldest item shown while older pages are still to load: "Load more" brings it
// in its place. (A stream resumed from a position resends its recent window, which may
// reach further back than the first page.)
export function belowLoaded(post) {
  if (timeline.continuation === null) return false;
  let oldest = null;
  for (const entry of timeline.posts.values()) {
    if (!oldest || newerFirst(entry.post, oldest) > 0) oldest = entry.post;
  }
  return oldest !== null && newerFirst(post, oldest) > 0;
}

// Positions are opaque: whether one is newer is told by the posts they belong to.
export function advanceNewest(post, position) {
  if (!post || !position) return false;
  if (timeline.newestPost && newerFirst(post, timeline.newestPost) > 0) return false;
  timeline.newest = position;
  timeline.newestPost = post;
  return true;
}

export function removePost(postId) {
  for (const removed of readsInFlight) removed.add(postId);
  const entry = timeline.posts.get(postId);
  if (!entry) return;
  entry.element.remove();
  timeline.posts.delete(postId);
  updateEmpty();
}

// A ``delete`` event: the post left the timeline (deleted, or its author unfollowed).
export function removeStreamed(data) {
  let removed;
  try {
    removed = JSON.parse(data);
  } catch (_) {
    return;
  }
  if (removed && typeof removed.post_id === "string") removePost(removed.post_id);
}

// Items shown before a first page read began that the page should hold but does not:
// gone since (deleted, or unfollowed). The page covers everything newer than its oldest
// item, or everything when no older page follows.
export function goneFrom(page, before) {
  const read = new Set(page.items.map((post) => post.post_id));
  const oldest = page.items.length ? page.items[page.items.length - 1] : null;
  const gone = [];
  for (const [postId, entry] of timeline.posts) {
    if (read.has(postId)) entry.local = false;
    if (read.has(postId) || entry.shown > before || entry.local) continue;
    const covered = page.continuation === null || (oldest && newerFirst(entry.post, oldest) <= 0);
    if (covered) gone.push(postId);
  }
  return gone;
}

// An empty list says so (and what to do); "Load more" shows only below posts.
export function updateEmpty() {
  const empty = timeline.posts.size === 0;
  $("timeline-empty").hidden = !empty || $("timeline").hasAttribute("aria-busy");
  $("load-more").hidden = timeline.continuation === null || empty;
}

export function clearTimeline() {
  timeline.generation += 1;
  timeline.posts.clear();
  timeline.continuation = null;
  timeline.newest = null;
  timeline.newestPost = null;
  marker.position = null;
  marker.version = 0;
  $("timeline-list").replaceChildren();
  updateEmpty();
}

// A list's pages are the home timeline's, read from the list's path.
function timelinePath(params) {
  const path = timeline.listId
    ? userPath(session.user_id, "lists", timeline.listId, "timeline")
    : userPath(session.user_id, "timeline");
  return withQuery(path, params);
}

// The ids removed (a ``delete`` event, a delete here) while each page read is in flight:
// the page was read before, so it must not bring them back.
const readsInFlight = new Set();

// One page of the timeline; ``page.removed`` holds the ids removed while it was read.
export async function readPage(params) {
  const removed = new Set();
  readsInFlight.add(removed);
  try {
    const page = await api("GET", timelinePath(params));
    page.removed = removed;
    return page;
  } finally {
    readsInFlight.delete(removed);
  }
}

export function insertRead(page, post, options = {}) {
  return !page.removed.has(post.post_id) && insertPost(post, options);
}
