// Building blocks shared by the pages: server-side paged lists, sortable tables, page
// controls, confirmation dialogs and error notices.
import { api, html, isIdle, num, text, useCallback, useEffect, useRef, useState } from "./lib.js";

export const PAGE_SIZES = [25, 50, 100, 250];

/**
 * A list route read a page at a time: ``limit``, ``offset``, ``sort`` and ``q`` go to the
 * server, which answers one page and the number of matching rows in X-Total-Count.
 */
export function usePaged(path, params = {}, { sort: initialSort = "", size = 50, refreshMs = 0 } = {}) {
  const [offset, setOffset] = useState(0);
  const [limit, setLimit] = useState(size);
  const [sort, setSort] = useState(initialSort);
  const [q, setQ] = useState("");
  const [state, setState] = useState({ rows: [], total: 0, loading: true, error: null });
  const [generation, setGeneration] = useState(0);
  const key = JSON.stringify(params);

  useEffect(() => { setOffset(0); }, [key, q, sort, limit]);
  useEffect(() => {
    if (!path) return undefined;
    let live = true;
    const load = () => api("GET", path, { params: { ...params, limit, offset, sort, q } })
      .then(({ data, total }) => {
        if (!live) return;
        const rows = Array.isArray(data) ? data : [];
        const count = total ?? offset + rows.length;
        if (rows.length === 0 && offset > 0 && count > 0) {
          setOffset(Math.floor((count - 1) / limit) * limit); // rows went away: the last page
          return;
        }
        setState({ rows, total: count, loading: false, error: null });
      })
      .catch((error) => { if (live) setState((s) => ({ ...s, loading: false, error })); });
    load();
    const timer = refreshMs ? setInterval(() => { if (!isIdle()) load(); }, refreshMs) : null;
    return () => { live = false; if (timer) clearInterval(timer); };
  }, [path, key, limit, offset, sort, q, generation]);

  const reload = useCallback(() => setGeneration((g) => g + 1), []);
  return { ...state, offset, setOffset, limit, setLimit, sort, setSort, q, setQ, reload };
}

/** The filter box of a paged list: sends ``q`` once typing pauses. */
export function Filter({ paged, placeholder = "filter", id }) {
  const [value, setValue] = useState(paged.q);
  useEffect(() => {
    const timer = setTimeout(() => { if (value !== paged.q) paged.setQ(value); }, 300);
    return () => clearTimeout(timer);
  }, [value]);
  return html`<input class="filter" type="search" id=${id} placeholder=${placeholder}
    value=${value} onInput=${(e) => setValue(e.currentTarget.value)} />`;
}

/** Previous / next, the rows shown of how many, and the page size. */
export function Pager({ paged }) {
  const { offset, limit, total, rows } = paged;
  const last = offset + rows.length;
  return html`<div class="pager">
    <button type="button" class="prev" disabled=${offset === 0}
      onClick=${() => paged.setOffset(Math.max(0, offset - limit))}>‹ previous</button>
    <span class="range">${total === 0 ? "none" : `${num(offset + 1)}–${num(last)} of ${num(total)}`}</span>
    <button type="button" class="next" disabled=${last >= total}
      onClick=${() => paged.setOffset(offset + limit)}>next ›</button>
    <select aria-label="rows per page" value=${limit}
      onChange=${(e) => paged.setLimit(Number(e.currentTarget.value))}>
      ${PAGE_SIZES.map((n) => html`<option value=${n}>${n} a page</option>`)}
    </select>
  </div>`;
}

/**
 * A table whose column headers sort on the server (``sort=field``, again for ``-field``).
 * ``columns``: [{key, label, render?(row), sortable?}]; ``rowKey(row)`` names a row
 * (data-key, for tests and links); ``onPick(row)`` makes rows clickable.
 */
