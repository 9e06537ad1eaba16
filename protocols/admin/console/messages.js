// Messages: look one up by id, a topic's by business key or by store time; headers,
// properties, the body as text, pretty JSON or hex, and the message's trace.
import { api, bytes, html, seg, text, useEffect, useState, when } from "./lib.js";
import { Fields, Problem, Table } from "./components.js";

/** The bytes of a base64 string. */
function decode(base64) {
  const raw = atob(base64 || "");
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) out[i] = raw.charCodeAt(i);
  return out;
}

/** Offset, sixteen bytes in hex and their printable characters, a line each. */
export function hexDump(data) {
  const lines = [];
  for (let at = 0; at < data.length; at += 16) {
    const row = data.subarray(at, at + 16);
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const chars = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${chars}`);
  }
  return lines.join("\n");
}

function prettyJson(body) {
  if (body === null || body === undefined) return null;
  try { return JSON.stringify(JSON.parse(body), null, 2); } catch { return null; }
}

function Body({ message }) {
  const json = prettyJson(message.body_text);
  const modes = [...(json !== null ? ["json"] : []), ...(message.body_text !== null && message.body_text !== undefined ? ["text"] : []), "hex"];
  const [mode, setMode] = useState(modes[0]);
  useEffect(() => setMode(modes[0]), [message.msg_id, message.topic]);
  const shown = mode === "json" ? json : mode === "text" ? message.body_text : hexDump(decode(message.body_base64));
  return html`<div class="body">
    <div class="tabs small">${modes.map((m) => html`<button type="button" data-mode=${m}
      class=${m === mode ? "active" : undefined} onClick=${() => setMode(m)}>${m === "json" ? "JSON" : m}</button>`)}
      <span class="muted">${bytes(message.size ?? decode(message.body_base64).length)}</span></div>
    <pre id="message-body" data-mode=${mode}>${shown}</pre>
  </div>`;
}

function Trace({ message }) {
  const [trace, setTrace] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    setTrace(null); setError(null);
    api("GET", `/messages/${seg(message.msg_id)}/trace`, { params: { topic: message.topic } })
      .then(({ data }) => setTrace(data)).catch(setError);
  }, [message.msg_id, message.topic]);
  return html`<h4>Trace</h4>
    <${Problem} error=${error} />
    ${trace && html`<${Table} id="trace" paged=${{ rows: trace.events }} empty="no events recorded" columns=${[
      { key: "time_ms", label: "Time", sortable: false, render: (e) => when(e.time_ms) },
      { key: "event", label: "Event", sortable: false }, { key: "group", label: "Group", sortable: false },
      { key: "client", label: "Client", sortable: false }, { key: "attempt", label: "Attempt", sortable: false },
      { key: "detail", label: "Detail", sortable: false }]} />
      ${trace.truncated && html`<p class="muted">Only the newest ${trace.max_events} events are kept.</p>`}`}`;
}

/** One message in full. */
export function MessageView({ message }) {
  return html`<section class="card wide message" id="message" data-msg-id=${message.msg_id}>
    <h3>Message ${message.msg_id}</h3>
    <${Fields} id="message-headers" value=${{ topic: message.topic, queue: message.queue_id,
      offset: message.queue_offset, tag: message.tag, keys: (message.keys || []).join(", "),
      born: when(message.born_ts), stored: when(message.store_ts), size: bytes(message.size) }} />
    <h4>Properties</h4>
    ${message.properties && Object.keys(message.properties).length
      ? html`<${Fields} id="message-properties" value=${message.properties} />` : html`<p class="muted">none</p>`}
    <h4>Body</h4>
    <${Body} message=${message} />
    ${message.same_id && message.same_id.length > 0 && html`<p class="muted">
      ${message.same_id.length} more message(s) with this id, in: ${message.same_id.map((m) => m.topic).join(", ")}</p>`}
    <${Trace} message=${message} />
  </section>`;
}

function MessageList({ messages, onPick }) {
  return html`<${Table} id="message-list" paged=${{ rows: messages }} rowKey=${(m) => `${m.topic}/${m.msg_id}`}
    onPick=${onPick} empty="no messages" columns=${[
      { key: "msg_id", label: "Id", sortable: false }, { key: "store_ts", label: "Stored", sortable: false, render: (m) => when(m.store_ts) },
      { key: "tag", label: "Tag", sortable: false }, { key: "keys", label: "Keys", sortable: false, render: (m) => (m.keys || []).join(", ") },
      { key: "size", label: "Size", sortable: false, render: (m) => bytes(m.size) },
      { key: "body_text", label: "Body", sortable: false, render: (m) => (m.body_text === null ? "(binary)" : text(m.body_text).slice(0, 80)) }]} />`;
}

/** ``after`` of the Link header's rel="next" URL, if any. */
function nextCursor(headers) {
  const link = headers.get("Link") || "";
  const match = /<([^>]+)>\s*;\s*rel="?next"?/.exec(link);
  return match ? new URL(match[1], location.href).searchParams.get("after") : null;
}

const toMs = (local) => (local ? new Date(local).getTime() : undefined);

export function MessagesPage({ rest }) {
  const [how, prefill] = rest;
  const [mode, setMode] = useState(how === "key" || how === "time" ? how : "id");
  const [id, setId] = useState(how === "id" && prefill ? prefill : "");
  const [topic, setTopic] = useState(how !== "id" && prefill ? prefill : "");
  const [key, setKey] = useState("");
  const [from, setFrom] = useState("");
  const [to, setTo] = useState("");
  const [result, setResult] = useState(null);
  const [picked, setPicked] = useState(null);
  const [error, setError] = useState(null);

  const run = async (event, after) => {
    if (event) event.preventDefault();
    setError(null);
    setPicked(null);
    try {
      if (mode === "id") {
        const { data } = await api("GET", `/messages/${seg(id.trim())}`);
        setResult({ one: data });
      } else {
        const params = mode === "key" ? { key, after } : { from: toMs(from) ?? 0, to: toMs(to), limit: 100 };
        const { data, headers } = await api("GET", `/topics/${seg(topic.trim())}/messages`, { params });
        setResult({ list: data, next: mode === "key" ? nextCursor(headers) : null });
      }
    } catch (e) {
      setResult(null);
      setError(e.status === 404 && mode === "id" ? new Error(`No message ${id} in a topic you may read.`) : e);
    }
  };

  return html`<h2>Messages</h2>
    <nav class="tabs">${[["id", "By id"], ["key", "By key"], ["time", "By time"]].map(([m, label]) => html`
      <button type="button" data-tab=${m} class=${m === mode ? "active" : undefined}
        onClick=${() => { setMode(m); setResult(null); setError(null); }}>${label}</button>`)}</nav>
    <form class="inline-form" id="message-lookup" onSubmit=${(e) => run(e)}>
      ${mode === "id" && html`<label>Message id <input id="msg-id" required size="40" value=${id}
        onInput=${(e) => setId(e.currentTarget.value)} /></label>`}
      ${mode !== "id" && html`<label>Topic <input id="msg-topic" required value=${topic}
        onInput=${(e) => setTopic(e.currentTarget.value)} /></label>`}
      ${mode === "key" && html`<label>Key <input id="msg-key" required value=${key}
        onInput=${(e) => setKey(e.currentTarget.value)} /></label>`}
      ${mode === "time" && html`<label>From <input id="msg-from" type="datetime-local" step="1" value=${from}
          onInput=${(e) => setFrom(e.currentTarget.value)} /></label>
        <label>To <input id="msg-to" type="datetime-local" step="1" value=${to}
          onInput=${(e) => setTo(e.currentTarget.value)} /></label>`}
      <button type="submit" id="msg-go">Look up</button>
    </form>
    <${Problem} error=${error} />
    ${result && result.one && html`<${MessageView} message=${result.one} />`}
    ${result && result.list && html`<${MessageList} messages=${result.list} onPick=${setPicked} />
      ${result.next && html`<button type="button" id="msg-next" onClick=${() => run(null, result.next)}>next page ›</button>`}
      ${mode === "time" && result.list.length === 100 && html`<p class="muted">The first 100 in the range; narrow it to see later ones.</p>`}`}
    ${picked && html`<${MessageView} message=${picked} />`}`;
}
