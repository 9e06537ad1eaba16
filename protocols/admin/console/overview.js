// Overview: health, role and cluster, connections, message totals, store, alarms, and charts
// of the last hour from /overview/history, read again every few seconds.
import { bytes, html, num, text } from "./lib.js";
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
  if (!alarms) return null;
  const entries = Array.isArray(alarms) ? alarms.map((a) => [a.name || a.kind, a])
    : Object.entries(alarms);
  return html`<${Card} title="Alarms" id="alarms">
    <ul class="alarms">${entries.map(([name, alarm]) => {
      const on = typeof alarm === "object" && alarm !== null ? Boolean(alarm.active ?? alarm.raised ?? alarm.on) : Boolean(alarm);
      return html`<li class=${on ? "alarm on" : "alarm off"} data-alarm=${name}>
        <strong>${name}</strong> ${on ? "raised" : "clear"}
        ${typeof alarm === "object" && alarm !== null && html`<${Fields} value=${alarm} />`}
      </li>`;
    })}</ul>
  </${Card}>`;
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
  const { health, role, connections, messages, store, alarms, ...rest } = overview;
  const status = health && typeof health === "object" ? health.status : health;
  return html`<div class="cards">
    <${Card} title="Health" id="health">
      <p class=${`status ${status === "ok" ? "ok" : "bad"}`}>${text(status)}</p>
      ${role !== undefined && html`<p>role: <strong id="role">${text(role)}</strong></p>`}
      ${health && typeof health === "object" && html`<${Fields} value=${health} />`}
    </${Card}>
    ${connections && html`<${Card} title="Connections" id="connections">
      ${typeof connections === "object" ? html`<${Fields} value=${connections} />` : num(connections)}
    </${Card}>`}
    ${messages && html`<${Card} title="Messages" id="messages-totals"><${Fields} value=${messages} /></${Card}>`}
    ${store && html`<${Card} title="Store" id="store">
      <dl class="fields">${Object.entries(store).map(([k, v]) => html`<dt>${k}</dt>
        <dd>${/bytes|free|size|used/.test(k) && typeof v === "number" ? bytes(v) : text(v)}</dd>`)}</dl>
    </${Card}>`}
    <${Alarms} alarms=${alarms} />
    ${Object.entries(rest).map(([k, v]) => html`<${Card} title=${k}>
      ${v && typeof v === "object" ? html`<${Fields} value=${v} />` : text(v)}</${Card}>`)}
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
