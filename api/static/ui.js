// Page helpers: element lookup, status messages, error wording, busy forms, relative times.

import { ApiError, session } from "./api.js";

export const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- messages

const messageTimers = new Map();

export function showMessage(id, text, kind = "info", { sticky = false } = {}) {
  const element = $(id);
  clearTimeout(messageTimers.get(id));
  element.textContent = text;
  element.dataset.kind = kind;
  element.hidden = false;
  if (!sticky && kind !== "error") {
    messageTimers.set(id, setTimeout(() => clearMessage(id), 4000));
  }
}

export function clearMessage(id) {
  const element = $(id);
  clearTimeout(messageTimers.get(id));
  element.hidden = true;
  element.textContent = "";
  delete element.dataset.kind;
}

export function describe(error) {
  if (!(error instanceof ApiError)) return String(error && error.message ? error.message : error);
  let text = error.message;
  if (!/[.!?]$/.test(text)) text += ".";
  if (error.retryAfter && /^\d+$/.test(error.retryAfter)) {
    text += ` Try again in ${error.retryAfter} s.`;
  }
  if (error.status === 401 && session) text += " Sign out and sign in again with a valid token.";
  return error.status ? `${text} (${error.code})` : text;
}

export function showError(id, error) {
  showMessage(id, describe(error), "error");
}

// A form's buttons are disabled while its request runs, so a double click sends one request.
export async function busy(form, action) {
  const controls = form.querySelectorAll("button, input, textarea");
  const buttons = Array.from(controls).filter((c) => c.tagName === "BUTTON");
  buttons.forEach((b) => (b.disabled = true));
  form.setAttribute("aria-busy", "true");
  try {
    return await action();
  } finally {
    buttons.forEach((b) => (b.disabled = false));
    form.removeAttribute("aria-busy");
  }
}

// ---------------------------------------------------------------- time

export function formatTime(iso) {
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return iso;
  const seconds = Math.round((Date.now() - when.getTime()) / 1000);
  if (seconds < 45) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return when.toLocaleString(undefined, {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
  });
}