export function Table({ paged, columns, rowKey, onPick, id, empty = "nothing to show" }) {
  const header = (column) => {
    if (column.sortable === false || !paged) return html`<th>${column.label}</th>`;
    const field = column.sort || column.key;
    const order = paged.sort === field ? "ascending" : paged.sort === `-${field}` ? "descending" : undefined;
    return html`<th class="sortable" data-sort=${field} aria-sort=${order}>
      <button type="button" class="sort" title="sort by this column; again for the reverse order"
        onClick=${() => paged.setSort(paged.sort === field ? `-${field}` : field)}>
        ${column.label}${order === "ascending" ? " ▲" : order === "descending" ? " ▼" : ""}</button></th>`;
  };
  const rows = paged ? paged.rows : [];
  return html`<table id=${id} class=${paged && paged.loading ? "data loading" : "data"}>
    <thead><tr>${columns.map(header)}</tr></thead>
    <tbody>
      ${rows.length === 0 && html`<tr class="empty"><td colspan=${columns.length}>${empty}</td></tr>`}
      ${rows.map((row, index) => html`<tr key=${rowKey ? rowKey(row) : index} data-key=${rowKey ? rowKey(row) : undefined}
          class=${onPick ? "pickable" : undefined} onClick=${onPick ? () => onPick(row) : undefined}>
        ${columns.map((c) => html`<td class=${`col-${c.key}`}>${c.render ? c.render(row) : text(row[c.key])}</td>`)}
      </tr>`)}
    </tbody>
  </table>`;
}

/** An error from the API, said plainly; a 403 says the user lacks the right. */
export function Problem({ error }) {
  if (!error) return null;
  const text = error.status === 403 ? `Not allowed for this user: ${error.message}` : error.message;
  return html`<p class="problem" role="alert">${text}</p>`;
}

/**
 * A modal question before something that cannot be undone. ``ask`` is {title, detail,
 * confirm, run}; ``run`` is awaited, its error shown in the dialog.
 */
export function Confirm({ ask, onClose }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const no = useRef(null);
  useEffect(() => { setError(null); setBusy(false); if (no.current) no.current.focus(); }, [ask]);
  if (!ask) return null;
  const go = async () => {
    setBusy(true);
    try {
      await ask.run();
      onClose(true);
    } catch (e) {
      setError(e);
      setBusy(false);
    }
  };
  return html`<div class="backdrop">
    <div class="dialog" id="confirm" role="dialog" aria-modal="true" aria-labelledby="confirm-title"
      onKeyDown=${(e) => { if (e.key === "Escape") onClose(false); }}>
      <h3 id="confirm-title">${ask.title}</h3>
      ${ask.detail && html`<p>${ask.detail}</p>`}
      <${Problem} error=${error} />
      <div class="buttons">
        <button type="button" id="confirm-no" ref=${no} onClick=${() => onClose(false)}>Cancel</button>
        <button type="button" id="confirm-yes" class="danger" disabled=${busy}
          onClick=${go}>${ask.confirm || "Yes"}</button>
      </div>
    </div>
  </div>`;
}

/** A dialog state: [ask, open(ask), close(done)]; ``onDone`` runs after a confirmed action. */
export function useConfirm(onDone) {
  const [ask, setAsk] = useState(null);
  const close = (done) => { setAsk(null); if (done && onDone) onDone(); };
  return [ask, setAsk, close];
}

/** A read of one API route (not paged); ``refreshMs`` reads again periodically. */
export function useApi(path, { params, refreshMs = 0, optional = false } = {}) {
  const [state, setState] = useState({ data: null, error: null, loading: true });
  const [generation, setGeneration] = useState(0);
  const key = JSON.stringify(params || {});
  useEffect(() => {
    if (!path) { setState({ data: null, error: null, loading: false }); return undefined; }
    let live = true;
    const load = () => api("GET", path, { params })
      .then(({ data }) => { if (live) setState({ data, error: null, loading: false }); })
      .catch((error) => {
        if (!live) return;
        setState({ data: null, error: optional && error.status === 404 ? null : error, loading: false });
      });
    load();
    const timer = refreshMs ? setInterval(() => { if (!isIdle()) load(); }, refreshMs) : null;
    return () => { live = false; if (timer) clearInterval(timer); };
  }, [path, key, generation]);
  return { ...state, reload: () => setGeneration((g) => g + 1) };
}

/** Key/value pairs of an object as a definition list. */
export function Fields({ value, id }) {
  if (!value || typeof value !== "object") return null;
  return html`<dl class="fields" id=${id}>
    ${Object.entries(value).map(([k, v]) => html`<dt>${k}</dt><dd>${text(v)}</dd>`)}
  </dl>`;
}

/** A form whose submit awaits ``action``; shows its error, calls ``onDone`` after. */
export function useSubmit(action, onDone) {
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    setError(null);
    setBusy(true);
    try {
      await action();
      if (onDone) onDone();
    } catch (e) {
      setError(e);
    }
    setBusy(false);
  };
  return { submit, error, busy };
}
