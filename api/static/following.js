// The people this user follows: the sidebar list, follow and unfollow, and the requests to
// follow locked users.

import { api, session, userPath } from "./api.js";
import { loadProfile } from "./account.js";
import { mergeBackfill } from "./paging.js";
import { profileLink, removePost, timeline } from "./timeline.js";
import { $, busy, showError, showMessage } from "./ui.js";

export async function loadFollowing() {
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

// The requests this user made to follow locked users, as far as this browser knows (the API
// lists them only to the user asked), kept in localStorage so a reload still shows them.
const requestsKey = () => `timeline.requested.${session.user_id}`;

function requestedSet() {
  try {
    const stored = JSON.parse(localStorage.getItem(requestsKey()) || "[]");
    return new Set(Array.isArray(stored) ? stored : []);
  } catch (_) {
    return new Set(); // a damaged entry is the same as none
  }
}

export function requested(target) {
  return Boolean(session) && requestedSet().has(target);
}

export function noteRequest(target, pending) {
  const targets = requestedSet();
  if (pending) targets.add(target);
  else targets.delete(target);
  if (targets.size) localStorage.setItem(requestsKey(), JSON.stringify([...targets]));
  else localStorage.removeItem(requestsKey());
}

// "following", or "requested" when the target is locked (202): the follow starts when they
// approve it.
export async function follow(target) {
  const answer = await api("PUT", userPath(session.user_id, "following", target));
  $("follow-target").value = "";
  if (answer && answer.state === "requested") {
    noteRequest(target, true);
    showMessage("follow-message", `Requested to follow @${target}: they approve each follower.`, "ok");
    return "requested";
  }
  noteRequest(target, false);
  showMessage("follow-message", `Following @${target}. Their recent posts will appear shortly.`, "ok");
  loadFollowing();
  loadProfile();
  mergeBackfill();
  return "following";
}

// Unfollow, or withdraw a request (the same DELETE).
export async function unfollow(target, button) {
  if (button) button.disabled = true;
  try {
    await api("DELETE", userPath(session.user_id, "following", target));
    // (a list shown keeps them: its members are not the people followed)
    for (const entry of timeline.listId ? [] : Array.from(timeline.posts.values())) {
      if (entry.post.author === target) removePost(entry.post.post_id);
    }
    const withdrawn = requested(target);
    noteRequest(target, false);
    const done = withdrawn ? `Withdrew the request to follow @${target}.` : `Unfollowed @${target}.`;
    showMessage("follow-message", done, "ok");
    loadFollowing();
    loadProfile();
    return true;
  } catch (error) {
    showError("follow-message", error);
    if (button) button.disabled = false;
    return false;
  }
}

// The sidebar's follow form: Follow and Unfollow by user id.
export function wireFollowing() {
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
}
