// Push: push subscriptions with their state and counters; pause, resume and delete one; one
// subscription's settings, statistics and last error.
import { api, html, num, seg, text, useState } from "./lib.js";
import {
  Confirm, Fields, Filter, Pager, Problem, Table, useApi, useConfirm, usePaged,
} from "./components.js";

const REFRESH_MS = 5000;

/** Where a subscription's events come from: a topic (and subject filter) or an AMQP queue. */
function source(s) {
  if (s.queue) return `queue ${s.vhost}/${s.queue}`;
  return s.subject_filter ? `${s.topic} (${s.subject_filter})` : s.topic;
}

const stat = (name) => (s) => num((s.stats || {})[name]);
const p99 = (s) => { const l = (s.stats || {}).latency_ms || {}; return l.p99 == null ? "-" : `${num(l.p99)} ms`; };
const path = (name) => `/push-subscriptions/${seg(name)}`;

function deleteAsk(s) {
  return {
    title: `Delete push subscription ${s.name}?`,
    detail: `Nothing more is pushed to ${s.sink}; events already stored stay in ${source(s)}.`,
    confirm: "Delete",
    run: () => api("DELETE", path(s.name)),
  };
}

/** Pause or resume (no question: either can be undone), then ``done``. */
function Toggle({ s, done, onError }) {
  const paused = s.paused || (s.stats || {}).state === "paused";
  const action = paused ? "resume" : "pause";
  const go = () => api("POST", `${path(s.name)}/${action}`).then(done, onError);
  return html`<button type="button" class=${`push-${action}`} onClick=${go}>${paused ? "Resume" : "Pause"}</button>`;
}

function PushList() {
  const paged = usePaged("/push-subscriptions", {}, { sort: "name", refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const [error, setError] = useState(null);
  const columns = [
    { key: "name", label: "Name", render: (s) => html`<a href=${`#/push/${seg(s.name)}`}>${s.name}</a>` },
    { key: "source", label: "Source", sortable: false, render: source },
    { key: "sink", label: "Sink" },
    { key: "state", label: "State", sortable: false, render: (s) => text((s.stats || {}).state) },
    { key: "delivered", label: "Delivered", sortable: false, render: stat("delivered") },
    { key: "failed", label: "Failed", sortable: false, render: stat("failed") },
    { key: "retrying", label: "Retrying", sortable: false, render: stat("retrying") },
    { key: "lag", label: "Lag", sortable: false, render: stat("lag") },
    { key: "p99", label: "p99", sortable: false, render: p99 },
    { key: "actions", label: "", sortable: false, render: (s) => html`<${Toggle} s=${s} done=${paged.reload} onError=${setError} />
      <button type="button" class="push-delete danger" onClick=${() => setAsk(deleteAsk(s))}>Delete</button>` },
  ];
  return html`<div class="toolbar"><${Filter} paged=${paged} id="push-filter" placeholder="name, sink" /></div>
    <${Problem} error=${paged.error || error} />
    <${Table} id="push-subscriptions" paged=${paged} columns=${columns} rowKey=${(s) => s.name}
      empty="no push subscriptions (create one with sluice push create)" />
    <${Pager} paged=${paged} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function PushDetail({ name }) {
  const found = useApi(path(name), { refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(() => { location.hash = "#/push"; });
  const [error, setError] = useState(null);
  const s = found.data;
  const stats = (s && s.stats) || {};
  const latency = stats.latency_ms || {};
  return html`<p><a href="#/push">‹ all push subscriptions</a></p>
    <${Problem} error=${found.error || error} />
    ${s && html`<section class="card wide" id="push-detail" data-name=${s.name}>
      <h3>Push subscription ${s.name}</h3>
      <${Fields} id="push-settings" value=${{ owner: s.owner, source: source(s), sink: s.sink, format: s.format,
        filters: s.filters && s.filters.length ? JSON.stringify(s.filters) : "none",
        transform: s.transform || "none", concurrency: s.concurrency,
        "rate limit": s.rate_limit ? `${s.rate_limit}/s` : "unlimited", "timeout (ms)": s.timeout_ms,
        "max attempts": s.max_attempts, "dead letters to": s.dead_letter_topic || "(default)",
        ordered: s.ordered, "replies to": s.reply_topic || "(dropped)" }} />
      <h4>Statistics</h4>
      <${Fields} id="push-stats" value=${{ state: stats.state, delivered: stats.delivered, failed: stats.failed,
        retrying: stats.retrying, "dead-lettered": stats.dead_lettered, replies: stats.replies, lag: stats.lag,
        "latency p50 (ms)": latency.p50, "latency p99 (ms)": latency.p99,
        "last status": stats.last_status, "last error": stats.last_error || "none" }} />
      <div class="buttons">
        <${Toggle} s=${s} done=${found.reload} onError=${setError} />
        <button type="button" class="push-delete danger" onClick=${() => setAsk(deleteAsk(s))}>Delete</button>
      </div>
    </section>`}
    <${Confirm} ask=${ask} onClose=${close} />`;
}

export function PushPage({ rest }) {
  const [name] = rest;
  return html`<h2>Push subscriptions</h2>
    ${name !== undefined ? html`<${PushDetail} name=${name} />` : html`<${PushList} />`}`;
}
