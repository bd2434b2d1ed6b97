// The timeline's stacked call sites, its axes, its markers and its pin: the top call sites of
// the window as bands (named on hover, the selected leak row solid), axis labels at round
// numbers of one unit, double-click that resets without pinning, the pin's own colour, and
// markers grouped on the chart but every one listed, a page at a time.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BASE, LOAD_TIMEOUT, TRACES, spec } from '../harness.mjs';
import { TimelineSites } from '../pages/timeline-sites.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const GPUCOLLECT = process.env.GPUCOLLECT
  || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../target/debug/gpucollect');

/** Labels of one axis: one unit, one number of decimals, equal round steps. */
function checkRoundAxis(labels, units, what) {
  const re = new RegExp(`^(\\d+(?:\\.(\\d+))?) (${units.join('|')})$`);
  const parsed = labels.map((l) => { const m = re.exec(l); assert.ok(m, `${what}: "${l}" is a number and a unit`); return m; });
  assert.ok(parsed.length >= 3, `${what}: ${labels}`);
  assert.equal(new Set(parsed.map((m) => m[3])).size, 1, `${what}: one unit in ${labels}`);
  assert.equal(new Set(parsed.map((m) => (m[2] || '').length)).size, 1, `${what}: one precision in ${labels}`);
  const v = parsed.map((m) => Number(m[1]));
  const step = v[1] - v[0];
  const digits = String(step).replace('.', '').replace(/^0+/, '').replace(/0+$/, '');
  assert.ok(['1', '2', '25', '5'].includes(digits), `${what}: a round step (${step}) in ${labels}`);
  for (let i = 1; i < v.length; i++) assert.ok(Math.abs(v[i] - v[i - 1] - step) < 1e-9, `${what}: equal steps in ${labels}`);
}

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
const TIME_UNITS = ['ns', 'µs', 'ms', 's', 'min', 'h'];

