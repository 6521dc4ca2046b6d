// The settings view (#/settings): the display name and the lock, the follow requests
// (requests.js), the keyword filters, adding and removing them, and deleting the account.

import { api, saveSession, session, userPath, withQuery } from "./api.js";
import { sessionHooks, showProfile, showSignedOut } from "./account.js";
import { loadTimeline } from "./paging.js";
import { loadRequests, wireRequests } from "./requests.js";
import { $, busy, clearMessage, showError, showMessage } from "./ui.js";

const MAX_PAGES = 100; // a user has at most 100 filters

let loads = 0; // bumped by each list read, so a late answer of an older one is dropped

const onSettings = () => window.location.hash === "#/settings";

function formatEnd(iso) {
  return new Date(iso).toLocaleString(undefined, {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
  });
}

// ---------------------------------------------------------------- display name and lock

function showEditable(profile) {
  $("settings-display-name").value = profile.display_name || "";
  $("settings-locked").checked = Boolean(profile.locked);
}

async function loadEditable() {
  const userId = session.user_id;
  $("settings-locked").disabled = true;
  try {
    const profile = await api("GET", userPath(userId), { auth: false });
    if (!session || session.user_id !== userId) return;
    showEditable(profile);
    $("settings-locked").disabled = false;
  } catch (error) {
    showError("profile-settings-message", error);
  }
}

// A PATCH of the user's profile; the edited profile is shown here, in the sidebar and on
// the user's posts.
async function edit(changes) {
  const profile = await api("PATCH", userPath(session.user_id), { body: changes });
  showEditable(profile);
  showProfile(profile);
  return profile;
}

async function saveName() {
  try {
    const profile = await edit({ display_name: $("settings-display-name").value.trim() });
    showMessage("profile-settings-message", `Your display name is now “${profile.display_name}”.`, "ok");
  } catch (error) {
    showError("profile-settings-message", error);
  }
}

async function saveLocked(box) {
  const locked = box.checked;
  box.disabled = true;
  try {
    const profile = await edit({ locked });
    const done = profile.locked
      ? "Your account is locked: whoever follows you now asks first."
      : "Your account is unlocked: anyone can follow you at once; requests made before still wait.";
    showMessage("profile-settings-message", done, "ok");
  } catch (error) {
    box.checked = !locked;
    showError("profile-settings-message", error);
  } finally {
    box.disabled = false;
  }
}

// ---------------------------------------------------------------- keyword filters

function updateEmpty() {
  $("filter-empty").hidden = $("filter-list").children.length > 0;
}

function renderFilter(filter) {
  const item = document.createElement("li");
  item.dataset.filterId = filter.filter_id;
  const text = document.createElement("span");
  const phrase = document.createElement("strong");
  phrase.className = "filter-phrase";
  phrase.textContent = filter.phrase;
  const end = document.createElement("span");
  end.className = "filter-end muted small";
  if (filter.expires_at) {
    end.textContent = ` until ${formatEnd(filter.expires_at)}`;
    end.title = filter.expires_at;
  }
  text.append(phrase, end);
  const button = document.createElement("button");
  button.type = "button";
  button.className = "secondary small";
  button.textContent = "Remove";
  button.setAttribute("aria-label", `Remove the filter “${filter.phrase}”`);
  button.addEventListener("click", () => removeFilter(filter, item, button));
  item.append(text, button);
  return item;
}

// The whole list, page by page (by filter id); the ones already ended are left out.
async function loadFilters() {
  const userId = session.user_id;
  const load = ++loads;
  const items = [];
  let continuation = null;
  try {
    for (let pages = 0; pages < MAX_PAGES; pages += 1) {
      const page = await api("GET", withQuery(userPath(userId, "filters"), { continuation }));
      items.push(...page.items);
      continuation = page.continuation;
      if (!continuation) break;
    }
    if (load !== loads) return;
    const now = Date.now();
    const current = items.filter((f) => !f.expires_at || Date.parse(f.expires_at) > now);
    $("filter-list").replaceChildren(...current.map(renderFilter));
    updateEmpty();
  } catch (error) {
    if (load === loads) showError("settings-message", error);
  }
}

// The home timeline is read again at once (the API applies filters when it reads), so it
// is right whenever the user goes back to it.
async function addFilter(form) {
  const phrase = $("filter-phrase").value.trim();
  const seconds = Number($("filter-for").value);
  const body = { phrase };
  if (seconds) body.expires_at = new Date(Date.now() + seconds * 1000).toISOString();
  try {
    const added = await api("POST", userPath(session.user_id, "filters"), { body });
    form.reset();
    $("filter-list").append(renderFilter(added));
    updateEmpty();
    showMessage("settings-message", `Filter added: posts with “${added.phrase}” are hidden.`, "ok");
    loadTimeline();
  } catch (error) {
    showError("settings-message", error);
  }
}

async function removeFilter(filter, item, button) {
  button.disabled = true;
  try {
    await api("DELETE", userPath(session.user_id, "filters", filter.filter_id));
    item.remove();
    updateEmpty();
    showMessage("settings-message", `Filter “${filter.phrase}” removed.`, "ok");
    loadTimeline();
  } catch (error) {
    if (error.status === 404) {
      item.remove(); // removed elsewhere already
      updateEmpty();
    }
    showError("settings-message", error);
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- deleting the account

function confirmDeletion(asking) {
  $("account-confirm").hidden = !asking;
  $("account-delete").hidden = asking;
  if (asking) $("account-confirm-delete").focus();
}

// Deleted at once (its tokens stop working), so this tab signs out; the rest of the
// account goes in the background.
async function deleteAccount(button) {
  const ending = session;
  button.disabled = true;
  try {
    await api("DELETE", userPath(ending.user_id));
    saveSession(null);
    showSignedOut();
    window.location.hash = "#/";
    showMessage("account-message", `Account @${ending.user_id} deleted; its posts and follows are being removed.`, "ok");
  } catch (error) {
    showError("delete-message", error);
  } finally {
    button.disabled = false;
    confirmDeletion(false);
  }
}

// Shown while the address is #/settings and someone is signed in; read afresh on opening.
function route() {
  const shown = onSettings() && Boolean(session);
  const opening = shown && $("settings-view").hidden;
  $("settings-view").hidden = !shown;
  if (!opening) return;
  for (const id of ["profile-settings-message", "requests-message", "settings-message", "delete-message"]) clearMessage(id);
  confirmDeletion(false);
  $("filter-list").replaceChildren();
  $("filter-empty").hidden = true;
  window.scrollTo(0, 0);
  loadEditable();
  loadRequests();
  loadFilters();
}

export function wireSettings() {
  window.addEventListener("hashchange", route);
  $("name-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy(event.currentTarget, saveName);
  });
  $("settings-locked").addEventListener("change", (event) => saveLocked(event.currentTarget));
  $("account-delete").addEventListener("click", () => confirmDeletion(true));
  $("account-confirm-cancel").addEventListener("click", () => confirmDeletion(false));
  $("account-confirm-delete").addEventListener("click", (event) => deleteAccount(event.currentTarget));
  wireRequests();
  $("filter-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.currentTarget;
    busy(form, () => addFilter(form));
  });
  sessionHooks.push(() => {
    $("settings-view").hidden = true; // another user's list: read it again
    route();
  });
}
