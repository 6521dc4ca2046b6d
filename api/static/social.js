// What people do with a post besides reading it: reply, repost (and undo; not a followers-only
// post), read its replies, mute or block its author; and the authors' display names. Plain
// JavaScript on top of app.js (window.timelineCore), no build step.
"use strict";

(() => {
  const core = window.timelineCore;
  const $ = (id) => document.getElementById(id);
  const me = () => {
    const session = core.session();
    return session ? session.user_id : null;
  };

  // ---------------------------------------------------------------- display names

  // One profile read per author a session shows; null while unknown (or on an error).
  const names = new Map();

  function displayName(userId) {
    if (!names.has(userId)) {
      names.set(
        userId,
        core
          .api("GET", core.userPath(userId), { auth: false })
          .then((profile) => profile.display_name || null)
          .catch(() => null),
      );
    }
    return names.get(userId);
  }

  async function showName(element, userId) {
    const name = await displayName(userId);
    if (name && name !== userId) element.textContent = name;
  }

  // The signed-in user's profile, read or edited: their name on the posts shown.
  function rename(profile) {
    const userId = profile.user_id;
    const name = profile.display_name || null;
    names.set(userId, Promise.resolve(name));
    const shown = document.querySelectorAll(`li[data-author="${userId}"] > .post-head .post-name`);
    shown.forEach((element) => (element.textContent = name && name !== userId ? name : ""));
  }

  // ---------------------------------------------------------------- reposts

  // The posts this user reposted, as far as this page knows (the API has no list of them).
  const reposted = new Set();

  function repostLabel(button, postId) {
    const done = reposted.has(postId);
    button.textContent = done ? "Undo repost" : "Repost";
    button.classList.toggle("active", done);
    button.setAttribute("aria-pressed", String(done));
  }

  async function toggleRepost(post, button) {
    const undo = reposted.has(post.post_id);
    button.disabled = true;
    try {
      if (undo) {
        await core.api("DELETE", core.userPath(me(), "reposts", post.post_id));
        reposted.delete(post.post_id);
        core.showMessage("timeline-message", "Repost undone.", "ok");
      } else {
        await core.api("POST", core.userPath(me(), "reposts"), {
          body: { author: post.author, post_id: post.post_id },
        });
        reposted.add(post.post_id);
        core.showMessage("timeline-message", `Reposted @${post.author}'s post to your followers.`, "ok");
      }
      document
        .querySelectorAll(`li[data-post-id="${post.post_id}"] > .post-actions .post-repost-button`)
        .forEach((each) => repostLabel(each, post.post_id));
    } catch (error) {
      core.showError("timeline-message", error);
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- mutes and blocks

  // Entries by (or reposted by) ``userId`` leave the list at once; the API filters the next
  // pages and the stream.
  function hideFrom(userId) {
    for (const post of core.shownPosts()) {
      if (post.author === userId || post.reposted_by === userId) core.removePost(post.post_id);
    }
  }

  async function mute(userId) {
    await core.api("PUT", core.userPath(me(), "mutes", userId));
    hideFrom(userId);
    core.showMessage("timeline-message", `Muted @${userId}: their posts are hidden until you unmute.`, "ok");
  }

  async function block(userId) {
    await core.api("PUT", core.userPath(me(), "blocks", userId));
    hideFrom(userId);
    core.showMessage("timeline-message", `Blocked @${userId}.`, "ok");
    core.loadFollowing();
    core.loadProfile();
  }

  async function relate(action, userId, button) {
    button.disabled = true;
    try {
      await action(userId);
    } catch (error) {
      core.showError("timeline-message", error);
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- replies

  function countChars(text) {
    return Array.from(text.trim()).length;
  }

  function wireReplyForm(element, post) {
    const form = element.querySelector(".reply-form");
    const text = form.querySelector(".reply-text");
    const count = form.querySelector(".reply-count");
    const submit = form.querySelector(".reply-submit");
    const visibility = form.querySelector(".reply-visibility");
    text.placeholder = `Reply to @${post.author}`;
    visibility.value = post.visibility === "followers" ? "followers" : "public"; // as the post's
    const update = () => {
      const left = core.MAX_POST_CHARS - countChars(text.value);
      count.textContent = String(left);
      count.classList.toggle("over", left < 0);
      submit.disabled = left < 0 || left === core.MAX_POST_CHARS;
    };
    text.addEventListener("input", update);
    update();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      core
        .busy(form, async () => {
          try {
            const reply = await core.api("POST", core.userPath(me(), "posts"), {
              body: {
                text: text.value,
                reply_to: { author: post.author, post_id: post.post_id },
                visibility: visibility.value,
              },
              headers: { "Idempotency-Key": core.randomKey() },
            });
            text.value = "";
            form.hidden = true;
            core.showMessage("timeline-message", `Replied to @${post.author}.`, "ok");
            await showReplies(element, post, { open: true });
            addReply(element, reply, { top: true });
          } catch (error) {
            core.showError("timeline-message", error);
          }
        })
        .then(update);
    });
  }

  function addReply(element, reply, { top = false } = {}) {
    const list = element.querySelector(":scope > .replies > .reply-list");
    if (list.querySelector(`:scope > li[data-post-id="${reply.post_id}"]`)) return;
    const item = core.renderPost(reply);
    item.classList.replace("post", "reply"); // a reply inside a post is no timeline entry
    if (top) list.prepend(item);
    else list.append(item);
    element.querySelector(":scope > .replies > .replies-empty").hidden = true;
  }

  // The post's replies, a page at a time (newest first); ``open`` keeps them shown.
  async function showReplies(element, post, { open = false, more = false } = {}) {
    const area = element.querySelector(":scope > .replies");
    const button = element.querySelector(":scope > .post-actions .post-replies-button");
    if (!open && !more && !area.hidden) {
      area.hidden = true;
      button.setAttribute("aria-expanded", "false");
      return;
    }
    if (!area.hidden && !more) return;
    const list = area.querySelector(".reply-list");
    const next = area.querySelector(".replies-more");
    const path = core.userPath(post.author, "posts", post.post_id, "replies");
    try {
      // with the token: a follower sees the followers-only replies
      const page = await core.api(
        "GET",
        core.withQuery(path, { continuation: more ? next.dataset.continuation : null }),
      );
      if (!more) list.replaceChildren();
      page.items.forEach((reply) => addReply(element, reply));
      next.dataset.continuation = page.continuation || "";
      next.hidden = !page.continuation;
      area.querySelector(".replies-empty").hidden = list.children.length > 0;
      area.hidden = false;
      button.setAttribute("aria-expanded", "true");
    } catch (error) {
      core.showError("timeline-message", error);
    }
  }

  // ---------------------------------------------------------------- the actions of a post

  function actionButton(className, text, onClick) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = `${className} secondary small`;
    button.textContent = text;
    button.addEventListener("click", onClick);
    return button;
  }

  function decorate(element, post) {
    showName(element.querySelector(".post-name"), post.author);
    const actions = element.querySelector(".post-actions");
    const form = element.querySelector(".reply-form");
    const replies = actionButton("post-replies-button", "Replies", () => showReplies(element, post));
    replies.setAttribute("aria-expanded", "false");
    element.querySelector(".replies-more").addEventListener("click", () =>
      showReplies(element, post, { more: true }),
    );
    actions.append(replies);
    if (!me()) return;
    if (post.reposted_by === me()) reposted.add(post.post_id);
    const reply = actionButton("post-reply-button", "Reply", () => {
      form.hidden = !form.hidden;
      if (!form.hidden) form.querySelector(".reply-text").focus();
    });
    const buttons = [reply];
    if (post.visibility !== "followers") {
      // nobody can repost a followers-only post (403 not_repostable)
      const repost = actionButton("post-repost-button", "Repost", () => toggleRepost(post, repost));
      repostLabel(repost, post.post_id);
      buttons.push(repost);
    }
    actions.prepend(...buttons);
    wireReplyForm(element, post);
    if (post.author === me()) return;
    const menu = document.createElement("details");
    menu.className = "post-more";
    const summary = document.createElement("summary");
    summary.textContent = "More";
    const muteButton = actionButton("post-mute", `Mute @${post.author}`, () =>
      relate(mute, post.author, muteButton),
    );
    const blockButton = actionButton("post-block", `Block @${post.author}`, () =>
      relate(block, post.author, blockButton),
    );
    blockButton.classList.add("danger");
    menu.append(summary, muteButton, blockButton);
    actions.append(menu);
  }

  core.decorate(decorate);
  core.onSession(() => reposted.clear());
  core.onProfile(rename);
  window.timelineSocial = Object.freeze({ displayName, mute, block, hideFrom });
})();
