// node --test: the chart geometry, against hand-computed numbers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { extent, scale, ticks, linePath, nearest } from "./chart.js";

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
