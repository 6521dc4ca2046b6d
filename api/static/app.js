// Start-up: the client's entry module; wires the page, exposes window.timelineCore, starts.

// The timeline web client: plain JavaScript modules, no build step, nothing loaded from
// elsewhere; it talks to the REST API of the same origin.

import { api, randomKey, session, userPath, withQuery } from "./api.js";
import {
  followOtherTabs,
  loadProfile,
  profileHooks,
  sessionHooks,
  showSignedIn,
  showSignedOut,
  wireAccount,
} from "./account.js";
import { MAX_POST_CHARS, updateCount, wireCompose } from "./compose.js";
import {
  follow,
  loadFollowing,
  noteRequest,
  requested,
  unfollow,
  wireFollowing,
} from "./following.js";
import { wireLists } from "./lists.js";
import { mergeFirstPage, wirePaging } from "./paging.js";
import { wireSettings } from "./settings.js";
import { SseParser, live } from "./stream.js";
import {
  decorators,
  insertPost,
  profileLink,
  removePost,
  renderPost,
  timeline,
} from "./timeline.js";
import { busy, clearMessage, describe, formatTime, showError, showMessage } from "./ui.js";

// for the end-to-end tests: the SSE parser, and a way to drop the live connection
window.timelineClient = Object.freeze({
  SseParser,
  dropLiveConnection: () => live.controller && live.controller.abort(),
  stopLiveUpdates: () => live.stop(),
});

// What social.js and profile.js build on (classic scripts after this module, run before the
// page's DOMContentLoaded, when the client starts).
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
  requested,
  noteRequest,
  loadFollowing,
  loadProfile,
  session: () => session,
  shownPosts: () => Array.from(timeline.posts.values(), (entry) => entry.post),
  decorate: (decorator) => decorators.push(decorator),
  onSession: (hook) => sessionHooks.push(hook),
  onProfile: (hook) => profileHooks.push(hook),
});

function start() {
  wireAccount();
  wireCompose();
  wireFollowing();
  wirePaging();
  wireSettings();
  wireLists();
  followOtherTabs();
  updateCount();
  if (session) showSignedIn();
  else showSignedOut();
}

// A module runs once the page is parsed (readyState "interactive"), before the deferred
// classic scripts after it: start when they have run too, so their session hooks see the
// first sign-in (profile.js shows the profile a reload's address names).
document.addEventListener("DOMContentLoaded", start);
