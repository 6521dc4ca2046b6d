// Live updates: the Server-Sent Events parser and the stream connection (reconnects, backoff).

import { errorFrom, session, userPath, withQuery } from "./api.js";
import { mergeFirstPage } from "./paging.js";
import {
  advanceNewest,
  belowLoaded,
  insertPost,
  nowKey,
  removeStreamed,
  timeline,
} from "./timeline.js";
import { $, describe, showError } from "./ui.js";

const STREAM_IDLE_MS = 45000; // three missed heartbeats (sent every ~15 s): reconnect ...
const STREAM_IDLE_MAX_MS = 600000; // ... doubled after each silent connection, up to this
const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 30000;

// A Server-Sent Events parser (the WHATWG rules): lines end in CR, LF or CRLF; a blank
// line dispatches the event; lines starting with ':' are comments (heartbeats).
export class SseParser {
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

export const live = {
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
