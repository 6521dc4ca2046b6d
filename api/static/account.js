// The account: register, sign in with a token, sign out; the signed-in and signed-out views.

import {
  STORAGE_KEY,
  api,
  randomKey,
  reloadSession,
  saveSession,
  session,
  userPath,
  withQuery,
} from "./api.js";
import { loadFollowing } from "./following.js";
import { loadTimeline } from "./paging.js";
import { live } from "./stream.js";
import { clearTimeline } from "./timeline.js";
import { $, busy, clearMessage, describe, showError, showMessage } from "./ui.js";

// Called with the new session (or null) on sign-in and sign-out: social.js, profile.js.
export const sessionHooks = [];
// Called with the signed-in user's profile each time it is read or edited: social.js.
export const profileHooks = [];

// The signed-in user's profile in the sidebar (and wherever a hook shows their name).
export function showProfile(profile) {
  if (!session || session.user_id !== profile.user_id) return;
  const userId = profile.user_id;
  $("profile-display-name").textContent =
    profile.display_name && profile.display_name !== userId ? profile.display_name : "";
  const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;
  $("profile-counts").textContent = [
    count(profile.posts, "post", "posts"),
    count(profile.followers, "follower", "followers"),
    `${profile.following} following`,
  ].join(" · ");
  profileHooks.forEach((hook) => hook(profile));
}

export async function loadProfile() {
  if (!session) return;
  const userId = session.user_id;
  try {
    showProfile(await api("GET", userPath(userId), { auth: false }));
  } catch (error) {
    if (session && session.user_id === userId) $("profile-counts").textContent = describe(error);
  }
}

export function showSignedIn() {
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

export function showSignedOut() {
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

// Register, sign in with a token, sign out, show and copy the token.
export function wireAccount() {
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
}

// Another tab signed in or out: follow it.
export function followOtherTabs() {
  window.addEventListener("storage", (event) => {
    if (event.key !== STORAGE_KEY) return;
    reloadSession();
    if (session) showSignedIn();
    else showSignedOut();
  });
}
