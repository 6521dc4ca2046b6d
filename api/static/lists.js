// Lists: the side menu of the user's lists, creating one, and a list's view (#/l/<list id>):
// its timeline in the timeline card, its title, the exclusive switch, members, deleting it;
// "Add to list" on a profile.

import { api, session, userPath, withQuery } from "./api.js";
import { sessionHooks } from "./account.js";
import { loadTimeline, mergeBackfill } from "./paging.js";
import { profileLink, removePost, timeline } from "./timeline.js";
import { $, busy, clearMessage, showError, showMessage } from "./ui.js";

const MAX_PAGES = 100; // a user has at most 100 lists

// The user's lists as the menu shows them (list_id -> {list_id, title, exclusive}); loads
// are bumped by each read, so a late answer of an older one is dropped.
const lists = new Map();
const reads = { menu: 0, members: 0, continuation: null };

const listHref = (listId) => `#/l/${encodeURIComponent(listId)}`;
const listPath = (...rest) => userPath(session.user_id, "lists", timeline.listId, ...rest);

// The id the address names after ``#/<kind>/``: a list ("l") or a profile's user ("u").
function routed(kind) {
  const match = new RegExp(`^#/${kind}/([^/]+)$`).exec(window.location.hash);
  if (!match) return null;
  try {
    return decodeURIComponent(match[1]);
  } catch (_) {
    return null;
  }
}

// ---------------------------------------------------------------- the side menu

function renderMenuItem(list) {
  const item = document.createElement("li");
  item.dataset.listId = list.list_id;
  const link = document.createElement("a");
  link.className = "menu-link";
  link.href = listHref(list.list_id);
  link.textContent = list.title;
  item.append(link);
  if (list.exclusive) {
    const badge = document.createElement("span");
    badge.className = "badge";
    badge.title = "Its members' posts stay out of your home timeline";
    badge.textContent = "Exclusive";
    item.append(badge);
  }
  return item;
}

// The link of the view shown is marked current: Home, or the list.
function markCurrent() {
  const hash = window.location.hash || "#/";
  document.querySelectorAll("#lists .menu-link").forEach((link) => {
    if (link.getAttribute("href") === hash) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  });
}

function showMenu() {
  const sorted = [...lists.values()].sort((a, b) => a.title.localeCompare(b.title));
  $("list-menu").replaceChildren(...sorted.map(renderMenuItem));
  $("lists-empty").hidden = lists.size > 0;
  markCurrent();
  const choice = $("profile-list-choice");
  const chosen = choice.value;
  choice.replaceChildren(...sorted.map((list) => new Option(list.title, list.list_id)));
  if (lists.has(chosen)) choice.value = chosen;
  $("profile-lists").hidden = lists.size === 0;
}

// A list read or edited: in the menu, and in the view when it is the one shown.
function remember(list) {
  lists.set(list.list_id, list);
  showMenu();
  if (list.list_id !== timeline.listId) return;
  $("list-view-title").textContent = list.title;
  $("timeline-title").textContent = list.title;
  $("list-rename-title").value = list.title;
  $("list-exclusive").checked = Boolean(list.exclusive);
  document.title = `${list.title} · @${session.user_id} · Timeline`;
}

function forget(listId) {
  lists.delete(listId);
  showMenu();
}

async function loadLists() {
  const userId = session.user_id;
  const load = ++reads.menu;
  const items = [];
  let continuation = null;
  try {
    for (let pages = 0; pages < MAX_PAGES; pages += 1) {
      const page = await api("GET", withQuery(userPath(userId, "lists"), { continuation }));
      items.push(...page.items);
      continuation = page.continuation;
      if (!continuation) break;
    }
    if (load !== reads.menu) return;
    lists.clear();
    items.forEach((list) => lists.set(list.list_id, list));
    showMenu();
  } catch (error) {
    if (load === reads.menu) showError("lists-message", error);
  }
}

// A new list opens at once, to add its members.
async function createList(form) {
  const body = { title: $("new-list-title").value, exclusive: $("new-list-exclusive").checked };
  try {
    const made = await api("POST", userPath(session.user_id, "lists"), { body });
    form.reset();
    remember(made);
    showMessage("lists-message", `List “${made.title}” created.`, "ok");
    window.location.hash = listHref(made.list_id);
  } catch (error) {
    showError("lists-message", error);
  }
}

// ---------------------------------------------------------------- the list shown

async function openList(listId) {
  try {
    const list = await api("GET", listPath());
    if (listId === timeline.listId) remember(list);
  } catch (error) {
    if (listId === timeline.listId) showError("list-message", error);
  }
}

async function edit(changes) {
  const list = await api("PATCH", listPath(), { body: changes });
  remember(list);
  return list;
}

async function rename() {
  try {
    const list = await edit({ title: $("list-rename-title").value });
    showMessage("list-message", `Renamed to “${list.title}”.`, "ok");
  } catch (error) {
    showError("list-message", error);
  }
}

// The home timeline is read again on the way back to it (the API leaves out an exclusive
// list's members when it reads).
async function saveExclusive(box) {
  const exclusive = box.checked;
  box.disabled = true;
  try {
    const list = await edit({ exclusive });
    const done = list.exclusive
      ? "Exclusive: its members' posts stay out of your home timeline."
      : "Not exclusive: the posts of its members you follow are in your home timeline again.";
    showMessage("list-message", done, "ok");
  } catch (error) {
    box.checked = !exclusive;
    showError("list-message", error);
  } finally {
    box.disabled = false;
  }
}

