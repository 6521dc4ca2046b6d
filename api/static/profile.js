// Profile pages (#/u/<user id>): a user's name, counts and lock, their posts, followers and
// following, and Follow (or a request to a locked user), Mute and Block buttons. Plain
// JavaScript on top of app.js and social.js, no build step.
"use strict";

(() => {
  const core = window.timelineCore;
  const social = window.timelineSocial;
  const $ = (id) => document.getElementById(id);
  const SCAN_PAGES = 20; // how far a "do I follow / mute / block them?" check looks

  const view = { userId: null, list: "posts", continuation: null, generation: 0 };
  const me = () => {
    const session = core.session();
    return session ? session.user_id : null;
  };

  function routeUser() {
    const match = /^#\/u\/([^/]+)$/.exec(window.location.hash);
    if (!match) return null;
    try {
      return decodeURIComponent(match[1]);
    } catch (_) {
      return null;
    }
  }

  // The home view (compose and timeline) or a profile, as the address says (settings.js
  // shows #/settings; lists.js a list, #/l/<list id>, in the timeline card).
  function route() {
    const userId = routeUser();
    const signedIn = Boolean(me());
    const list = window.location.hash.startsWith("#/l/");
    const home = userId === null && window.location.hash !== "#/settings" && !list;
    $("profile-view").hidden = userId === null;
    $("compose").hidden = !home || !signedIn;
    $("timeline").hidden = !(home || list) || !signedIn;
    $("welcome").hidden = userId !== null || signedIn;
    if (userId !== null) openProfile(userId);
    else view.userId = null;
  }

  // Whether ``target`` is in one of this user's lists (following, mutes, blocks).
  async function listed(list, target) {
    let continuation = null;
    for (let pages = 0; pages < SCAN_PAGES; pages += 1) {
      const path = core.withQuery(core.userPath(me(), list), { continuation });
      const page = await core.api("GET", path, { auth: list !== "following" });
      if (page.items.some((edge) => edge.user_id === target)) return true;
      continuation = page.continuation;
      if (!continuation) return false;
    }
    return false;
  }

  function setToggle(id, on, [onText, offText]) {
    const button = $(id);
    button.dataset.on = String(on);
    button.textContent = on ? onText : offText;
    button.setAttribute("aria-pressed", String(on));
  }

  // "none", "following", or "requested" (waiting for a locked user's approval): the button
  // says what a click does, the badge beside it what is.
  const FOLLOW_BUTTON = { none: "Follow", following: "Unfollow", requested: "Withdraw request" };
  const FOLLOW_BADGE = { none: "", following: "Following", requested: "Requested" };

  function setFollowState(state) {
    const button = $("profile-follow");
    button.dataset.state = state;
    button.textContent = FOLLOW_BUTTON[state];
    button.classList.toggle("secondary", state !== "none");
    $("profile-view-relation").textContent = FOLLOW_BADGE[state];
    $("profile-view-relation").hidden = state === "none";
  }

  async function loadRelations(userId, generation) {
    const own = userId === me();
    $("profile-view-actions").hidden = !me() || own;
    $("profile-view-relation").hidden = true;
    if (!me() || own) return;
    for (const id of ["profile-follow", "profile-mute", "profile-block"]) $(id).disabled = true;
    try {
      const [following, muted, blocked] = await Promise.all([
        listed("following", userId),
        listed("mutes", userId),
        listed("blocks", userId),
      ]);
      if (generation !== view.generation) return;
      if (following) core.noteRequest(userId, false); // approved
      setFollowState(following ? "following" : core.requested(userId) ? "requested" : "none");
      setToggle("profile-mute", muted, ["Unmute", "Mute"]);
      setToggle("profile-block", blocked, ["Unblock", "Block"]);
      for (const id of ["profile-follow", "profile-mute", "profile-block"]) $(id).disabled = false;
    } catch (error) {
      core.showError("profile-message", error);
    }
  }

  async function loadCounts(userId, generation) {
    try {
      const profile = await core.api("GET", core.userPath(userId), { auth: false });
      if (generation !== view.generation) return;
      const name = profile.display_name || userId;
      $("profile-view-name").textContent = name;
      $("profile-view-locked").hidden = !profile.locked;
      document.title = `${name} (@${userId}) · Timeline`;
      const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;
      $("profile-view-counts").textContent = [
        count(profile.posts, "post", "posts"),
        count(profile.followers, "follower", "followers"),
        `${profile.following} following`,
      ].join(" · ");
    } catch (error) {
      if (generation !== view.generation) return;
      $("profile-view-name").textContent = `@${userId}`;
      $("profile-view-counts").textContent = "";
      $("profile-view-actions").hidden = true;
      core.showError("profile-message", error);
    }
  }

  function openProfile(userId, { again = false } = {}) {
    if (view.userId === userId && !again) return;
    view.userId = userId;
    view.generation += 1;
    const generation = view.generation;
    if (!again) core.clearMessage("profile-message");
    $("profile-view-avatar").textContent = (userId[0] || "?").toUpperCase();
    $("profile-view-name").textContent = `@${userId}`;
    $("profile-view-id").textContent = `@${userId}`;
    $("profile-view-counts").textContent = "…";
    $("profile-view-locked").hidden = true;
    if (!again) window.scrollTo(0, 0);
    loadCounts(userId, generation);
    loadRelations(userId, generation);
    showList("posts");
  }

  function emptyText(list, userId) {
    const own = userId === me();
    if (list === "posts") return own ? "You have not posted yet." : `@${userId} has not posted yet.`;
    if (list === "followers") return own ? "Nobody follows you yet." : `Nobody follows @${userId} yet.`;
    return own ? "You do not follow anyone yet." : `@${userId} does not follow anyone yet.`;
  }

  function renderEdge(edge) {
    const item = document.createElement("li");
    item.className = "person";
    item.dataset.userId = edge.user_id;
    const avatar = document.createElement("span");
    avatar.className = "avatar";
    avatar.setAttribute("aria-hidden", "true");
    avatar.textContent = (edge.user_id[0] || "?").toUpperCase();
    const link = document.createElement("a");
    core.profileLink(link, edge.user_id);
    const name = document.createElement("span");
    name.className = "post-name";
    const id = document.createElement("span");
    id.className = "post-author";
    id.textContent = `@${edge.user_id}`;
    link.append(name, " ", id);
    social.displayName(edge.user_id).then((shown) => {
      if (shown && shown !== edge.user_id) name.textContent = shown;
    });
    item.append(avatar, link);
    return item;
  }

  // One of the profile's lists, a page at a time; ``more`` reads the next page.
  async function showList(list, { more = false } = {}) {
    const userId = view.userId;
    const generation = view.generation;
    view.list = list;
    document.querySelectorAll("#profile-view .tab").forEach((tab) => {
      tab.setAttribute("aria-selected", String(tab.dataset.list === list));
    });
    if (!more) {
      view.continuation = null;
      $("profile-list").replaceChildren();
      $("profile-empty").hidden = true;
      $("profile-more").hidden = true;
    }
    const path = core.withQuery(core.userPath(userId, list), { continuation: view.continuation });
    try {
      // posts with the token: a follower sees the followers-only ones
      const page = await core.api("GET", path, { auth: list === "posts" });
      if (generation !== view.generation || list !== view.list) return;
      const items = page.items.map((item) => (list === "posts" ? core.renderPost(item) : renderEdge(item)));
      $("profile-list").append(...items);
      view.continuation = page.continuation;
      const empty = $("profile-list").children.length === 0;
      $("profile-empty").textContent = emptyText(list, userId);
      $("profile-empty").hidden = !empty;
      $("profile-more").hidden = !page.continuation || empty;
    } catch (error) {
      if (generation === view.generation) core.showError("profile-message", error);
    }
  }

  async function act(id, action) {
    const button = $(id);
    const userId = view.userId;
    button.disabled = true;
    try {
      await action(userId, button.dataset.on === "true");
      openProfile(userId, { again: true }); // read it all again: counts and buttons
    } catch (error) {
      core.showError("profile-message", error);
      button.disabled = false;
    }
  }

  function wire() {
    window.addEventListener("hashchange", route);
    document.querySelectorAll("#profile-view .tab").forEach((tab) => {
      tab.addEventListener("click", () => showList(tab.dataset.list));
    });
    $("profile-more").addEventListener("click", () => showList(view.list, { more: true }));
    $("profile-follow").addEventListener("click", () =>
      act("profile-follow", async (userId) => {
        const state = $("profile-follow").dataset.state;
        let done;
        if (state === "none") {
          done =
            (await core.follow(userId)) === "requested"
              ? `Requested to follow @${userId}: they approve each follower.`
              : `Following @${userId}.`;
        } else {
          const withdraw = state === "requested";
          if (!(await core.unfollow(userId))) {
            throw new Error(`could not ${withdraw ? "withdraw the request to" : "unfollow"} @${userId}`);
          }
          done = withdraw ? `Withdrew the request to follow @${userId}.` : `Unfollowed @${userId}.`;
        }
        core.showMessage("profile-message", done, "ok");
      }),
    );
    $("profile-mute").addEventListener("click", () =>
      act("profile-mute", async (userId, on) => {
        if (on) {
          await core.api("DELETE", core.userPath(me(), "mutes", userId));
          core.mergeFirstPage(); // their posts come back at once
        } else await social.mute(userId);
        core.showMessage("profile-message", on ? `Unmuted @${userId}.` : `Muted @${userId}.`, "ok");
      }),
    );
    $("profile-block").addEventListener("click", () =>
      act("profile-block", async (userId, on) => {
        if (on) await core.api("DELETE", core.userPath(me(), "blocks", userId));
        else await social.block(userId);
        core.showMessage("profile-message", on ? `Unblocked @${userId}.` : `Blocked @${userId}.`, "ok");
      }),
    );
  }

  wire();
  core.onSession(() => {
    view.userId = null;
    route();
  });
})();
