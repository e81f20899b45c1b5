// Pure chart geometry for the dashboard's SVG curves: no DOM here, so `node --test` checks it
// (chart.test.mjs) with hand-computed numbers.

/** The [min, max] of the values (and of each point's min/max band), padded when flat. */
export function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (Number.isFinite(v)) {
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  }
  if (lo === Infinity) return [0, 1];
  // Equal up to rounding (0.175 and 0.17500000000000002) is flat: pad it as flat.
  if (hi - lo <= 1e-9 * Math.max(1, Math.abs(lo), Math.abs(hi))) return [lo - 0.5, hi + 0.5];
  return [lo, hi];
}

/** A linear map from [d0, d1] onto [r0, r1]. */
export function scale([d0, d1], [r0, r1]) {
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  return (x) => r0 + (x - d0) * k;
}

/** "Nice" tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi], about `n` of them. */
export function ticks(lo, hi, n = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, n);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  // By index, not by adding: a step below the values' precision must not loop forever.
  const first = Math.ceil(lo / step);
  const out = [];
  for (let i = 0; i <= 100; i++) {
    const t = (first + i) * step;
    if (t > hi + step * 1e-9) break;
    out.push(Number(t.toPrecision(12)));
  }
  return out;
}

/** An SVG path through the points ("M x y L x y ..."), coordinates rounded to 0.1 px. */
export function linePath(points, sx, sy) {
  const r = (v) => Math.round(v * 10) / 10;
  return points.map((p, i) => `${i === 0 ? "M" : "L"}${r(sx(p.x))} ${r(sy(p.y))}`).join(" ");
}

/** The point nearest to x (points sorted by x), for reading a value under the pointer. */
export function nearest(points, x) {
  let best = null;
  for (const p of points) {
    if (best === null || Math.abs(p.x - x) < Math.abs(best.x - x)) best = p;
  }
  return best;
}

/** The whole steps a drag from x `a` to x `b` covers, or null for a click (under one step). */
export function zoomRange(a, b) {
  const lo = Math.max(0, Math.floor(Math.min(a, b)));
  const hi = Math.ceil(Math.max(a, b));
  // A drag in the margin left of step 0 reaches negative steps: no range, not [0, -2].
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || Math.abs(b - a) < 1 || hi < lo) return null;
  return [lo, hi];
}

/** A trained token's background by its probability exp(logprob): hue 0 (red, unlikely) to 120
 * (green, certain), light enough for dark text; null for an unknown logprob. */
export function logprobColor(lp) {
  if (!Number.isFinite(lp)) return null;
  const p = Math.min(1, Math.exp(Math.min(0, lp)));
  return `hsl(${Math.round(p * 120)} 70% 85%)`;
}

/** Each point's band: a bucket's extremes when it stands for several observations, else value
 * ± the standard deviation observed with it (a `.../reward_std_dev` point of the same step and
 * time), when there is one. `banded` says whether a point has a band at all. */
export function bands(points, spread) {
  const sd = new Map((spread || []).map((p) => [`${p.step} ${p.time_ms}`, p.value]));
  return points.map((p) => {
    const s = p.count > 1 ? undefined : sd.get(`${p.step} ${p.time_ms}`);
    if (Number.isFinite(s)) return { ...p, min: p.value - s, max: p.value + s, sd: s, banded: true };
    return { ...p, banded: p.count > 1 };
  });
}
