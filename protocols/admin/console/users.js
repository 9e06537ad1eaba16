// Users & access (admins): users, their topic and group permissions, MQTT ACL rules, virtual
// hosts and users' permissions on them.
import { api, html, seg, useState } from "./lib.js";
import {
  Confirm, Filter, Pager, Problem, Table, useApi, useConfirm, usePaged, useSubmit,
} from "./components.js";

function Checks({ options, value, onChange, name }) {
  return html`<span class="checks">${options.map((option) => html`<label><input type="checkbox"
    name=${name} value=${option} checked=${value.includes(option)} onChange=${(e) => onChange(
      e.currentTarget.checked ? [...value, option] : value.filter((v) => v !== option))} /> ${option}</label>`)}</span>`;
}

function CreateUser({ onDone }) {
  const [name, setName] = useState("");
  const [password, setPassword] = useState("");
  const [admin, setAdmin] = useState(false);
  const form = useSubmit(() => api("POST", "/users", { body: { name, password, admin } }), () => {
    setName(""); setPassword(""); setAdmin(false); onDone();
  });
  return html`<form class="inline-form" id="user-create" onSubmit=${form.submit}>
    <h4>New user</h4>
    <label>Name <input id="new-user-name" required value=${name} onInput=${(e) => setName(e.currentTarget.value)} /></label>
    <label>Password <input id="new-user-password" type="password" required autocomplete="new-password"
      value=${password} onInput=${(e) => setPassword(e.currentTarget.value)} /></label>
    <label><input id="new-user-admin" type="checkbox" checked=${admin} onChange=${(e) => setAdmin(e.currentTarget.checked)} /> admin</label>
    <button type="submit" id="user-create-submit" disabled=${form.busy}>Create</button>
    <${Problem} error=${form.error} />
  </form>`;
}

function SetPassword({ user, onDone }) {
  const [password, setPassword] = useState("");
  const form = useSubmit(() => api("PUT", `/users/${seg(user)}/password`, { body: { password } }), onDone);
  return html`<form class="inline-form" id="set-password" onSubmit=${form.submit}>
    <label>New password for ${user} <input type="password" required autocomplete="new-password"
      value=${password} onInput=${(e) => setPassword(e.currentTarget.value)} /></label>
    <button type="submit" disabled=${form.busy}>Set password</button>
    <button type="button" onClick=${onDone}>Cancel</button>
    <${Problem} error=${form.error} />
  </form>`;
}

function Permissions({ user }) {
  const permissions = useApi(`/users/${seg(user)}/permissions`);
  const [kind, setKind] = useState("topic");
  const [pattern, setPattern] = useState("");
  const [actions, setActions] = useState(["subscribe"]);
  const [ask, setAsk, close] = useConfirm(permissions.reload);
  const form = useSubmit(() => api("POST", `/users/${seg(user)}/permissions`, { body: { kind, pattern, actions } }),
    () => { setPattern(""); permissions.reload(); });
  return html`<section class="card wide" id="permissions">
    <h3>Permissions of ${user}</h3>
    <${Problem} error=${permissions.error} />
    <${Table} paged=${{ rows: permissions.data || [] }} rowKey=${(p) => `${p.kind}/${p.pattern}`} empty="none" columns=${[
      { key: "kind", label: "Kind", sortable: false }, { key: "pattern", label: "Pattern", sortable: false },
      { key: "actions", label: "Actions", sortable: false, render: (p) => (p.actions || []).join(", ") },
      { key: "revoke", label: "", sortable: false, render: (p) => html`<button type="button" class="danger" onClick=${() => setAsk({
        title: `Revoke ${user}'s ${p.kind} permission on ${p.pattern}?`, confirm: "Revoke",
        detail: "It takes effect on the user's next request and next connection.",
        run: () => api("DELETE", `/users/${seg(user)}/permissions`, { params: { kind: p.kind, pattern: p.pattern } }),
      })}>Revoke</button>` }]} />
    <form class="inline-form" id="grant" onSubmit=${form.submit}>
      <label>Kind <select value=${kind} onChange=${(e) => setKind(e.currentTarget.value)}>
        <option value="topic">topic</option><option value="group">group</option></select></label>
      <label>Pattern <input id="grant-pattern" required placeholder="orders-* or a name" value=${pattern}
        onInput=${(e) => setPattern(e.currentTarget.value)} /></label>
      <${Checks} options=${["publish", "subscribe", "admin"]} value=${actions} onChange=${setActions} />
      <button type="submit" disabled=${form.busy}>Grant</button>
      <${Problem} error=${form.error} />
    </form>
    <${Confirm} ask=${ask} onClose=${close} />
  </section>`;
}

