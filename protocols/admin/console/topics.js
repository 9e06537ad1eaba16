// Topics & queues: native topics and their queues' offsets, MQTT retained messages by topic
// tree, AMQP exchanges, queues and bindings; purge and delete after a confirmation.
import { api, bytes, html, num, seg, text, useState, when } from "./lib.js";
import {
  Confirm, Fields, Filter, Pager, Problem, Table, useApi, useConfirm, usePaged,
} from "./components.js";

const REFRESH_MS = 5000;

function Tabs({ session, current }) {
  const tabs = [["native", "Native topics"], ...(session.admin ? [["retained", "MQTT retained"],
    ["amqp", "AMQP"]] : [])];
  return html`<nav class="tabs">${tabs.map(([id, label]) => html`<a href=${`#/topics/${id}`}
    data-tab=${id} class=${id === current ? "active" : undefined}>${label}</a>`)}</nav>`;
}

function NativeTopics({ session }) {
  const paged = usePaged("/topics", {}, { sort: "name" });
  const columns = [
    { key: "name", label: "Topic", render: (t) => html`<a href=${`#/topics/native/${seg(t.name)}`}>${t.name}</a>` },
    { key: "queue_count", label: "Queues" },
    { key: "message_type", label: "Type" },
    { key: "retention_ms", label: "Retention", render: (t) => (t.retention_ms ? `${num(t.retention_ms / 3600000)} h` : "store default") },
    { key: "compacted", label: "Compacted" },
  ];
  return html`<div class="toolbar"><${Filter} paged=${paged} id="topics-filter" placeholder="topic" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="topics" paged=${paged} columns=${columns} rowKey=${(t) => t.name} empty="no topics" />
    <${Pager} paged=${paged} />`;
}

function TopicDetail({ session, name }) {
  const topic = useApi(`/topics/${seg(name)}`, { refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(() => { location.hash = "#/topics/native"; });
  const t = topic.data;
  const queues = { rows: t ? t.queues : [] };
  return html`<p><a href="#/topics/native">‹ all topics</a></p>
    <${Problem} error=${topic.error} />
    ${t && html`<section class="card wide" id="topic-detail">
      <h3>Topic ${t.name}</h3>
      <${Fields} value=${{ type: t.message_type, queues: t.queue_count, messages: t.messages,
        retention_ms: t.retention_ms, compacted: t.compacted }} />
      <${Table} id="topic-queues" paged=${queues} rowKey=${(q) => q.queue_id} columns=${[
        { key: "queue_id", label: "Queue", sortable: false },
        { key: "min_offset", label: "First offset", sortable: false },
        { key: "max_offset", label: "Next offset", sortable: false },
        { key: "messages", label: "Messages", sortable: false }]} />
      <p><a href=${`#/messages/time/${seg(t.name)}`}>Messages of this topic by time ›</a></p>
      ${session.admin && html`<button type="button" class="danger delete" onClick=${() => setAsk({
        title: `Delete topic ${t.name}?`,
        detail: "Its messages can no longer be read and its consumer groups' offsets on it are dropped.",
        confirm: "Delete topic",
        run: () => api("DELETE", `/topics/${seg(t.name)}`),
      })}>Delete topic</button>`}
    </section>`}
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function Retained() {
  const [prefix, setPrefix] = useState("");
  const paged = usePaged("/mqtt/retained", { prefix }, { sort: "topic" });
  const levels = prefix.split("/").filter((_, i, all) => i < all.length - 1);
  const level = (topic) => {
    const rest = topic.slice(prefix.length).split("/");
    return rest.length > 1 ? html`<a href="#" onClick=${(e) => { e.preventDefault(); setPrefix(`${prefix}${rest[0]}/`); }}
      title="show only this branch">${prefix}${rest[0]}/</a>${rest.slice(1).join("/")}` : topic;
  };
  const columns = [
    { key: "topic", label: "Topic", render: (r) => level(r.topic) },
    { key: "size", label: "Size", render: (r) => bytes(r.size) },
    { key: "qos", label: "QoS" },
    { key: "stored_ms", label: "Stored", render: (r) => when(r.stored_ms ?? r.store_ts ?? r.stored_at_ms) },
  ];
  return html`<div class="toolbar">
      <span class="breadcrumb">
        <a href="#" onClick=${(e) => { e.preventDefault(); setPrefix(""); }}>all</a>
        ${levels.map((name, i) => html` / <a href="#" onClick=${(e) => {
          e.preventDefault(); setPrefix(`${levels.slice(0, i + 1).join("/")}/`); }}>${name}</a>`)}
      </span>
      <${Filter} paged=${paged} id="retained-filter" placeholder="topic contains" />
    </div>
    <${Problem} error=${paged.error} />
    <${Table} id="retained" paged=${paged} columns=${columns} rowKey=${(r) => r.topic} empty="no retained messages" />
    <${Pager} paged=${paged} />`;
}

function AmqpQueues({ vhost }) {
  const paged = usePaged("/queues", { vhost }, { sort: "name", refreshMs: REFRESH_MS });
  const [ask, setAsk, close] = useConfirm(paged.reload);
  const path = (q) => `/queues/${seg(q.vhost)}/${seg(q.name)}`;
  const columns = [
    { key: "vhost", label: "Vhost" },
    { key: "name", label: "Queue" },
    { key: "messages_ready", label: "Ready" },
    { key: "messages_unacknowledged", label: "Unacked" },
    { key: "consumers", label: "Consumers" },
    { key: "publish_rate", label: "In/s" },
    { key: "deliver_rate", label: "Out/s" },
    { key: "ack_rate", label: "Ack/s" },
    { key: "durable", label: "Durable" },
    { key: "actions", label: "", sortable: false, render: (q) => html`<span class="row-actions">
      <button type="button" class="purge" onClick=${() => setAsk({
        title: `Purge queue ${q.name}?`,
        detail: `Every ready message of ${q.name} in vhost ${q.vhost} (${num(q.messages_ready)} now) is settled and will not be delivered; unacknowledged ones stay.`,
        confirm: "Purge", run: () => api("POST", `${path(q)}/purge`),
      })}>Purge</button>
      <button type="button" class="delete danger" onClick=${() => setAsk({
        title: `Delete queue ${q.name}?`,
        detail: `The queue, its bindings and its ${num(q.messages_ready)} ready messages go; its consumers are cancelled.`,
        confirm: "Delete", run: () => api("DELETE", path(q)),
      })}>Delete</button></span>` },
  ];
  return html`<h3>Queues</h3>
    <div class="toolbar"><${Filter} paged=${paged} id="queues-filter" placeholder="queue" /></div>
    <${Problem} error=${paged.error} />
    <${Table} id="queues" paged=${paged} columns=${columns} rowKey=${(q) => `${q.vhost}/${q.name}`} empty="no queues" />
    <${Pager} paged=${paged} />
    <${Confirm} ask=${ask} onClose=${close} />`;
}

function AmqpList({ title, path, vhost, columns, id, rowKey, sort }) {
  const paged = usePaged(path, { vhost }, { sort });
  return html`<h3>${title}</h3>
    <div class="toolbar"><${Filter} paged=${paged} id=${`${id}-filter`} /></div>
    <${Problem} error=${paged.error} />
    <${Table} id=${id} paged=${paged} columns=${columns} rowKey=${rowKey} />
    <${Pager} paged=${paged} />`;
}

function Amqp() {
  const [vhost, setVhost] = useState("");
  const vhosts = useApi("/vhosts", { params: { limit: 1000, sort: "name" } });
  return html`<div class="toolbar">
      <select id="vhost" aria-label="virtual host" value=${vhost} onChange=${(e) => setVhost(e.currentTarget.value)}>
        <option value="">every vhost</option>
        ${(vhosts.data || []).map((v) => html`<option value=${v.name}>${v.name}</option>`)}
      </select>
    </div>
    <${AmqpQueues} vhost=${vhost} />
    <${AmqpList} title="Exchanges" path="/exchanges" vhost=${vhost} id="exchanges" sort="name"
      rowKey=${(x) => `${x.vhost}/${x.name}`} columns=${[
        { key: "vhost", label: "Vhost" }, { key: "name", label: "Exchange", render: (x) => x.name || "(default)" },
        { key: "type", label: "Type" }, { key: "durable", label: "Durable" },
        { key: "auto_delete", label: "Auto-delete" }, { key: "internal", label: "Internal" }]} />
    <${AmqpList} title="Bindings" path="/bindings" vhost=${vhost} id="bindings" sort="source"
      rowKey=${(b) => `${b.vhost}/${b.source}/${b.destination}/${b.routing_key}`} columns=${[
        { key: "vhost", label: "Vhost" }, { key: "source", label: "From", render: (b) => b.source || "(default)" },
        { key: "destination", label: "To" }, { key: "destination_type", label: "Kind" },
        { key: "routing_key", label: "Routing key" },
        { key: "arguments", label: "Arguments", sortable: false, render: (b) => text(b.arguments) }]} />`;
}

export function TopicsPage({ session, rest }) {
  const [tab = "native", name] = rest;
  const current = session.admin || tab === "native" ? tab : "native";
  let body;
  if (current === "retained") body = html`<${Retained} />`;
  else if (current === "amqp") body = html`<${Amqp} />`;
  else if (name !== undefined) body = html`<${TopicDetail} session=${session} name=${name} />`;
  else body = html`<${NativeTopics} session=${session} />`;
  return html`<h2>Topics & queues</h2><${Tabs} session=${session} current=${current} />${body}`;
}
