// Clients: every protocol's connections and kept sessions, filtered, sorted and paged on the
// server; one client in detail; disconnect with confirmation.
import { api, html, num, seg, text, useState, when } from "./lib.js";
import {
  Confirm, Fields, Filter, Pager, Problem, Table, useApi, useConfirm, usePaged,
} from "./components.js";

const REFRESH_MS = 5000;

/** The protocol version a client speaks, from what its protocol reports. */
function version(client) {
  const d = client.details || {};
  if (d.mqtt_version) return `MQTT ${d.mqtt_version}`;
  if (client.protocol === "amqp") return "AMQP 0-9-1";
  return d.client_type || client.protocol;
}

function inflight(client) {
  return (client.details || {}).inflight;
}

/** Whether the row is a connection with message counts (a kept session has none). */
const counted = (client) => client.publish_rate != null || client.deliver_rate != null;

/** A rate with the total it comes from as its tooltip. */
const rate = (value, total) => (c) => html`<span title=${`${num(c[total])} since connecting`}>${num(c[value])}</span>`;

const key = (c) => `${c.protocol}/${c.client_id}`;
const link = (c) => `#/clients/${seg(c.protocol)}/${seg(c.client_id)}`;

function kickAsk(client) {
  return {
    title: `Disconnect ${client.client_id}?`,
    detail: `The ${client.protocol} connection of ${client.user || "an unknown user"} from ${client.address || "?"} is closed now; its session stays as the protocol keeps it, and the client may connect again.`,
    confirm: "Disconnect",
    run: () => api("DELETE", `/clients/${seg(client.protocol)}/${seg(client.client_id)}`),
  };
}

function ClientList() {
  const [protocol, setProtocol] = useState("");
  const [connected, setConnected] = useState(false);
  const paged = usePaged("/clients", { protocol, connected: connected ? "true" : "" },
    { sort: "client_id", refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const columns = [
    { key: "protocol", label: "Protocol" },
    { key: "client_id", label: "Client id", render: (c) => html`<a href=${link(c)}>${c.client_id}</a>` },
    { key: "user", label: "User" },
    { key: "address", label: "Address" },
    { key: "version", label: "Version", sortable: false, render: version },
    { key: "connected", label: "Connected", render: (c) => (c.connected ? when(c.connected_at_ms) : "session kept") },
    { key: "subscriptions", label: "Subscriptions", sortable: false,
      render: (c) => html`<span title=${(c.subscriptions || []).join("\n")}>${(c.subscriptions || []).length}</span>` },
    { key: "inflight", label: "In flight", sortable: false, render: (c) => text(inflight(c)) },
    ...(paged.rows.some(counted) ? [
      { key: "publish_rate", label: "In/s", render: rate("publish_rate", "published") },
      { key: "deliver_rate", label: "Out/s", render: rate("deliver_rate", "delivered") },
    ] : []),
    { key: "actions", label: "", sortable: false, render: (c) => c.connected && html`<button
        type="button" class="kick danger" onClick=${() => setAsk(kickAsk(c))}>Disconnect</button>` },
  ];
  return html`<div class="toolbar">
      <${Filter} paged=${paged} id="clients-filter" placeholder="client id, user, address" />
      <select id="clients-protocol" aria-label="protocol" value=${protocol}
        onChange=${(e) => setProtocol(e.currentTarget.value)}>
        <option value="">every protocol</option><option value="mqtt">MQTT</option>
        <option value="amqp">AMQP</option><option value="native">native</option>
      </select>
      <label><input type="checkbox" checked=${connected}
        onChange=${(e) => setConnected(e.currentTarget.checked)} /> connected only</label>
    </div>
    <${Problem} error=${paged.error} />
    <${Table} id="clients" paged=${paged} columns=${columns} rowKey=${key} empty="no clients" />
    <${Pager} paged=${paged} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function ClientDetail({ protocol, clientId }) {
  const client = useApi(`/clients/${seg(protocol)}/${seg(clientId)}`, { refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(client.reload);
  const c = client.data;
  return html`<p><a href="#/clients">‹ all clients</a></p>
    <${Problem} error=${client.error} />
    ${c && html`<section class="card wide" id="client-detail" data-key=${key(c)}>
      <h3>${c.protocol} client ${c.client_id}</h3>
      <${Fields} value=${{ user: c.user, address: c.address, version: version(c),
        connected: c.connected ? when(c.connected_at_ms) : "no (session kept)",
        ...(counted(c) ? { "published (in/s)": `${num(c.published)} (${num(c.publish_rate)}/s)`,
          "delivered (out/s)": `${num(c.delivered)} (${num(c.deliver_rate)}/s)` } : {}) }} />
      <h4>Subscriptions</h4>
      ${(c.subscriptions || []).length ? html`<ul class="subscriptions">${c.subscriptions.map((s) => html`<li>${s}</li>`)}</ul>` : html`<p>none</p>`}
      <h4>Protocol details</h4>
      <${Fields} value=${c.details} />
      ${c.connected && html`<button type="button" class="kick danger"
        onClick=${() => setAsk(kickAsk(c))}>Disconnect</button>`}
    </section>`}
    <${Confirm} ask=${ask} onClose=${close} />`;
}

export function ClientsPage({ rest }) {
  const [protocol, clientId] = rest;
  return html`<h2>Clients</h2>
    ${protocol && clientId !== undefined ? html`<${ClientDetail} protocol=${protocol} clientId=${clientId} />`
      : html`<${ClientList} />`}`;
}