function Users() {
  const paged = usePaged("/users", {}, { sort: "name" });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const [passwordFor, setPasswordFor] = useState(null);
  const [permissionsOf, setPermissionsOf] = useState(null);
  const columns = [
    { key: "name", label: "User" },
    { key: "admin", label: "Admin" },
    { key: "actions", label: "", sortable: false, render: (u) => html`<span class="row-actions">
      <button type="button" class="permissions" onClick=${() => setPermissionsOf(u.name)}>Permissions</button>
      <button type="button" class="password" onClick=${() => setPasswordFor(u.name)}>Set password</button>
      <button type="button" class="delete danger" onClick=${() => setAsk({
        title: `Delete user ${u.name}?`, confirm: "Delete user",
        detail: "The user can no longer sign in; its open sessions end on their next request.",
        run: () => api("DELETE", `/users/${seg(u.name)}`),
      })}>Delete</button></span>` },
  ];
  return html`<${CreateUser} onDone=${paged.reload} />
    ${passwordFor && html`<${SetPassword} user=${passwordFor} onDone=${() => setPasswordFor(null)} />`}
    <div class="toolbar"><${Filter} paged=${paged} id="users-filter" placeholder="user" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="users" paged=${paged} columns=${columns} rowKey=${(u) => u.name} />
    <${Pager} paged=${paged} />
    ${permissionsOf && html`<${Permissions} user=${permissionsOf} />`}
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function Acl() {
  const paged = usePaged("/acl", {}, { sort: "pattern" });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const [user, setUser] = useState("*");
  const [pattern, setPattern] = useState("");
  const [actions, setActions] = useState(["subscribe"]);
  const [effect, setEffect] = useState("allow");
  const form = useSubmit(() => api("POST", "/acl", { body: { user, pattern, actions, effect } }),
    () => { setPattern(""); paged.reload(); });
  const columns = [
    { key: "user", label: "User" }, { key: "pattern", label: "Topic filter" },
    { key: "actions", label: "Actions", sortable: false, render: (r) => (r.actions || []).join(", ") },
    { key: "effect", label: "Effect" },
    { key: "remove", label: "", sortable: false, render: (r) => html`<button type="button" class="danger" onClick=${() => setAsk({
      title: `Remove the ${r.effect} rule on ${r.pattern} for ${r.user}?`, confirm: "Remove",
      run: () => api("DELETE", "/acl", { params: { pattern: r.pattern, effect: r.effect, user: r.user } }),
    })}>Remove</button>` },
  ];
  return html`<form class="inline-form" id="acl-add" onSubmit=${form.submit}>
      <h4>New rule</h4>
      <label>User <input required value=${user} onInput=${(e) => setUser(e.currentTarget.value)} /></label>
      <label>Topic filter <input id="acl-pattern" required placeholder="devices/%u/#" value=${pattern}
        onInput=${(e) => setPattern(e.currentTarget.value)} /></label>
      <${Checks} options=${["publish", "subscribe"]} value=${actions} onChange=${setActions} />
      <label>Effect <select value=${effect} onChange=${(e) => setEffect(e.currentTarget.value)}>
        <option value="allow">allow</option><option value="deny">deny</option></select></label>
      <button type="submit" disabled=${form.busy}>Add rule</button>
      <${Problem} error=${form.error} />
    </form>
    <div class="toolbar"><${Filter} paged=${paged} id="acl-filter" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="acl" paged=${paged} columns=${columns} rowKey=${(r) => `${r.user}/${r.effect}/${r.pattern}`} empty="no rules" />
    <${Pager} paged=${paged} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function VhostPermissions({ onChanged }) {
  const paged = usePaged("/vhost-permissions", {}, { sort: "vhost" });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const [vhost, setVhost] = useState("/");
  const [user, setUser] = useState("");
  const [rights, setRights] = useState({ configure: ".*", write: ".*", read: ".*" });
  const form = useSubmit(() => api("PUT", `/vhosts/${seg(vhost)}/permissions/${seg(user)}`, { body: rights }),
    () => { paged.reload(); onChanged(); });
  const columns = [
    { key: "vhost", label: "Vhost" }, { key: "user", label: "User" },
    { key: "configure", label: "Configure" }, { key: "write", label: "Write" }, { key: "read", label: "Read" },
    { key: "clear", label: "", sortable: false, render: (p) => html`<button type="button" class="danger" onClick=${() => setAsk({
      title: `Clear ${p.user}'s permission on vhost ${p.vhost}?`, confirm: "Clear",
      run: () => api("DELETE", `/vhosts/${seg(p.vhost)}/permissions/${seg(p.user)}`),
    })}>Clear</button>` },
  ];
  return html`<h3>Permissions on virtual hosts</h3>
    <form class="inline-form" id="vhost-permission" onSubmit=${form.submit}>
      <label>Vhost <input required value=${vhost} onInput=${(e) => setVhost(e.currentTarget.value)} /></label>
      <label>User <input required value=${user} onInput=${(e) => setUser(e.currentTarget.value)} /></label>
      ${["configure", "write", "read"].map((right) => html`<label>${right} <input size="8" value=${rights[right]}
        onInput=${(e) => setRights({ ...rights, [right]: e.currentTarget.value })} /></label>`)}
      <button type="submit" disabled=${form.busy}>Set</button>
      <${Problem} error=${form.error} />
    </form>
    <div class="toolbar"><${Filter} paged=${paged} id="vhost-permissions-filter" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="vhost-permissions" paged=${paged} columns=${columns} rowKey=${(p) => `${p.vhost}/${p.user}`} empty="none" />
    <${Pager} paged=${paged} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function Vhosts() {
  const paged = usePaged("/vhosts", {}, { sort: "name" });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const [name, setName] = useState("");
  const form = useSubmit(() => api("POST", "/vhosts", { body: { name } }), () => { setName(""); paged.reload(); });
  const columns = [
    { key: "name", label: "Vhost" }, { key: "exchanges", label: "Exchanges" }, { key: "queues", label: "Queues" },
    { key: "messages_ready", label: "Ready" },
    { key: "delete", label: "", sortable: false, render: (v) => html`<button type="button" class="danger" onClick=${() => setAsk({
      title: `Delete vhost ${v.name}?`, confirm: "Delete vhost",
      detail: "Its exchanges, queues and bindings go with it, and its connections are closed.",
      run: () => api("DELETE", `/vhosts/${seg(v.name)}`),
    })}>Delete</button>` },
  ];
  return html`<form class="inline-form" id="vhost-create" onSubmit=${form.submit}>
      <label>New vhost <input id="new-vhost" required value=${name} onInput=${(e) => setName(e.currentTarget.value)} /></label>
      <button type="submit" disabled=${form.busy}>Create</button>
      <${Problem} error=${form.error} />
    </form>
    <div class="toolbar"><${Filter} paged=${paged} id="vhosts-filter" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="vhosts" paged=${paged} columns=${columns} rowKey=${(v) => v.name} />
    <${Pager} paged=${paged} />
    <${VhostPermissions} onChanged=${paged.reload} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

const TABS = [["users", "Users", Users], ["acl", "MQTT ACL", Acl], ["vhosts", "Virtual hosts", Vhosts]];

export function UsersPage({ rest }) {
  const [tab = "users"] = rest;
  const current = TABS.find(([id]) => id === tab) || TABS[0];
  const Section = current[2];
  return html`<h2>Users & access</h2>
    <nav class="tabs">${TABS.map(([id, label]) => html`<a href=${`#/users/${id}`} data-tab=${id}
      class=${id === current[0] ? "active" : undefined}>${label}</a>`)}</nav>
    <${Section} />`;
}
