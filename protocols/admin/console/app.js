// The console's shell: sign-in form, navigation, hash routing, sign-out and idle timeout.
import {
  api, html, isIdle, onSignedOut, render, setIdleLimit, setCsrfToken, useEffect, useState,
} from "./lib.js";
import { Problem, useSubmit } from "./components.js";
import { OverviewPage } from "./overview.js";
import { ClientsPage } from "./clients.js";
import { TopicsPage } from "./topics.js";
import { GroupsPage } from "./groups.js";
import { MessagesPage } from "./messages.js";
import { UsersPage } from "./users.js";
import { PushPage } from "./push.js";

const PAGES = [
  { id: "overview", label: "Overview", page: OverviewPage },
  { id: "clients", label: "Clients", page: ClientsPage, admin: true },
  { id: "topics", label: "Topics & queues", page: TopicsPage },
  { id: "groups", label: "Groups", page: GroupsPage },
  { id: "messages", label: "Messages", page: MessagesPage },
  { id: "push", label: "Push", page: PushPage },
  { id: "users", label: "Users & access", page: UsersPage, admin: true },
];

/** The route in the address: ``#/page/rest...`` -> {page, rest}. */
function currentRoute() {
  const [page = "", ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  return { page: page || "overview", rest: rest.map(decodeURIComponent) };
}

function useRoute() {
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const changed = () => setRoute(currentRoute());
    addEventListener("hashchange", changed);
    return () => removeEventListener("hashchange", changed);
  }, []);
  return route;
}

/** Seconds as "90 seconds" or "30 minutes". */
function duration(seconds) {
  return seconds < 120 ? `${seconds} seconds` : `${Math.round(seconds / 60)} minutes`;
}

function Login({ onSignedIn, notice }) {
  const [user, setUser] = useState("");
  const [password, setPassword] = useState("");
  const form = useSubmit(async () => {
    try {
      const { data } = await api("POST", "/session", { body: { user, password } });
      onSignedIn(data);
    } catch (e) {
      throw e.status === 401 ? new Error("Wrong user name or password.") : e;
    }
  });
  return html`<main class="login-page">
    <form id="login" class="login" onSubmit=${form.submit}>
      <h1>Sluice</h1>
      ${notice && html`<p class="notice" id="login-notice">${notice}</p>`}
      <label>User <input id="login-user" name="user" autocomplete="username" required
        value=${user} onInput=${(e) => setUser(e.currentTarget.value)} /></label>
      <label>Password <input id="login-password" name="password" type="password" required
        autocomplete="current-password" value=${password}
        onInput=${(e) => setPassword(e.currentTarget.value)} /></label>
      <${Problem} error=${form.error} />
      <button id="login-submit" type="submit" disabled=${form.busy}>Sign in</button>
    </form>
  </main>`;
}

function Shell({ session, onSignOut }) {
  const route = useRoute();
  const visible = PAGES.filter((p) => session.admin || !p.admin);
  const current = visible.find((p) => p.id === route.page) || visible[0];
  const Page = current.page;
  return html`<div class="shell">
    <header>
      <span class="brand">Sluice</span>
      <nav>${visible.map((p) => html`<a href=${`#/${p.id}`} data-page=${p.id}
        class=${p === current ? "active" : undefined}>${p.label}</a>`)}</nav>
      <span class="who" id="whoami">${session.user}${session.admin ? " (admin)" : ""}</span>
      <button type="button" id="logout" onClick=${onSignOut}>Sign out</button>
    </header>
    <main id=${`page-${current.id}`} class="page">
      <${Page} session=${session} rest=${current.id === route.page ? route.rest : []} />
    </main>
  </div>`;
}

function App() {
  const [session, setSession] = useState(undefined); // undefined: asking the server
  const [notice, setNotice] = useState(null);

  const signedIn = (value) => {
    setCsrfToken(value.csrf_token);
    setIdleLimit(value.idle_timeout_s);
    setNotice(null);
    setSession(value);
  };
  const signedOut = (why) => {
    setCsrfToken(null);
    setIdleLimit(0);
    setNotice(why);
    setSession(null);
  };

  useEffect(() => {
    api("GET", "/session").then(({ data }) => signedIn(data)).catch(() => signedOut(null));
  }, []);

  useEffect(() => {
    if (!session) return undefined;
    const idle = `Signed out after ${duration(session.idle_timeout_s)} without activity.`;
    onSignedOut(() => signedOut(isIdle() ? idle
      : "Your session ended (signed out elsewhere, or the user changed). Sign in again."));
    const timer = setInterval(() => {
      if (isIdle()) {
        api("DELETE", "/session").catch(() => {});
        signedOut(idle);
      }
    }, 5000);
    return () => clearInterval(timer);
  }, [session]);

  if (session === undefined) return html`<p class="starting">Loading the console…</p>`;
  if (session === null) return html`<${Login} onSignedIn=${signedIn} notice=${notice} />`;
  const signOut = async () => {
    try { await api("DELETE", "/session"); } catch { /* signed out either way */ }
    signedOut("Signed out.");
  };
  return html`<${Shell} session=${session} onSignOut=${signOut} />`;
}

render(html`<${App} />`, document.getElementById("app"));
