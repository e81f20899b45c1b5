// node --test: the chart geometry, against hand-computed numbers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { extent, scale, ticks, linePath, nearest, zoomRange, logprobColor, bands } from "./chart.js";

test("extent pads a flat series and ignores non-numbers", () => {
  assert.deepEqual(extent([1, 3, NaN, 2]), [1, 3]);
  assert.deepEqual(extent([2, 2]), [1.5, 2.5]);
  assert.deepEqual(extent([]), [0, 1]);
  // Equal but for rounding: flat, not a range of 3e-17 (whose ticks would never end).
  assert.deepEqual(extent([0.175, 0.17500000000000002]), [0.175 - 0.5, 0.17500000000000002 + 0.5]);
});

test("scale maps the domain onto the range, flipped for SVG's y", () => {
  const sy = scale([0, 1], [100, 0]);
  assert.equal(sy(0), 100);
  assert.equal(sy(0.25), 75);
  assert.equal(scale([3, 3], [0, 10])(3), 0);
});

test("ticks are 1-2-5 steps", () => {
  assert.deepEqual(ticks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(ticks(0, 37, 4), [0, 10, 20, 30]);
  assert.deepEqual(ticks(-0.3, 0.3, 3), [-0.2, 0, 0.2]);
  assert.deepEqual(ticks(2, 2), [2]);
  // A range far below the values' precision still ends.
  assert.ok(ticks(0.175, 0.17500000000000002, 4).length <= 101);
});

test("linePath and nearest", () => {
  const pts = [{ x: 0, y: 0 }, { x: 1, y: 0.5 }, { x: 2, y: 1 }];
  const sx = scale([0, 2], [0, 200]);
  const sy = scale([0, 1], [100, 0]);
  assert.equal(linePath(pts, sx, sy), "M0 100 L100 50 L200 0");
  assert.deepEqual(nearest(pts, 1.4), { x: 1, y: 0.5 });
  assert.equal(nearest([], 1), null);
});

test("a drag zooms to the whole steps it covers; a click does not zoom", () => {
  assert.deepEqual(zoomRange(7.4, 2.6), [2, 8]);
  assert.deepEqual(zoomRange(-0.5, 1.2), [0, 2]);
  assert.equal(zoomRange(3.1, 3.6), null);
  assert.equal(zoomRange(NaN, 3), null);
  assert.equal(zoomRange(-11, -2), null, "wholly left of step 0");
});

test("tokens are coloured by probability, red to green", () => {
  assert.equal(logprobColor(0), "hsl(120 70% 85%)");
  assert.equal(logprobColor(Math.log(0.5)), "hsl(60 70% 85%)");
  assert.equal(logprobColor(-1e9), "hsl(0 70% 85%)");
  assert.equal(logprobColor(0.3), "hsl(120 70% 85%)", "a positive logprob (rounding) is certainty");
  assert.equal(logprobColor(NaN), null);
  assert.equal(logprobColor(null), null);
});

test("a reward's band is its bucket's extremes, else plus or minus its std dev", () => {
  const p = (step, value, count = 1, min = value, max = value) => ({ step, time_ms: step * 10, value, min, max, count });
  const out = bands([p(1, 0.5), p(2, 0.7, 3, 0.2, 0.9), p(3, 0.4)], [p(1, 0.25), p(2, 0.1), { ...p(3, 0.3), time_ms: 99 }]);
  assert.deepEqual([out[0].min, out[0].max, out[0].banded], [0.25, 0.75, true]);
  assert.deepEqual([out[1].min, out[1].max, out[1].banded], [0.2, 0.9, true], "a bucket keeps its extremes");
  assert.deepEqual([out[2].min, out[2].max, out[2].banded], [0.4, 0.4, false], "no std dev of that time");
  assert.equal(bands([p(1, 0.5)], undefined)[0].banded, false);
});
