// Groups: consumer groups, one group's members, subscriptions and lag per queue, and moving
// its offsets on a topic to a time (admins).
import { api, html, num, seg, text, useState, when } from "./lib.js";
import {
  Confirm, Fields, Filter, Pager, Problem, Table, useApi, useConfirm, usePaged,
} from "./components.js";

const REFRESH_MS = 5000;

function GroupList() {
  const paged = usePaged("/groups", {}, { sort: "name" });
  const columns = [
    { key: "name", label: "Group", render: (g) => html`<a href=${`#/groups/${seg(g.name)}`}>${g.name}</a>` },
    { key: "consume_mode", label: "Mode" },
    { key: "fifo", label: "FIFO" },
    { key: "retry", label: "Max attempts", sortable: false, render: (g) => text(g.retry && g.retry.max_attempts) },
  ];
  return html`<div class="toolbar"><${Filter} paged=${paged} id="groups-filter" placeholder="group" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="groups" paged=${paged} columns=${columns} rowKey=${(g) => g.name} empty="no groups" />
    <${Pager} paged=${paged} />`;
}

function ResetOffsets({ group, topics, onDone }) {
  const [topic, setTopic] = useState(topics[0] || "");
  const [target, setTarget] = useState("time");
  const [at, setAt] = useState("");
  const [ask, setAsk, close] = useConfirm(onDone);
  const [error, setError] = useState(null);
  const submit = (event) => {
    event.preventDefault();
    setError(null);
    let body;
    if (target === "time") {
      const ms = new Date(at).getTime();
      if (!at || Number.isNaN(ms)) { setError(new Error("Pick the date and time to move the offsets to.")); return; }
      body = { topic, timestamp_ms: ms };
    } else {
      body = { topic, to: target };
    }
    setAsk({
      title: `Move ${group}'s offsets on ${topic}?`,
      detail: target === "time" ? `Each queue's next message becomes the first stored at or after ${when(body.timestamp_ms)}: messages after it are delivered again, or skipped.`
        : `Each queue's next message becomes the ${target} one.`,
      confirm: "Move offsets",
      run: () => api("POST", `/groups/${seg(group)}/reset-offset`, { body }),
    });
  };
  return html`<form class="inline-form" id="reset-offset" onSubmit=${submit}>
    <h4>Reset offsets</h4>
    <label>Topic <input list="group-topics" required value=${topic}
      onInput=${(e) => setTopic(e.currentTarget.value)} /></label>
    <datalist id="group-topics">${topics.map((t) => html`<option value=${t} />`)}</datalist>
    <label>To <select value=${target} onChange=${(e) => setTarget(e.currentTarget.value)}>
      <option value="time">a time</option><option value="earliest">earliest</option>
      <option value="latest">latest</option></select></label>
    ${target === "time" && html`<label>Time <input type="datetime-local" step="1" value=${at}
      onInput=${(e) => setAt(e.currentTarget.value)} /></label>`}
    <button type="submit">Reset…</button>
    <${Problem} error=${error} />
    <${Confirm} ask=${ask} onClose=${close} />
  </form>`;
}

function GroupDetail({ session, name }) {
  const group = useApi(`/groups/${seg(name)}`, { refreshMs: REFRESH_MS });
  const g = group.data;
  const topics = g ? [...new Set([...g.subscriptions.map((s) => s.topic), ...g.lag.map((l) => l.topic)])] : [];
  return html`<p><a href="#/groups">‹ all groups</a></p>
    <${Problem} error=${group.error} />
    ${g && html`<section class="card wide" id="group-detail">
      <h3>Group ${g.name}</h3>
      <${Fields} value=${{ mode: g.consume_mode, fifo: g.fifo, total_lag: g.total_lag, members: g.members.length }} />
      <h4>Lag per queue</h4>
      <${Table} id="group-lag" paged=${{ rows: g.lag }} rowKey=${(l) => `${l.topic}/${l.queue_id}`} columns=${[
        { key: "topic", label: "Topic", sortable: false }, { key: "queue_id", label: "Queue", sortable: false },
        { key: "committed", label: "Committed", sortable: false }, { key: "max_offset", label: "Next offset", sortable: false },
        { key: "inflight", label: "In flight", sortable: false }, { key: "lag", label: "Lag", sortable: false }]} empty="no offsets yet" />
      <h4>Subscriptions</h4>
      <${Table} paged=${{ rows: g.subscriptions }} columns=${[
        { key: "topic", label: "Topic", sortable: false }, { key: "expression", label: "Filter", sortable: false },
        { key: "expression_type", label: "Kind", sortable: false }]} empty="none" />
      <h4>Members</h4>
      <${Table} paged=${{ rows: g.members }} columns=${[
        { key: "client_id", label: "Client", sortable: false },
        { key: "last_heartbeat_ms", label: "Last heartbeat", sortable: false, render: (m) => when(m.last_heartbeat_ms) },
        { key: "queues", label: "Queues", sortable: false, render: (m) => num((m.queues || []).length) }]} empty="none connected" />
      ${session.admin && html`<${ResetOffsets} group=${g.name} topics=${topics} onDone=${group.reload} />`}
    </section>`}`;
}

export function GroupsPage({ session, rest }) {
  const [name] = rest;
  return html`<h2>Groups</h2>
    ${name !== undefined ? html`<${GroupDetail} session=${session} name=${name} />` : html`<${GroupList} />`}`;
}
