// Live telemetry dashboard: reads the results topic of `sluice analytics telemetry` through the
// admin API's tail stream (newline-delimited JSON) and redraws the charts as windows arrive.
// A result is one device's window: {device, window_start_ms, avg_temperature, min_temperature,
// max_temperature, avg_humidity, min_battery, readings, anomaly, latest_ts}. A window published
// again (the job updates open windows every micro-batch) replaces the earlier one.
"use strict";

const params = new URLSearchParams(location.search);
const TOPIC = params.get("topic") || "telemetry.results";
const MINUTES = params.get("minutes") || "60";
const WINDOWS_KEPT = 120;   // per device
const TILES = 12;
const RENDER_EVERY_MS = 250;
const RETRY_MS = 2000;
const COLOR = {
  line: "#1f6fd1", band: "rgba(31, 111, 209, 0.18)", anomaly: "#d1495b",
  bars: "#2a9d8f", humidity: "#8d6cc4", axis: "#9aa3b2", text: "#5a6272",
};

const byDevice = new Map();   // device -> Map(window start ms -> result)
let selected = params.get("device");
let renderTimer = null;
let newestReadingTs = 0;

// What tests and benchmarks read: results received, and for each live result that carried a
// newer reading, how long that reading took from the device to this page (ms).
window.sluiceDashboard = { received: 0, latenciesMs: [], renders: 0 };

const $ = (id) => document.getElementById(id);

function credentials() {
  // The page signs in with its own form: the API never sends a Basic challenge, so a 401 shows
  // the form again rather than a browser prompt.
  const token = sessionStorage.getItem("sluice.auth");
  return token ? { Authorization: "Basic " + token } : {};
}

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.className = "status " + (kind || "");
}

async function problem(response) {
  try {
    const body = await response.json();
    return body.message || response.statusText;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

function retry(reason) {
  setStatus(`reconnecting: ${reason}`, "down");
  setTimeout(connect, RETRY_MS);
}

function askForLogin(reason) {
  setStatus("signed out", "down");
  $("login-error").textContent = sessionStorage.getItem("sluice.auth") ? reason : "";
  $("login").hidden = false;
  $("board").hidden = true;
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = btoa(unescape(encodeURIComponent(`${$("user").value}:${$("password").value}`)));
  sessionStorage.setItem("sluice.auth", token);
  $("login").hidden = true;
  $("board").hidden = false;
  connect();
});

async function connect() {
  setStatus("connecting");
  let response;
  try {
    response = await fetch(`/topics/${encodeURIComponent(TOPIC)}/tail?minutes=${MINUTES}`,
                           { headers: credentials(), cache: "no-store" });
  } catch (error) {
    return retry(`cannot reach the broker (${error.message})`);
  }
  if (response.status === 401 || response.status === 403) return askForLogin(await problem(response));
  if (response.status === 404) {
    return retry(`topic ${TOPIC} does not exist yet: run the telemetry job with --results-topic ${TOPIC}`);
  }
  if (!response.ok) return retry(await problem(response));
  setStatus("live", "live");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let newline;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line) handleLine(JSON.parse(line));
      }
    }
  } catch (error) {
    return retry(`the stream broke (${error.message})`);
  }
  retry("the broker ended the stream");
}

function handleLine(line) {
  if (line.heartbeat) return;
  if (line.error) {
    setStatus(line.message, "down");
    return;
  }
  let result;
  try {
    result = JSON.parse(line.body);
  } catch (_) {
    return;   // not a result: the topic carries something else too
  }
  if (!result || typeof result.device !== "string" || typeof result.window_start_ms !== "number") return;
  let windows = byDevice.get(result.device);
  if (!windows) {
    windows = new Map();
    byDevice.set(result.device, windows);
  }
  windows.set(result.window_start_ms, result);
  if (windows.size > WINDOWS_KEPT) windows.delete(Math.min(...windows.keys()));
  window.sluiceDashboard.received += 1;
  if (result.latest_ts > newestReadingTs) {
    newestReadingTs = result.latest_ts;
    const latency = Date.now() - result.latest_ts;
    const latencies = window.sluiceDashboard.latenciesMs;
    latencies.push(latency);
    if (latencies.length > 1000) latencies.shift();
    $("latency").textContent = formatDuration(latency);
  }
  if (!renderTimer) renderTimer = setTimeout(render, RENDER_EVERY_MS);
}

