// Overview: health, role and cluster, connections, message totals, store, alarms, and charts
// of the last hour from /overview/history, read again every few seconds.
import { bytes, html, text } from "./lib.js";
import { Fields, Problem, useApi } from "./components.js";
import { Chart } from "./charts.js";

const REFRESH_MS = 5000;

const RATES = [["published_per_s", "published/s"], ["delivered_per_s", "delivered/s"],
  ["acked_per_s", "acked/s"]];
const CONNECTIONS = [["connections_mqtt", "MQTT"], ["connections_amqp", "AMQP"],
  ["connections_native", "native"]];

function Card({ title, id, children }) {
  return html`<section class="card" id=${id}><h3>${title}</h3>${children}</section>`;
}

function Alarms({ alarms }) {
  if (!Array.isArray(alarms)) return null;
  return html`<${Card} title="Alarms" id="alarms">
    <ul class="alarms">${alarms.map((alarm) => html`<li class=${alarm.on ? "alarm on" : "alarm off"}
        data-alarm=${alarm.name}>
      <strong>${alarm.name}</strong> ${alarm.on ? "raised" : "clear"}
      ${alarm.detail && html`<div class="muted">${alarm.detail}</div>`}
    </li>`)}</ul>
  </${Card}>`;
}

/** Each check of the health report by its status (the store, the metadata, memory...). */
function checks(health) {
  const out = {};
  for (const [name, value] of Object.entries(health || {})) {
    if (name === "status" || name === "cluster") continue;
    out[name] = value && typeof value === "object" && "status" in value ? value.status : value;
  }
  return out;
}

function Cluster() {
  const cluster = useApi("/cluster", { refreshMs: REFRESH_MS, optional: true });
  if (!cluster.data) return null;
  const { nodes, ...summary } = cluster.data;
  return html`<${Card} title="Cluster" id="cluster">
    <${Fields} value=${summary} />
    ${Array.isArray(nodes) && html`<table class="data"><thead><tr>
        ${Object.keys(nodes[0] || {}).map((k) => html`<th>${k}</th>`)}</tr></thead>
      <tbody>${nodes.map((node) => html`<tr>${Object.values(node).map((v) => html`<td>${text(v)}</td>`)}</tr>`)}</tbody>
    </table>`}
  </${Card}>`;
}

function Summary({ overview }) {
  const { status, role, health, connections, messages, store, alarms } = overview;
  return html`<div class="cards">
    <${Card} title="Health" id="health">
      <p class=${`status ${status === "ok" ? "ok" : "bad"}`}>${text(status)}</p>
      <p>role: <strong id="role">${text(role)}</strong></p>
      ${health && html`<${Fields} value=${checks(health)} />`}
    </${Card}>
    ${connections && html`<${Card} title="Connections" id="connections"><${Fields} value=${connections} /></${Card}>`}
    ${messages && html`<${Card} title="Messages since start" id="messages-totals"><${Fields} value=${messages} /></${Card}>`}
    ${store && html`<${Card} title="Store" id="store">
      <dl class="fields">${Object.entries(store).map(([k, v]) => html`<dt>${k.replace(/_bytes$/, "")}</dt>
        <dd>${/bytes$/.test(k) ? bytes(v) : text(v)}</dd>`)}</dl>
    </${Card}>`}
    <${Alarms} alarms=${alarms} />
  </div>`;
}

function History() {
  const history = useApi("/overview/history", { refreshMs: REFRESH_MS });
  if (history.error) return html`<${Problem} error=${history.error} />`;
  if (!history.data) return null;
  const { t = [], series = {} } = history.data;
  const pick = (names) => names.filter(([key]) => key in series)
    .map(([key, label]) => ({ label, values: series[key] }));
  return html`<div class="charts">
    <${Chart} id="chart-rates" title="Messages per second" t=${t} series=${pick(RATES)} />
    <${Chart} id="chart-connections" title="Connections" t=${t} series=${pick(CONNECTIONS)} />
    <${Chart} id="chart-store" title="Store size" t=${t} unit="bytes"
      series=${pick([["store_bytes", "store"]])} />
  </div>`;
}

export function OverviewPage() {
  const overview = useApi("/overview", { refreshMs: REFRESH_MS });
  return html`<h2>Overview</h2>
    <${Problem} error=${overview.error} />
    ${overview.data && html`<${Summary} overview=${overview.data} />`}
    <${Cluster} />
    <${History} />`;
}