test('call sites stacked: legend, hover names a band, the selected leak row is solid', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks`);
  const row = v.el('leak-row');
  await row.waitFor({ timeout: LOAD_TIMEOUT });
  const stack = await row.getAttribute('data-stack');
  await row.click();
  await v.openTab('timeline');
  const s = new TimelineSites(v);
  await s.waitStacked();
  const bands = await s.legend();
  assert.ok(bands.length >= 2 && bands.length <= 10, `legend: ${bands}`);
  assert.equal(bands.at(-1)[0], 'other', 'the last band is the other call sites');
  assert.deepEqual(bands.filter((b) => b[1]).map((b) => b[0]), [stack], 'the selected leak row is highlighted');
  // Low in the plot the hover tip names a band of the legend; above the stack, none.
  const box = await v.timeline.box();
  await v.page.mouse.move(box.x + box.width * 0.9, box.y + box.height - 30);
  await s.hoverBand.waitFor();
  assert.ok(bands.map((b) => b[0]).includes(await s.hoverBand.getAttribute('data-stack')), 'a band of the legend');
  assert.ok(Number(await s.hoverBand.getAttribute('data-value')) > 0);
  await v.page.mouse.move(box.x + box.width * 0.9, box.y + 12);
  await v.timeline.hoverTip.waitFor();
  assert.equal(await v.count('hover-band'), 0, 'no band above the stack');
  // A click on another entry of the legend selects that site instead.
  const other = bands.find((b) => b[0] !== stack && b[0] !== 'other');
  await s.select(other[0]);
  assert.deepEqual((await s.legend()).filter((b) => b[1]).map((b) => b[0]), [other[0]]);
  await v.screenshot('timeline-stacked.png');
  assert.deepEqual(v.errors, []);
});

test('axis labels and the window\'s ends are round numbers of one unit, with one precision', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const s = new TimelineSites(v);
  await v.timeline.waitShown({ drawn: true });
  for (const zoom of [false, true]) {
    if (zoom) {
      const r0 = await v.timeline.range();
      await v.timeline.zoomIn();
      await v.timeline.zoomIn();
      await v.timeline.waitForRangeChange(r0);
    }
    const texts = await s.svgTexts();
    checkRoundAxis(texts.filter((t) => /^[\d.]+ (B|KiB|MiB|GiB|TiB)$/.test(t)), BYTE_UNITS, 'y axis');
    checkRoundAxis(texts.filter((t) => /^[\d.]+ (ns|µs|ms|s|min|h)$/.test(t)), TIME_UNITS, 'x axis');
    checkRoundAxis(await s.canvasYLabels(), BYTE_UNITS, 'y axis on the canvas');
    // The window's ends above the chart are written in one unit too ("0 ns – 3.08 s" was not).
    const range = await v.text('visible-range');
    const m = /^(\d+(?:\.\d+)?) (\S+) – (\d+(?:\.\d+)?) (\S+) \(window /.exec(range);
    assert.ok(m && m[2] === m[4], `one unit in "${range}"`);
  }
  assert.deepEqual(v.errors, []);
});

test('a moment on the chart (hover tip, pin, markers) is written in the unit of the window\'s ends', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const tl = v.timeline;
  await tl.waitShown({ drawn: true });
  const unitOf = (text) => /(\d+(?:\.\d+)?) (ns|µs|ms|s|min|h)\b/.exec(text)?.[2];
  const windowUnit = unitOf(await v.text('visible-range'));
  assert.ok(windowUnit, await v.text('visible-range'));
  // The plot's first pixels: moments within a millisecond of the start ("300 µs" beside a
  // window of "0.00 ms – 308.42 ms" was not one unit).
  const box = await tl.box();
  let hover = null;
  for (let x = 1; x < box.width / 4 && !hover; x += 2) {
    await v.page.mouse.move(box.x + x, box.y + box.height / 2);
    if (await v.count('hover-tip')) hover = [x, (await v.timeline.hoverTip.locator('b').first().textContent()).trim()];
  }
  assert.ok(hover, 'the hover tip shows near the start');
  assert.equal(unitOf(hover[1]), windowUnit, `hover "${hover[1]}" in the unit of the window`);
  await v.page.mouse.click(box.x + hover[0], box.y + box.height / 2);
  await v.el('pinned').waitFor();
  const pinned = await v.el('pinned').locator('h3').textContent();
  assert.equal(unitOf(pinned), windowUnit, `pinned "${pinned}" in the unit of the window`);
  const markers = await v.all('marker').evaluateAll((els) => els.map((e) => e.textContent));
  assert.ok(markers.length > 0);
  for (const m of markers) assert.equal(unitOf(/ at (.*)$/.exec(m)[1]), windowUnit, `marker "${m}"`);
  assert.deepEqual(v.errors, []);
});

test('double-click resets the zoom and leaves the pin as it was', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const tl = v.timeline;
  await tl.waitShown({ drawn: true });
  const full = await tl.range();
  await tl.zoomIn();
  const zoomed = await tl.waitForRangeChange(full);
  const [x, y] = await tl.at(0.5, 0.5);
  await v.page.mouse.dblclick(x, y);
  assert.deepEqual(await tl.waitForRangeChange(zoomed), full, 'the whole trace');
  await v.page.waitForTimeout(100);
  assert.equal(await tl.pinned(), null, 'nothing pinned by the double-click');
  // With a pin: it stays the one it was.
  await tl.zoomIn();
  const z2 = await tl.waitForRangeChange(full);
  const ts = await tl.pinAt(0.3, 0.5);
  await v.page.waitForTimeout(600);
  const [x2, y2] = await tl.at(0.7, 0.5);
  await v.page.mouse.dblclick(x2, y2);
  assert.deepEqual(await tl.waitForRangeChange(z2), full);
  await v.page.waitForTimeout(100);
  assert.equal(await tl.pinned(), ts, 'the pin from before');
  assert.deepEqual(v.errors, []);
});

test('the pinned moment has a colour of its own', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const s = new TimelineSites(v);
  await v.timeline.waitShown({ drawn: true });
  const box = await v.timeline.box();
  await v.timeline.pinAt(0.37, 0.5);
  await v.page.waitForTimeout(200);
  const colours = await s.column(Math.round(box.width * 0.37));
  const near = (a, b, tol) => Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]) <= tol;
  const pin = [0, 176, 255];
  assert.ok(colours.filter((c) => near(c, pin, 8)).length > box.height / 2, 'the pin line is drawn in its colour');
  // Failed allocation, teardown and spike markers.
  for (const marker of [[219, 68, 55], [142, 36, 170], [230, 81, 0]]) {
    assert.ok(!near(pin, marker, 150), `far from the marker colour ${marker}`);
  }
  assert.deepEqual(v.errors, []);
});

test('markers: grouped on the chart, every one listed a page at a time (N of M)', async (ctx) => {
  const trace = path.join(TRACES, 'spikes-200k.msgpack');
  if (!fs.existsSync(trace)) {
    execFileSync(GPUCOLLECT, ['synth', 'spikes', '--events', '200000', '--seed', '5', '-o', trace], { stdio: 'ignore' });
  }
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes-200k.msgpack#view=timeline`);
  const s = new TimelineSites(v);
  await s.markerList.waitFor({ timeout: LOAD_TIMEOUT });
  const [, total] = await s.markerCounts();
  assert.ok(total > 50, `${total} markers, more than a page`);
  await v.page.waitForFunction((n) => document.querySelector('[data-testid="timeline-canvas"]').dataset.markersDrawn === String(n), total);
  const [drawn, groups] = await s.drawnMarkers();
  assert.equal(drawn, total, 'the chart counts every marker');
  assert.ok(groups > 0 && groups <= total, `${groups} groups`);
  await s.open();
  for (;;) {
    const [listed] = await s.markerCounts();
    assert.match(await s.summary(), new RegExp(`^Markers: ${listed} of ${total} listed`));
    assert.equal(await v.count('marker'), listed);
    if (listed === total) break;
    await s.more();
  }
  assert.equal(await v.count('markers-more'), 0, 'nothing left to show');
  // The last one is reachable: it zooms the timeline on itself.
  const last = v.all('marker').last();
  const ts = BigInt(await last.getAttribute('data-ts'));
  const before = await v.timeline.range();
  await last.locator('button').click();
  const [t0, t1] = await v.timeline.waitForRangeChange(before);
  assert.ok(t0 <= ts && ts <= t1, 'the window holds the marker');
  assert.deepEqual(v.errors, []);
});

test('leaving the timeline right after a hover leaves the viewer running', async (ctx) => {
  // The hover tip's call sites come 120 ms after the hover; by then the timeline may be gone.
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  await v.timeline.waitShown({ drawn: true });
  const [x, y] = await v.timeline.at(0.5, 0.5);
  await v.page.mouse.move(x, y);
  await v.openTab('sites');
  await v.sites.waitShown();
  // Past the delay: the pending lookup has run against the disposed view.
  await v.page.waitForTimeout(400);
  assert.deepEqual(v.errors, []);
  assert.equal(await v.count('sites-table'), 1);
});
