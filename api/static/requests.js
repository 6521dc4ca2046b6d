// The requests to follow this user waiting for an answer (settings view): approve or refuse.

import { api, session, userPath, withQuery } from "./api.js";
import { loadProfile } from "./account.js";
import { profileLink } from "./timeline.js";
import { $, formatTime, showError, showMessage } from "./ui.js";

const requests = { continuation: null, loads: 0 }; // loads: a late answer of an older read is dropped

function updateEmpty() {
  $("request-empty").hidden = $("request-list").children.length > 0;
}

function button(text, className, label, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = text;
  element.setAttribute("aria-label", label);
  element.addEventListener("click", onClick);
  return element;
}

function renderRequest(request) {
  const userId = request.user_id;
  const item = document.createElement("li");
  item.dataset.userId = userId;
  const who = document.createElement("span");
  const link = document.createElement("a");
  link.textContent = `@${userId}`;
  profileLink(link, userId);
  const since = document.createElement("time");
  since.className = "muted small";
  since.dateTime = request.since;
  since.textContent = formatTime(request.since);
  who.append(link, " · ", since);
  const actions = document.createElement("span");
  actions.className = "row";
  actions.append(
    button("Approve", "small", `Approve @${userId}'s request`, () => answer(userId, item, true)),
    button("Refuse", "secondary small danger", `Refuse @${userId}'s request`, () =>
      answer(userId, item, false),
    ),
  );
  item.append(who, actions);
  return item;
}

// Approve (the follow starts, with its backfill) or refuse; either way the request leaves.
async function answer(userId, item, approve) {
  const buttons = item.querySelectorAll("button");
  buttons.forEach((b) => (b.disabled = true));
  try {
    await api(approve ? "PUT" : "DELETE", userPath(session.user_id, "follow_requests", userId));
    item.remove();
    updateEmpty();
    const done = approve ? `Approved: @${userId} follows you now.` : `Refused @${userId}'s request.`;
    showMessage("requests-message", done, "ok");
    if (approve) loadProfile(); // one follower more
  } catch (error) {
    if (error.code === "follow_request_not_found") {
      item.remove(); // withdrawn (or answered elsewhere) meanwhile
      updateEmpty();
    } else buttons.forEach((b) => (b.disabled = false));
    showError("requests-message", error);
  }
}

// The first page, or with ``more`` the next one.
export async function loadRequests({ more = false } = {}) {
  const load = ++requests.loads;
  if (!more) {
    requests.continuation = null;
    $("request-list").replaceChildren();
    $("request-empty").hidden = true;
    $("request-more").hidden = true;
  }
  const path = withQuery(userPath(session.user_id, "follow_requests"), {
    continuation: requests.continuation,
  });
  try {
    const page = await api("GET", path);
    if (load !== requests.loads) return;
    const shown = (userId) => $("request-list").querySelector(`li[data-user-id="${userId}"]`);
    $("request-list").append(...page.items.filter((r) => !shown(r.user_id)).map(renderRequest));
    requests.continuation = page.continuation;
    $("request-more").hidden = !page.continuation;
    updateEmpty();
  } catch (error) {
    if (load === requests.loads) showError("requests-message", error);
  }
}

export function wireRequests() {
  $("request-more").addEventListener("click", () => loadRequests({ more: true }));
}
