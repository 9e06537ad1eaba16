// What every page uses: markup (htm bound to preact), the admin API client and formatting.
import { h, render } from "./vendor/preact.mjs";
import htm from "./vendor/htm.mjs";

export { render };
export * from "./vendor/hooks.mjs";

/** Tagged-template markup: every interpolated value is text or an attribute, never HTML. */
export const html = htm.bind(h);

/** An answer of the admin API other than 2xx: its status and the JSON error's message. */
export class ApiError extends Error {
  constructor(status, body) {
    const message = body && typeof body === "object" && body.message ? body.message
      : `the server answered ${status}`;
    super(message);
    this.status = status;
    this.code = body && typeof body === "object" ? body.error : undefined;
  }
}

let csrfToken = null;
let whenSignedOut = () => {};

/** The session's CSRF token, sent with every write; null when signed out. */
export function setCsrfToken(token) { csrfToken = token; }

/** Called once a call answers 401: the session ended (idle timeout, sign-out elsewhere). */
export function onSignedOut(callback) { whenSignedOut = callback; }

/** The query string of ``params`` (undefined, null and "" left out). */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** Path segment, encoded. */
export const seg = encodeURIComponent;

/**
 * Call the admin API: resolves to {data, total, headers}; total is X-Total-Count when the
 * server sent it. Rejects with ApiError; a 401 (other than signing in) also signs out.
 */
export async function api(method, path, { body, params } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && method !== "HEAD" && csrfToken) headers["X-CSRF-Token"] = csrfToken;
  const response = await fetch(path + query(params), {
    method, headers, credentials: "same-origin", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && path !== "/session") whenSignedOut(error);
    throw error;
  }
  const total = response.headers.get("X-Total-Count");
  return { data, total: total === null ? null : Number(total), headers: response.headers };
}

/** A number with thousands separators; "–" for none. */
export function num(value) {
  if (value === undefined || value === null || value === "") return "–";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? value.toLocaleString("en") : value.toLocaleString("en", { maximumFractionDigits: 2 });
}

/** Bytes in B, KiB, MiB, GiB, TiB. */
export function bytes(value) {
  if (value === undefined || value === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = Number(value);
  let unit = 0;
  while (Math.abs(size) >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return `${unit ? size.toFixed(1) : size} ${units[unit]}`;
}

/** Milliseconds since the epoch as local date and time. */
export function when(ms) {
  if (ms === undefined || ms === null) return "–";
  const date = new Date(Number(ms));
  return Number.isNaN(date.getTime()) ? String(ms) : date.toLocaleString("sv");
}

/** Any value as short text for a table cell. */
export function text(value) {
  if (value === undefined || value === null) return "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "number") return num(value);
  if (Array.isArray(value)) return value.map(text).join(", ");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

let lastActivity = Date.now();
for (const event of ["pointerdown", "keydown", "wheel"]) {
  addEventListener(event, () => { lastActivity = Date.now(); }, { passive: true, capture: true });
}

let idleLimitMs = Infinity;

/** The session's idle timeout, from its sign-in answer (0: signed out, never idle). */
export function setIdleLimit(seconds) { idleLimitMs = seconds ? seconds * 1000 : Infinity; }

/**
 * True once nobody clicked, typed or scrolled in the page for the session's idle timeout:
 * periodic refreshes stop then, so a page left open still reaches the timeout.
 */
export function isIdle() { return Date.now() - lastActivity > idleLimitMs; }
