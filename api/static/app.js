// The timeline web client: plain JavaScript, no build step, nothing loaded from elsewhere.
// Talks to the REST API of the same origin; the session (user id + bearer token) is kept in
// localStorage so a reload stays signed in.
"use strict";

(() => {
  const STORAGE_KEY = "timeline.session";
  const MAX_POST_CHARS = 280;
  const STREAM_IDLE_MS = 45000; // three missed heartbeats (sent every ~15 s): reconnect ...
  const STREAM_IDLE_MAX_MS = 600000; // ... doubled after each silent connection, up to this
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, code, message, retryAfter) {
      super(message);
      this.status = status;
      this.code = code;
      this.retryAfter = retryAfter;
    }
  }

  let session = loadSession();

  function loadSession() {
    try {
      const stored = JSON.parse(localStorage.getItem(STORAGE_KEY) || "null");
      if (stored && typeof stored.user_id === "string" && typeof stored.token === "string") {
        return stored;
      }
    } catch (_) {
      // a damaged entry is the same as none
    }
    return null;
  }

  function saveSession(value) {
    session = value;
    if (value) localStorage.setItem(STORAGE_KEY, JSON.stringify(value));
    else localStorage.removeItem(STORAGE_KEY);
  }

  function userPath(userId, ...rest) {
    return ["/users", userId, ...rest].map((part, i) => (i ? encodeURIComponent(part) : part)).join("/");
  }

  function withQuery(path, params) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== null && value !== undefined) query.set(name, value);
    }
    const text = query.toString();
    return text ? `${path}?${text}` : path;
  }

  // The API's error body is {"error": {"code", "message"}}; anything else (a proxy's page, a
  // lost connection) becomes an ApiError too, so every caller shows one kind of message.
  async function errorFrom(response) {
    let body = null;
    try {
      body = JSON.parse(await response.text());
    } catch (_) {
      body = null;
    }
    const error = body && typeof body === "object" ? body.error : null;
    const code = error && typeof error.code === "string" ? error.code : `http_${response.status}`;
    const message =
      error && typeof error.message === "string"
        ? error.message
        : `the server answered ${response.status} ${response.statusText}`.trim();
    return new ApiError(response.status, code, message, response.headers.get("Retry-After"));
  }

  async function api(method, path, { body, auth = true, token, headers: extra } = {}) {
    const headers = { Accept: "application/json", ...(extra || {}) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const bearer = token || (auth && session ? session.token : null);
    if (bearer) headers.Authorization = `Bearer ${bearer}`;
    let response;
    try {
      response = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (error) {
      throw new ApiError(0, "network_error", "cannot reach the server; check your connection");
    }
    if (!response.ok) throw await errorFrom(response);
    if (response.status === 204) return null;
    try {
      return await response.json();
    } catch (_) {
      throw new ApiError(response.status, "bad_response", "the server sent something that is not JSON");
    }
  }

  function randomKey() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // ---------------------------------------------------------------- messages

  const messageTimers = new Map();

  function showMessage(id, text, kind = "info", { sticky = false } = {}) {
    const element = $(id);
    clearTimeout(messageTimers.get(id));
    element.textContent = text;
    element.dataset.kind = kind;
    element.hidden = false;
    if (!sticky && kind !== "error") {
      messageTimers.set(id, setTimeout(() => clearMessage(id), 4000));
    }
  }

  function clearMessage(id) {
    const element = $(id);
    clearTimeout(messageTimers.get(id));
    element.hidden = true;
    element.textContent = "";
    delete element.dataset.kind;
  }

  function describe(error) {
    if (!(error instanceof ApiError)) return String(error && error.message ? error.message : error);
    let text = error.message;
    if (!/[.!?]$/.test(text)) text += ".";
    if (error.retryAfter && /^\d+$/.test(error.retryAfter)) {
      text += ` Try again in ${error.retryAfter} s.`;
    }
    if (error.status === 401 && session) text += " Sign out and sign in again with a valid token.";
    return error.status ? `${text} (${error.code})` : text;
  }

  function showError(id, error) {
    showMessage(id, describe(error), "error");
  }

  // A form's buttons are disabled while its request runs, so a double click sends one request.
  async function busy(form, action) {
    const controls = form.querySelectorAll("button, input, textarea");
    const buttons = Array.from(controls).filter((c) => c.tagName === "BUTTON");
    buttons.forEach((b) => (b.disabled = true));
    form.setAttribute("aria-busy", "true");
    try {
      return await action();
    } finally {
      buttons.forEach((b) => (b.disabled = false));
      form.removeAttribute("aria-busy");
    }
  }

  // ---------------------------------------------------------------- time

  function formatTime(iso) {
    const when = new Date(iso);
    if (Number.isNaN(when.getTime())) return iso;
    const seconds = Math.round((Date.now() - when.getTime()) / 1000);
    if (seconds < 45) return "just now";
    if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
    return when.toLocaleString(undefined, {
      year: "numeric",
      month: "short",
      day: "numeric",
      hour: "2-digit",
      minute: "2-digit",
    });
  }

  // ---------------------------------------------------------------- timeline

  // Items are kept in timeline order, newest first: a post id starts with its creation ticks
  // (16 hex digits), and ties go to the smaller id, as the storage's row keys order them. A
  // repost sorts where it was reposted, which its item does not say: it gets the key of the
  // item above it on its page ("~" sorts it just below that one), or now's ticks when it
  // comes first or live.
  const sortKey = (post) => post.sortKey || post.post_id;

  function newerFirst(a, b) {
    const ka = sortKey(a);
    const kb = sortKey(b);
    const ta = ka.slice(0, 16);
    const tb = kb.slice(0, 16);
    if (ta !== tb) return ta > tb ? -1 : 1;
    if (ka === kb) return 0;
    return ka < kb ? -1 : 1;
  }

  const DOTNET_EPOCH_MS = 62135596800000n;

  function nowKey() {
    return ((BigInt(Date.now()) + DOTNET_EPOCH_MS) * 10000n).toString(16).padStart(16, "0");
  }

  // Sort keys for a page's items, in page order; ``above`` is the key of what comes before.
  // (A page read for the marker gets them too, so its reposts compare like the list's.)
  function keyPage(items, above = null) {
    let previous = above;
    for (const post of items) {
      const known = timeline.posts.get(post.post_id); // shown already: the same place
      if (post.reposted_by && !post.sortKey) {
        post.sortKey = known ? sortKey(known.post) : previous ? `${previous}~` : nowKey();
      }
      previous = sortKey(post);
    }
  }

  function oldestKey() {
    let oldest = null;
    for (const entry of timeline.posts.values()) {
      if (!oldest || newerFirst(entry.post, oldest) > 0) oldest = entry.post;
    }
    return oldest ? sortKey(oldest) : null;
  }

  const timeline = {
    posts: new Map(), // post_id -> {post, element}
    continuation: null,
    newest: null, // the position of the newest item read from a page or the stream ...
    newestPost: null, // ... and that item
    generation: 0, // bumped on sign-out/reload so late answers of an old session are dropped
    shown: 0, // counts insertions: a page read judges only what was shown before it began
  };

  // Other scripts (social.js) add to each post as it is drawn: actions, names, links.
  const decorators = [];

  function profileLink(link, userId) {
    link.href = `#/u/${encodeURIComponent(userId)}`;
    link.dataset.userId = userId;
  }

  function renderPost(post, { fresh = false } = {}) {
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
  function insertPost(post, options = {}) {
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
  function belowLoaded(post) {
    if (timeline.continuation === null) return false;
    let oldest = null;
    for (const entry of timeline.posts.values()) {
      if (!oldest || newerFirst(entry.post, oldest) > 0) oldest = entry.post;
    }
    return oldest !== null && newerFirst(post, oldest) > 0;
  }

  // Positions are opaque: whether one is newer is told by the posts they belong to.
  function advanceNewest(post, position) {
    if (!post || !position) return false;
    if (timeline.newestPost && newerFirst(post, timeline.newestPost) > 0) return false;
    timeline.newest = position;
    timeline.newestPost = post;
    return true;
  }

  function removePost(postId) {
    for (const removed of readsInFlight) removed.add(postId);
    const entry = timeline.posts.get(postId);
    if (!entry) return;
    entry.element.remove();
    timeline.posts.delete(postId);
    updateEmpty();
  }

  // A ``delete`` event: the post left the timeline (deleted, or its author unfollowed).
  function removeStreamed(data) {
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
  function goneFrom(page, before) {
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
  function updateEmpty() {
    const empty = timeline.posts.size === 0;
    $("timeline-empty").hidden = !empty || $("timeline").hasAttribute("aria-busy");
    $("load-more").hidden = timeline.continuation === null || empty;
  }

  function clearTimeline() {
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

  function timelinePath(params) {
    return withQuery(userPath(session.user_id, "timeline"), params);
  }

  // The ids removed (a ``delete`` event, a delete here) while each page read is in flight:
  // the page was read before, so it must not bring them back.
  const readsInFlight = new Set();

  // One page of the timeline; ``page.removed`` holds the ids removed while it was read.
  async function readPage(params) {
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

  function insertRead(page, post, options = {}) {
    return !page.removed.has(post.post_id) && insertPost(post, options);
  }

  // The first page: the list starts over, and the live stream starts after its newest item.
  async function loadTimeline() {
    clearTimeline();
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
      live.start();
      readMarker(page, generation);
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

  // ---------------------------------------------------------------- read marker

  // Where this user stopped reading, shared by its devices (GET/PUT .../markers/home): the
  // first page shows a "You were here" line above the newest post read last time (the items
  // newer than the marker, read with ``?since=``, are the ones above it), then the marker
  // moves to this page's newest. Best effort: a marker that fails never hinders the list.
  const marker = { position: null, version: 0 };

  function markerPath() {
    return userPath(session.user_id, "markers", "home");
  }

  async function readMarker(page, generation) {
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
  async function saveMarker(generation) {
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

  async function loadMore() {
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
  async function mergeFirstPage() {
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

  // "Refresh": the newer items (``?since=``, page by page), then the first page merged in
  // for items that landed late below the newest one shown.
  async function refresh() {
    const added = await refreshNewer({ quiet: true });
    const late = await mergeFirstPage();
    showMessage("timeline-message", added + late ? `${added + late} new` : "Up to date.");
    saveMarker(timeline.generation).catch(() => {});
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

  // "Delete" asks first, in the post itself: "Delete this post?" with Delete and Cancel.
  function confirmDelete(element, post) {
    const ask = element.querySelector(".post-confirm");
    const remove = element.querySelector(".post-delete");
    ask.hidden = false;
    remove.hidden = true;
    const yes = ask.querySelector(".post-confirm-delete");
    const no = ask.querySelector(".post-confirm-cancel");
    const close = () => {
      ask.hidden = true;
      remove.hidden = false;
    };
    yes.onclick = () => deletePost(post, yes).then((done) => done || close());
    no.onclick = close;
    yes.focus();
  }

  async function deletePost(post, button) {
    button.disabled = true;
    try {
      await api("DELETE", userPath(session.user_id, "posts", post.post_id));
      removePost(post.post_id);
      document.querySelectorAll(`li[data-post-id="${post.post_id}"]`).forEach((li) => li.remove());
      showMessage("timeline-message", "Post deleted.", "ok");
      loadProfile();
      return true;
    } catch (error) {
      if (error.status === 404) removePost(post.post_id);
      showError("timeline-message", error);
      button.disabled = false;
      return false;
    }
  }

  // ---------------------------------------------------------------- live updates (SSE)

  // A Server-Sent Events parser (the WHATWG rules): lines end in CR, LF or CRLF; a blank
  // line dispatches the event; lines starting with ':' are comments (heartbeats).
  class SseParser {
    constructor(onEvent) {
      this.onEvent = onEvent;
      this.buffer = "";
      this.data = [];
      this.type = "";
      this.lastId = null;
    }

    push(text) {
      this.buffer += text;
      let start = 0;
      const breaks = /\r\n|\r|\n/g;
      for (;;) {
        breaks.lastIndex = start;
        const found = breaks.exec(this.buffer);
        if (!found) break;
        // a CR at the very end may be the first half of a CRLF still on its way
        if (found[0] === "\r" && found.index === this.buffer.length - 1) break;
        this.line(this.buffer.slice(start, found.index));
        start = found.index + found[0].length;
      }
      this.buffer = this.buffer.slice(start);
    }

    line(line) {
      if (line === "") return this.dispatch();
      if (line.startsWith(":")) return undefined;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") this.type = value;
      else if (field === "data") this.data.push(value);
      else if (field === "id" && !value.includes("\0")) this.lastId = value;
      return undefined;
    }

    dispatch() {
      const data = this.data;
      const type = this.type || "message";
      this.data = [];
      this.type = "";
      if (data.length) this.onEvent({ type, data: data.join("\n"), id: this.lastId });
    }
  }

  const live = {
    controller: null,
    lastEventId: null,
    running: false,
    idleMs: STREAM_IDLE_MS,

    setState(state, text, title) {
      const pill = $("live-status");
      pill.dataset.state = state;
      pill.textContent = text;
      pill.title = title || text;
    },

    start() {
      this.stop();
      this.running = true;
      this.lastEventId = null;
      this.run(timeline.generation);
    },

    stop() {
      this.running = false;
      if (this.controller) this.controller.abort();
      this.controller = null;
      this.setState("off", "offline");
    },

    async run(generation) {
      let backoff = BACKOFF_MIN_MS;
      const current = () => this.running && generation === timeline.generation;
      while (current()) {
        const controller = new AbortController();
        this.controller = controller;
        let wait = backoff;
        try {
          this.setState("connecting", "connecting…");
          const headers = { Accept: "text/event-stream", Authorization: `Bearer ${session.token}` };
          let path = userPath(session.user_id, "timeline", "stream");
          if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
          else if (timeline.newest) path = withQuery(path, { since: timeline.newest });
          const response = await fetch(path, { headers, signal: controller.signal, cache: "no-store" });
          if (!response.ok) {
            const error = await errorFrom(response);
            if (error.status === 404 || error.status === 405) {
              this.setState("off", "no live updates", "this server has no timeline stream; use Refresh");
              return;
            }
            if (error.status === 401 || error.status === 403) {
              this.setState("error", "live updates off", describe(error));
              showError("timeline-message", error);
              return;
            }
            if (error.retryAfter && /^\d+$/.test(error.retryAfter)) {
              wait = Math.max(wait, Number(error.retryAfter) * 1000);
            }
            this.setState("waiting", "reconnecting…", describe(error));
          } else {
            this.setState("live", "live", "new posts appear as they arrive");
            mergeFirstPage(); // what landed between the page read and this connection
            backoff = BACKOFF_MIN_MS;
            wait = backoff;
            await this.consume(response, controller, generation);
            if (current()) this.setState("waiting", "reconnecting…");
          }
        } catch (error) {
          if (!current()) return;
          this.setState("waiting", "reconnecting…", "the live connection was lost");
        }
        if (!current()) return;
        await sleep(wait / 2 + Math.random() * (wait / 2));
        backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
      }
    },

    async consume(response, controller, generation) {
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let idle = null;
      const alive = () => {
        clearTimeout(idle);
        idle = setTimeout(() => {
          // silent for too long: a dead connection, or a server with rarer heartbeats
          this.idleMs = Math.min(this.idleMs * 2, STREAM_IDLE_MAX_MS);
          controller.abort();
        }, this.idleMs);
      };
      const parser = new SseParser((event) => {
        if (generation !== timeline.generation) return;
        if (event.type === "delete") return removeStreamed(event.data);
        if (event.type !== "post") return;
        let post;
        try {
          post = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        if (!post || typeof post.post_id !== "string") return;
        if (post.reposted_by) post.sortKey = nowKey(); // reposted just now
        if (!belowLoaded(post)) insertPost(post, { fresh: true });
        // resume from the newest entry seen (a late entry's id is an older position)
        if (advanceNewest(post, event.id)) this.lastEventId = event.id;
      });
      alive();
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          alive();
          parser.push(decoder.decode(value, { stream: true }));
        }
      } finally {
        clearTimeout(idle);
      }
    },
  };

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  // ---------------------------------------------------------------- profile and following

  async function loadProfile() {
    if (!session) return;
    const userId = session.user_id;
    try {
      const profile = await api("GET", userPath(userId), { auth: false });
      if (!session || session.user_id !== userId) return;
      $("profile-display-name").textContent =
        profile.display_name && profile.display_name !== userId ? profile.display_name : "";
      const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;
      $("profile-counts").textContent = [
        count(profile.posts, "post", "posts"),
        count(profile.followers, "follower", "followers"),
        `${profile.following} following`,
      ].join(" · ");
    } catch (error) {
      $("profile-counts").textContent = describe(error);
    }
  }

  async function loadFollowing() {
    if (!session) return;
    const userId = session.user_id;
    try {
      const page = await api("GET", userPath(userId, "following"), { auth: false });
      if (!session || session.user_id !== userId) return;
      const list = $("following-list");
      list.replaceChildren(
        ...page.items.map((edge) => {
          const item = document.createElement("li");
          item.dataset.userId = edge.user_id;
          const name = document.createElement("a");
          name.textContent = `@${edge.user_id}`;
          profileLink(name, edge.user_id);
          const button = document.createElement("button");
          button.type = "button";
          button.className = "secondary small";
          button.textContent = "Unfollow";
          button.addEventListener("click", () => unfollow(edge.user_id, button));
          item.append(name, button);
          return item;
        }),
      );
      if (page.continuation) {
        const more = document.createElement("li");
        more.className = "muted small";
        more.textContent = "…and more";
        list.append(more);
      }
      $("following-empty").hidden = page.items.length > 0;
    } catch (error) {
      showError("follow-message", error);
    }
  }

  async function follow(target) {
    await api("PUT", userPath(session.user_id, "following", target));
    showMessage("follow-message", `Following @${target}. Their recent posts will appear shortly.`, "ok");
    $("follow-target").value = "";
    loadFollowing();
    loadProfile();
    // the backfill of their recent posts is asynchronous: look for it twice
    const generation = timeline.generation;
    for (const delay of [1500, 5000]) {
      setTimeout(() => {
        if (session && generation === timeline.generation) mergeFirstPage();
      }, delay);
    }
  }

  async function unfollow(target, button) {
    if (button) button.disabled = true;
    try {
      await api("DELETE", userPath(session.user_id, "following", target));
      for (const entry of Array.from(timeline.posts.values())) {
        if (entry.post.author === target) removePost(entry.post.post_id);
      }
      showMessage("follow-message", `Unfollowed @${target}.`, "ok");
      loadFollowing();
      loadProfile();
      return true;
    } catch (error) {
      showError("follow-message", error);
      if (button) button.disabled = false;
      return false;
    }
  }

  // ---------------------------------------------------------------- session views

  function showSignedIn() {
    $("whoami").hidden = false;
    $("current-user").textContent = `@${session.user_id}`;
    $("profile-user-id").textContent = `@${session.user_id}`;
    $("profile-display-name").textContent = "";
    $("profile-counts").textContent = "…";
    $("current-token").value = session.token;
    $("current-token").type = "password";
    $("toggle-token").textContent = "Show";
    $("signed-out").hidden = true;
    $("signed-in").hidden = false;
    for (const id of ["follow", "compose", "timeline"]) $(id).hidden = false;
    $("welcome").hidden = true;
    document.title = `@${session.user_id} · Timeline`;
    $("current-user").href = `#/u/${encodeURIComponent(session.user_id)}`;
    sessionHooks.forEach((hook) => hook(session));
    loadProfile();
    loadFollowing();
    loadTimeline();
  }

  function showSignedOut() {
    live.stop();
    clearTimeline();
    $("whoami").hidden = true;
    $("signed-out").hidden = false;
    $("signed-in").hidden = true;
    for (const id of ["follow", "compose", "timeline"]) $(id).hidden = true;
    $("welcome").hidden = false;
    $("following-list").replaceChildren();
    for (const id of ["follow-message", "compose-message", "timeline-message"]) clearMessage(id);
    document.title = "Timeline";
    sessionHooks.forEach((hook) => hook(null));
  }

  // ---------------------------------------------------------------- wiring

  function updateCount() {
    const used = Array.from($("compose-text").value.trim()).length;
    const left = MAX_POST_CHARS - used;
    const count = $("compose-count");
    count.textContent = String(left);
    count.classList.toggle("over", left < 0);
    count.title = left < 0 ? `${-left} over the ${MAX_POST_CHARS}-character limit` : "";
    $("compose-submit").disabled = left < 0 || used === 0;
  }

  function wire() {
    $("register-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget;
      const userId = $("register-user-id").value.trim();
      const displayName = $("register-display-name").value.trim();
      const body = { user_id: userId };
      if (displayName) body.display_name = displayName;
      busy(form, async () => {
        try {
          const user = await api("POST", "/users", {
            body,
            auth: false,
            headers: { "Idempotency-Key": randomKey() },
          });
          saveSession({ user_id: user.user_id, token: user.token });
          form.reset();
          showMessage("account-message", `Welcome, @${user.user_id}!`, "ok");
          showSignedIn();
        } catch (error) {
          showError("account-message", error);
        }
      });
    });

    $("token-value").addEventListener("input", () => {
      // a token starts with its user id ("<user>.<expiry>.<key id>.<epoch>.<id>.<signature>")
      const token = $("token-value").value.trim();
      const guess = token.split(".")[0];
      if (token.includes(".") && /^[A-Za-z0-9_-]{1,64}$/.test(guess)) $("token-user-id").value = guess;
    });

    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget;
      const token = $("token-value").value.trim();
      const userId = $("token-user-id").value.trim();
      if (!token) {
        showMessage("account-message", "Paste a token first.", "error");
        return;
      }
      if (!userId) {
        showMessage("account-message", "Enter the user id the token belongs to.", "error");
        return;
      }
      busy(form, async () => {
        try {
          // reading one item of the home timeline proves the token is this user's
          await api("GET", withQuery(userPath(userId, "timeline"), { limit: 1 }), { token });
          saveSession({ user_id: userId, token });
          form.reset();
          showMessage("account-message", `Signed in as @${userId}.`, "ok");
          showSignedIn();
        } catch (error) {
          showError("account-message", error);
        }
      });
    });

    $("sign-out").addEventListener("click", async () => {
      // revoke the token, so a copy left behind (another tab, a log) stops working too;
      // signed out here whatever the answer (an already invalid token cannot be revoked)
      const ending = session;
      saveSession(null);
      showSignedOut();
      try {
        await api("DELETE", userPath(ending.user_id, "tokens", "current"), { token: ending.token });
        showMessage("account-message", "Signed out; the token is revoked.", "ok");
      } catch (error) {
        if (error.status === 401) showMessage("account-message", "Signed out.", "ok");
        else showError("account-message", error);
      }
    });

    $("toggle-token").addEventListener("click", () => {
      const input = $("current-token");
      const hidden = input.type === "password";
      input.type = hidden ? "text" : "password";
      $("toggle-token").textContent = hidden ? "Hide" : "Show";
    });

    $("copy-token").addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(session.token);
        showMessage("account-message", "Token copied.", "ok");
      } catch (_) {
        const input = $("current-token");
        input.type = "text";
        input.select();
        $("toggle-token").textContent = "Hide";
        showMessage("account-message", "Copy the selected token with Ctrl+C.", "info");
      }
    });

    $("compose-text").addEventListener("input", updateCount);
    $("compose-text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        $("compose-form").requestSubmit();
      }
    });
    $("compose-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget;
      const text = $("compose-text").value;
      busy(form, async () => {
        try {
          const post = await api("POST", userPath(session.user_id, "posts"), {
            body: { text },
            headers: { "Idempotency-Key": randomKey() },
          });
          $("compose-text").value = "";
          updateCount();
          insertPost(post, { fresh: true, local: true });
          showMessage("compose-message", "Posted.", "ok");
          loadProfile();
        } catch (error) {
          showError("compose-message", error);
        }
      }).then(updateCount);
    });

    $("follow-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const form = event.currentTarget;
      const target = $("follow-target").value.trim();
      if (!target) {
        showMessage("follow-message", "Enter the user id to follow.", "error");
        return;
      }
      busy(form, async () => {
        try {
          await follow(target);
        } catch (error) {
          showError("follow-message", error);
        }
      });
    });

    $("unfollow-submit").addEventListener("click", () => {
      const target = $("follow-target").value.trim();
      if (!target) {
        showMessage("follow-message", "Enter the user id to unfollow.", "error");
        return;
      }
      busy($("follow-form"), async () => {
        if (await unfollow(target)) $("follow-target").value = "";
      });
    });

    $("load-more").addEventListener("click", loadMore);
    $("refresh").addEventListener("click", () => refresh());

    // relative times ("3 min ago") stay true
    setInterval(() => {
      for (const { post, element } of timeline.posts.values()) {
        element.querySelector(".post-time").textContent = formatTime(post.created_at);
      }
    }, 30000);

    // another tab signed in or out: follow it
    window.addEventListener("storage", (event) => {
      if (event.key !== STORAGE_KEY) return;
      session = loadSession();
      if (session) showSignedIn();
      else showSignedOut();
    });
  }

  // for the end-to-end tests: the SSE parser, and a way to drop the live connection
  window.timelineClient = Object.freeze({
    SseParser,
    dropLiveConnection: () => live.controller && live.controller.abort(),
    stopLiveUpdates: () => live.stop(),
  });

  // What social.js and profile.js build on (loaded after this script, before the page's
  // DOMContentLoaded, when the client starts).
  const sessionHooks = [];
  window.timelineCore = Object.freeze({
    MAX_POST_CHARS,
    api,
    userPath,
    withQuery,
    randomKey,
    describe,
    showMessage,
    showError,
    clearMessage,
    busy,
    formatTime,
    renderPost,
    profileLink,
    removePost,
    insertPost,
    mergeFirstPage,
    follow,
    unfollow,
    loadFollowing,
    loadProfile,
    session: () => session,
    shownPosts: () => Array.from(timeline.posts.values(), (entry) => entry.post),
    decorate: (decorator) => decorators.push(decorator),
    onSession: (hook) => sessionHooks.push(hook),
  });

  function start() {
    wire();
    updateCount();
    if (session) showSignedIn();
    else showSignedOut();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
