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