function formatDuration(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : ms < 120000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 60000)} min`;
}

// --- summaries ---

function fleetWindows() {
  const fleet = new Map();
  for (const windows of byDevice.values()) {
    for (const [start, r] of windows) {
      let w = fleet.get(start);
      if (!w) {
        w = { start, weighted: 0, readings: 0, devices: 0, lo: Infinity, hi: -Infinity, anomalies: 0, battery: Infinity };
        fleet.set(start, w);
      }
      w.weighted += r.avg_temperature * r.readings;
      w.readings += r.readings;
      w.devices += 1;
      w.lo = Math.min(w.lo, r.avg_temperature);
      w.hi = Math.max(w.hi, r.avg_temperature);
      w.anomalies += r.anomaly ? 1 : 0;
      if (r.min_battery != null) w.battery = Math.min(w.battery, r.min_battery);
    }
  }
  return [...fleet.values()].sort((a, b) => a.start - b.start);
}

function render() {
  renderTimer = null;
  window.sluiceDashboard.renders += 1;
  const fleet = fleetWindows();
  if (!fleet.length) return;
  const latest = fleet[fleet.length - 1];
  $("devices").textContent = latest.devices.toLocaleString();
  $("readings").textContent = latest.readings.toLocaleString();
  $("fleet-avg").textContent = (latest.weighted / latest.readings).toFixed(1);
  $("anomalies").textContent = fleet.reduce((n, w) => n + w.anomalies, 0).toLocaleString();
  $("battery").textContent = Number.isFinite(latest.battery) ? latest.battery.toFixed(0) : "–";
  const xs = fleet.map((w) => w.start);
  drawChart($("fleet-chart"), xs, {
    line: fleet.map((w) => w.weighted / w.readings), lo: fleet.map((w) => w.lo), hi: fleet.map((w) => w.hi),
    marks: fleet.map((w) => w.anomalies > 0),
  });
  drawChart($("readings-chart"), xs, { bars: fleet.map((w) => w.readings) });
  const ranked = rankDevices();
  $("device-names").replaceChildren(...ranked.slice(0, 2000).map((d) => new Option(d)));
  if (!selected || !byDevice.has(selected)) selected = ranked[0];
  drawDevice($("device-chart"), selected);
  $("device-caption").textContent = `${selected}: average, minimum and maximum °C per window; humidity % dashed`;
  renderTiles(ranked.slice(0, TILES));
}

function rankDevices() {
  const score = new Map();
  for (const [device, windows] of byDevice) {
    let anomalies = 0;
    let last = 0;
    for (const [start, r] of windows) {
      anomalies += r.anomaly ? 1 : 0;
      last = Math.max(last, start);
    }
    score.set(device, [anomalies, last]);
  }
  return [...byDevice.keys()].sort((a, b) => {
    const [anomaliesA, lastA] = score.get(a);
    const [anomaliesB, lastB] = score.get(b);
    return anomaliesB - anomaliesA || lastB - lastA || a.localeCompare(b);
  });
}

function deviceSeries(device) {
  const rows = [...byDevice.get(device).values()].sort((a, b) => a.window_start_ms - b.window_start_ms);
  return {
    xs: rows.map((r) => r.window_start_ms),
    line: rows.map((r) => r.avg_temperature), lo: rows.map((r) => r.min_temperature),
    hi: rows.map((r) => r.max_temperature), marks: rows.map((r) => r.anomaly),
    second: rows.map((r) => r.avg_humidity),
  };
}

function drawDevice(canvas, device) {
  const series = deviceSeries(device);
  drawChart(canvas, series.xs, series);
}

function renderTiles(devices) {
  const grid = $("device-grid");
  const tiles = devices.map((device) => {
    let tile = grid.querySelector(`[data-device="${CSS.escape(device)}"]`);
    if (!tile) {
      tile = document.createElement("div");
      tile.className = "tile";
      tile.dataset.device = device;
      tile.innerHTML = '<span class="name"></span><span class="last"></span><canvas width="210" height="70"></canvas>';
      tile.querySelector(".name").textContent = device;
      tile.addEventListener("click", () => { selected = device; $("device-choice").value = device; render(); });
    }
    const series = deviceSeries(device);
    tile.classList.toggle("anomalous", series.marks.some(Boolean));
    tile.querySelector(".last").textContent = `${series.line[series.line.length - 1].toFixed(1)} °C`;
    drawChart(tile.querySelector("canvas"), series.xs, { line: series.line, lo: series.lo, hi: series.hi, marks: series.marks }, true);
    return tile;
  });
  grid.replaceChildren(...tiles);
}

$("device-choice").addEventListener("change", (event) => {
  if (byDevice.has(event.target.value)) {
    selected = event.target.value;
    render();
  }
});

// --- drawing ---

function drawChart(canvas, xs, series, compact = false) {
  const shown = Math.round(canvas.clientWidth);
  if (shown && canvas.width !== shown) canvas.width = shown;   // one canvas pixel per screen pixel
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const pad = compact ? { l: 4, r: 4, t: 4, b: 4 } : { l: 44, r: 44, t: 8, b: 22 };
  const values = [series.line, series.lo, series.hi, series.bars].filter(Boolean).flat();
  if (series.bars) values.push(0);
  canvas.dataset.points = String(xs.length);
  if (!xs.length || !values.length) return;
  let low = Math.min(...values);
  let high = Math.max(...values);
  if (high === low) { high += 1; low -= 1; }
  // Half a window of room at each end, so that the first and last bars fit.
  let step = 60000;
  for (let i = 1; i < xs.length; i++) step = Math.min(step, Math.max(1, xs[i] - xs[i - 1]));
  const first = xs[0] - step / 2;
  const span = xs[xs.length - 1] + step / 2 - first;
  const x = (t) => pad.l + ((t - first) / span) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - ((v - low) / (high - low)) * (height - pad.t - pad.b);
  if (!compact) drawAxes(ctx, width, height, pad, low, high, xs[0], xs[xs.length - 1]);
  if (series.lo && series.hi) {
    ctx.fillStyle = COLOR.band;
    ctx.beginPath();
    xs.forEach((t, i) => (i ? ctx.lineTo(x(t), y(series.hi[i])) : ctx.moveTo(x(t), y(series.hi[i]))));
    for (let i = xs.length - 1; i >= 0; i--) ctx.lineTo(x(xs[i]), y(series.lo[i]));
    ctx.closePath();
    ctx.fill();
  }
  if (series.bars) {
    const barWidth = Math.max(2, 0.7 * (x(xs[0] + step) - x(xs[0])));
    ctx.fillStyle = COLOR.bars;
    xs.forEach((t, i) => ctx.fillRect(x(t) - barWidth / 2, y(series.bars[i]), barWidth, y(0) - y(series.bars[i])));
  }
  if (series.line) polyline(ctx, xs.map(x), series.line.map(y), COLOR.line, compact ? 2 : 2.5);
  if (series.second && !compact) drawSecondAxis(ctx, xs.map(x), series.second, width, height, pad);
  if (series.marks) {
    ctx.fillStyle = COLOR.anomaly;
    xs.forEach((t, i) => {
      if (!series.marks[i]) return;
      ctx.beginPath();
      ctx.arc(x(t), y(series.hi ? series.hi[i] : series.line[i]), compact ? 3 : 5, 0, 2 * Math.PI);
      ctx.fill();
    });
  }
}

function polyline(ctx, px, py, color, lineWidth, dashed = false) {
  ctx.strokeStyle = color;
  ctx.lineWidth = lineWidth;
  ctx.setLineDash(dashed ? [6, 4] : []);
  ctx.beginPath();
  px.forEach((xp, i) => (i ? ctx.lineTo(xp, py[i]) : ctx.moveTo(xp, py[i])));
  if (px.length === 1) ctx.arc(px[0], py[0], lineWidth, 0, 2 * Math.PI);
  ctx.stroke();
  ctx.setLineDash([]);
}

function drawSecondAxis(ctx, px, values, width, height, pad) {
  const present = values.filter((v) => v != null);
  if (!present.length) return;
  let low = Math.min(...present);
  let high = Math.max(...present);
  if (high === low) { high += 1; low -= 1; }
  const y = (v) => height - pad.b - ((v - low) / (high - low)) * (height - pad.t - pad.b);
  polyline(ctx, px, values.map((v) => y(v ?? low)), COLOR.humidity, 1.5, true);
  ctx.fillStyle = COLOR.humidity;
  ctx.textAlign = "left";
  ctx.fillText(`${high.toFixed(0)}%`, width - pad.r + 4, pad.t + 8);
  ctx.fillText(`${low.toFixed(0)}%`, width - pad.r + 4, height - pad.b);
}

function drawAxes(ctx, width, height, pad, low, high, first, last) {
  ctx.strokeStyle = COLOR.axis;
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(pad.l, pad.t);
  ctx.lineTo(pad.l, height - pad.b);
  ctx.lineTo(width - pad.r, height - pad.b);
  ctx.stroke();
  ctx.fillStyle = COLOR.text;
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.fillText(high.toFixed(1), pad.l - 4, pad.t + 8);
  ctx.fillText(low.toFixed(1), pad.l - 4, height - pad.b);
  const time = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  ctx.textAlign = "left";
  ctx.fillText(time(first), pad.l + 4, height - 6);
  ctx.textAlign = "right";
  ctx.fillText(time(last), width - pad.r - 4, height - 6);
}

connect();
