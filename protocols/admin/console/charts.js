// Time series charts drawn by uPlot on a canvas.
import uPlot from "./vendor/uPlot.mjs";
import { bytes, html, num, useEffect, useRef } from "./lib.js";

export const COLORS = ["#1f6fd1", "#2e9d5b", "#d1495b", "#8a5cc2", "#c98a14"];

/** Epoch seconds as the local time of day, 24-hour. */
const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString("sv");

/** The samples' time span, at least a minute wide (uPlot widens a single sample's to years). */
function timeRange(u, min, max) {
  const t = u.data[0];
  if (!t || t.length === 0) return [min, max];
  const last = t[t.length - 1];
  return last - t[0] < 60 ? [last - 60, last] : [t[0], last];
}

/**
 * A line chart of ``t`` (epoch seconds) against each of ``series`` ([{label, values}]).
 * ``unit`` "bytes" labels the axis in bytes. data-points on the element counts the samples.
 */
export function Chart({ id, title, t, series, unit }) {
  const holder = useRef(null);
  const plot = useRef(null);
  const labels = series.map((s) => s.label).join("|");
  const data = [t, ...series.map((s) => s.values)];

  useEffect(() => {
    const element = holder.current;
    const format = unit === "bytes" ? bytes : num;
    plot.current = new uPlot({
      width: Math.max(element.clientWidth, 300),
      height: 220,
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2,
        value: (u, v) => (v === null || v === undefined ? "–" : format(v)),
      }))],
      axes: [
        { space: 90, values: (u, splits) => splits.map(clock) },
        { values: (u, values) => values.map(format), size: 70 },
      ],
      scales: { x: { time: true, range: timeRange } },
    }, data, element);
    const resize = new ResizeObserver(() => {
      plot.current.setSize({ width: Math.max(element.clientWidth, 300), height: 220 });
    });
    resize.observe(element);
    return () => { resize.disconnect(); plot.current.destroy(); plot.current = null; };
  }, [labels, unit]);

  useEffect(() => { if (plot.current) plot.current.setData(data); });

  return html`<figure class="chart" id=${id} data-points=${t.length}>
    <figcaption>${title}</figcaption>
    <div class="plot" ref=${holder}></div>
  </figure>`;
}
