// Writing posts (the compose form: its character count, who sees the post) and deleting them.

import { api, randomKey, session, userPath } from "./api.js";
import { loadProfile } from "./account.js";
import { insertPost, removePost } from "./timeline.js";
import { $, busy, showError, showMessage } from "./ui.js";

export const MAX_POST_CHARS = 280;

export function updateCount() {
  const used = Array.from($("compose-text").value.trim()).length;
  const left = MAX_POST_CHARS - used;
  const count = $("compose-count");
  count.textContent = String(left);
  count.classList.toggle("over", left < 0);
  count.title = left < 0 ? `${-left} over the ${MAX_POST_CHARS}-character limit` : "";
  $("compose-submit").disabled = left < 0 || used === 0;
}

// The compose form: its count as one types; Ctrl+Enter posts.
export function wireCompose() {
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
    const visibility = $("compose-visibility").value; // "public" or "followers"
    busy(form, async () => {
      try {
        const post = await api("POST", userPath(session.user_id, "posts"), {
          body: { text, visibility },
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
}

// "Delete" asks first, in the post itself: "Delete this post?" with Delete and Cancel.
export function confirmDelete(element, post) {
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