function confirmDelete(asking) {
  $("list-confirm").hidden = !asking;
  $("list-delete").hidden = asking;
  if (asking) $("list-confirm-delete").focus();
}

async function deleteList(button) {
  const listId = timeline.listId;
  const title = $("list-view-title").textContent;
  button.disabled = true;
  try {
    await api("DELETE", listPath());
    forget(listId);
    showMessage("lists-message", `List “${title}” deleted.`, "ok");
    window.location.hash = "#/";
  } catch (error) {
    if (error.status === 404) forget(listId); // deleted elsewhere already
    showError("list-message", error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- members

function updateMembersEmpty() {
  $("member-empty").hidden = $("member-list").children.length > 0;
}

function renderMember(edge) {
  const userId = edge.user_id;
  const item = document.createElement("li");
  item.dataset.userId = userId;
  const link = document.createElement("a");
  link.textContent = `@${userId}`;
  profileLink(link, userId);
  const button = document.createElement("button");
  button.type = "button";
  button.className = "secondary small";
  button.textContent = "Remove";
  button.setAttribute("aria-label", `Remove @${userId} from the list`);
  button.addEventListener("click", () => removeMember(userId, item, button));
  item.append(link, button);
  return item;
}

// The members by user id, a page at a time; ``more`` reads the next page.
async function loadMembers({ more = false } = {}) {
  const load = more ? reads.members : ++reads.members;
  if (!more) {
    reads.continuation = null;
    $("member-list").replaceChildren();
    $("member-empty").hidden = true;
    $("member-more").hidden = true;
  }
  try {
    const page = await api("GET", withQuery(listPath("members"), { continuation: reads.continuation }));
    if (load !== reads.members) return;
    $("member-list").append(...page.items.map(renderMember));
    reads.continuation = page.continuation;
    $("member-more").hidden = !page.continuation;
    updateMembersEmpty();
  } catch (error) {
    if (load === reads.members) showError("list-message", error);
  }
}

async function addMember(form) {
  const member = $("member-id").value.trim();
  if (!member) {
    showMessage("list-message", "Enter the user id to add.", "error");
    return;
  }
  try {
    await api("PUT", listPath("members", member));
    form.reset();
    showMessage("list-message", `Added @${member}. Their recent posts will appear shortly.`, "ok");
    loadMembers();
    mergeBackfill();
  } catch (error) {
    showError("list-message", error);
  }
}

// Their entries leave the list in the background: here at once (their posts, and what they
// reposted; another member's repost of their post stays).
async function removeMember(member, item, button) {
  button.disabled = true;
  try {
    await api("DELETE", listPath("members", member));
    item.remove();
    updateMembersEmpty();
    for (const { post } of Array.from(timeline.posts.values())) {
      if ((post.reposted_by || post.author) === member) removePost(post.post_id);
    }
    showMessage("list-message", `Removed @${member} from the list.`, "ok");
  } catch (error) {
    showError("list-message", error);
    button.disabled = false;
  }
}

// "Add to list" on the profile shown.
async function addFromProfile(button) {
  const member = routed("u");
  const list = lists.get($("profile-list-choice").value);
  if (member === null || !list) return;
  button.disabled = true;
  try {
    await api("PUT", userPath(session.user_id, "lists", list.list_id, "members", member));
    showMessage("profile-message", `Added @${member} to “${list.title}”.`, "ok");
  } catch (error) {
    showError("profile-message", error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- routing

// The timeline card shows the list the address names, else the home timeline; a change of
// either reads it anew (``load``: unless the caller reads it next; ``again``: a new session).
function route({ load = true, again = false } = {}) {
  const listId = session ? routed("l") : null;
  $("list-view").hidden = listId === null;
  $("live-status").hidden = listId !== null; // a list has no live stream
  markCurrent();
  if (listId === timeline.listId && !again) return;
  timeline.listId = listId;
  const known = listId === null ? null : lists.get(listId);
  const title = listId === null ? "Home timeline" : known ? known.title : "List";
  $("timeline-title").textContent = title;
  $("list-view-title").textContent = title;
  $("timeline-empty-home").hidden = listId !== null;
  $("timeline-empty-list").hidden = listId === null;
  clearMessage("list-message");
  confirmDelete(false);
  if (listId !== null) {
    window.scrollTo(0, 0);
    openList(listId);
    loadMembers();
  } else if (session) document.title = `@${session.user_id} · Timeline`;
  if (load && session) loadTimeline();
}

export function wireLists() {
  window.addEventListener("hashchange", () => route());
  $("list-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.currentTarget;
    busy(form, () => createList(form));
  });
  $("list-rename-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy(event.currentTarget, rename);
  });
  $("list-exclusive").addEventListener("change", (event) => saveExclusive(event.currentTarget));
  $("list-delete").addEventListener("click", () => confirmDelete(true));
  $("list-confirm-cancel").addEventListener("click", () => confirmDelete(false));
  $("list-confirm-delete").addEventListener("click", (event) => deleteList(event.currentTarget));
  $("member-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.currentTarget;
    busy(form, () => addMember(form));
  });
  $("member-more").addEventListener("click", () => loadMembers({ more: true }));
  $("profile-add-to-list").addEventListener("click", (event) => addFromProfile(event.currentTarget));
  // sign-in and sign-out: another user's lists (the caller reads the timeline next)
  sessionHooks.push((current) => {
    $("lists").hidden = !current;
    reads.menu += 1;
    reads.members += 1;
    lists.clear();
    showMenu();
    clearMessage("lists-message");
    route({ load: false, again: true });
    if (current) loadLists();
  });
}
