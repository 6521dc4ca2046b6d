// The API session (user id and token), the fetch wrapper and its errors, the API's paths.

// The session is kept in localStorage so a reload stays signed in.

export const STORAGE_KEY = "timeline.session";

export class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

export let session = loadSession();

function loadSession() {
  try {
    const stored = JSON.parse(localStorage.getItem(STORAGE_KEY) || "null");
    if (stored && typeof stored.user_id === "string" && typeof stored.token === "string") {
      return stored;
    }
  } catch (_) {
    // a damaged entry is the same as none
  }
  return null;
}

export function saveSession(value) {
  session = value;
  if (value) localStorage.setItem(STORAGE_KEY, JSON.stringify(value));
  else localStorage.removeItem(STORAGE_KEY);
}

// Another tab signed in or out: take its session (without writing it back).
export function reloadSession() {
  session = loadSession();
}

export function userPath(userId, ...rest) {
  return ["/users", userId, ...rest].map((part, i) => (i ? encodeURIComponent(part) : part)).join("/");
}

export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined) query.set(name, value);
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

// The API's error body is {"error": {"code", "message"}}; anything else (a proxy's page, a
// lost connection) becomes an ApiError too, so every caller shows one kind of message.
export async function errorFrom(response) {
  let body = null;
  try {
    body = JSON.parse(await response.text());
  } catch (_) {
    body = null;
  }
  const error = body && typeof body === "object" ? body.error : null;
  const code = error && typeof error.code === "string" ? error.code : `http_${response.status}`;
  const message =
    error && typeof error.message === "string"
      ? error.message
      : `the server answered ${response.status} ${response.statusText}`.trim();
  return new ApiError(response.status, code, message, response.headers.get("Retry-After"));
}

export async function api(method, path, { body, auth = true, token, headers: extra } = {}) {
  const headers = { Accept: "application/json", ...(extra || {}) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const bearer = token || (auth && session ? session.token : null);
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, "network_error", "cannot reach the server; check your connection");
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  try {
    return await response.json();
  } catch (_) {
    throw new ApiError(response.status, "bad_response", "the server sent something that is not JSON");
  }
}

export function randomKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
