// The timeline: zoom, pan, brush, hover, pin, exports, dark theme, HiDPI, and the order of the
// first draw and the detectors.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { BASE, LOAD_TIMEOUT, report, spec } from '../harness.mjs';
import { launch } from '../lib.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('timeline: zoom (button, wheel, keys, brush) changes the visible range; hover and pin', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const tl = v.timeline;
  await tl.waitShown();
  const r0 = await tl.range();
  await tl.zoomIn();
  const r1 = await tl.waitForRangeChange(r0);
  assert.ok(r1[1] - r1[0] < r0[1] - r0[0], `zoom-in narrows ${r0} -> ${r1}`);
  const [mx, my] = await tl.at(0.6, 0.5);
  await v.page.mouse.move(mx, my);
  await v.page.mouse.wheel(0, -300);
  const r2 = await tl.waitForRangeChange(r1);
  assert.ok(r2[1] - r2[0] < r1[1] - r1[0], 'wheel up zooms in');
  await v.page.keyboard.press('ArrowRight');
  const r3 = await tl.waitForRangeChange(r2);
  assert.equal(r3[1] - r3[0], r2[1] - r2[0], 'pan keeps the width');
  assert.ok(r3[0] > r2[0], 'ArrowRight pans right');
  await v.page.keyboard.press('0');
  const r4 = await tl.waitForRangeChange(r3);
  assert.deepEqual(r4, r0, 'reset shows the whole trace');
  // Brush: drag across the middle fifth.
  await tl.brush(0.4, 0.6, 0.6);
  const r5 = await tl.waitForRangeChange(r4);
  assert.ok(r5[1] - r5[0] < (r4[1] - r4[0]) / 3n, 'brush selects a narrower window');
  // Hover shows time, bytes and the call sites live then.
  const [hx, hy] = await tl.at(0.5, 0.6);
  await v.page.mouse.move(hx, hy);
  await tl.hoverTip.waitFor();
  assert.match(await tl.hoverTip.textContent(), /(B|KiB|MiB|GiB) live/);
  await v.page.waitForFunction(() => document.querySelectorAll('[data-testid="hover-tip"] li').length > 0);
  // Click pins the moment and lists live allocations by stack.
  const pinnedTs = await tl.pinAt(0.5, 0.6);
  assert.ok(Number(pinnedTs) >= Number(r5[0]) && Number(pinnedTs) <= Number(r5[1]), 'pin inside the window');
  await v.screenshot('timeline-zoomed.png');
  // Chart exports: SVG from the plotters SVG backend, PNG from the canvas.
  const svg = await tl.exportSvg();
  assert.match(svg, /^<svg/);
  assert.match(svg, /process 0 · GPU 0/);
  assert.deepEqual([...fs.readFileSync(await tl.exportPng()).subarray(1, 4)], [0x50, 0x4e, 0x47]);
  // Dark theme follows the system.
  await v.page.emulateMedia({ colorScheme: 'dark' });
  await v.page.keyboard.press('-');
  await v.page.waitForTimeout(200);
  await v.screenshot('timeline-dark.png');
  assert.deepEqual(v.errors, []);
});

test('HiDPI: the chart is drawn at the device pixel ratio and still maps the mouse', async () => {
  const hidpi = await launch({ deviceScaleFactor: 2 });
  try {
    const v = await Viewer.open(hidpi.ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
    const tl = v.timeline;
    await tl.waitShown({ drawn: true });
    const [w, h, cssW, cssH] = await tl.sizes();
    assert.deepEqual([w, h], [cssW * 2, cssH * 2], 'backing store = CSS size x 2');
    const png = fs.readFileSync(await tl.exportPng());
    assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [w, h], 'PNG at full resolution');
    // A click at the middle of the plot pins a moment inside the visible window.
    const pinned = BigInt(await tl.pinAt(0.5, 0.5));
    const [t0, t1] = await tl.range();
    const mid = t0 + (t1 - t0) / 2n;
    const tolerance = (t1 - t0) / 10n;
    assert.ok(pinned > mid - tolerance && pinned < mid + tolerance, 'the pin lands where the mouse is');
    await v.screenshot('timeline-hidpi.png', {});
    assert.deepEqual(v.errors, []);
  } finally {
    await hidpi.close();
  }
});

test('the timeline is drawn before the detectors run; their markers and views follow', async (ctx) => {
  const spikes = report('spikes').analysis.timeline_spikes;
  const v = await Viewer.open(ctx);
  await v.page.addInitScript(() => {
    window.__draws = [];
    new MutationObserver((records) => {
      for (const r of records) {
        if (r.target.dataset?.testid === 'timeline-canvas') window.__draws.push(Number(r.target.dataset.drawnAt));
      }
    }).observe(document, { attributes: true, attributeFilter: ['data-drawn-at'], subtree: true });
  });
  await v.goto(`${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  await v.timeline.markers('spike').first().waitFor({ state: 'attached', timeout: LOAD_TIMEOUT });
  assert.equal(await v.timeline.markers('spike').count(), spikes.length, 'the markers arrive with the detectors');
  // The markers' list is rendered at once; the canvas is redrawn with them in the next animation
  // frame, so wait for that draw (the assertion below fails if it never comes).
  await v.page.waitForFunction(() => {
    const at = performance.getEntriesByName('gpucollect:analysed')[0]?.startTime;
    return at !== undefined && window.__draws.some((d) => d > at);
  }, null, { timeout: 10_000 }).catch(() => {});
  const { draws, analysed } = await v.page.evaluate(() => ({
    draws: window.__draws,
    analysed: performance.getEntriesByName('gpucollect:analysed').map((m) => m.startTime),
  }));
  assert.equal(analysed.length, 1, 'the detectors ran once');
  assert.ok(draws[0] < analysed[0], `first draw ${draws[0]} before the detectors ${analysed[0]}`);
  assert.ok(draws.some((d) => d > analysed[0]), 'redrawn with the markers afterwards');
  // The views built on the report show it (the note while detecting is gone).
  await v.click('tab-overview');
  await v.overview.waitLoaded();
  assert.equal(await v.count('detecting'), 0);
  assert.deepEqual(v.errors, []);
});

test('a moment is pinned from the keyboard: Tab to the chart, Enter pins the middle, shift+arrows move the pin', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const tl = v.timeline;
  await tl.waitShown({ drawn: true });
  assert.ok(await v.tabTo('timeline-canvas'), `Tab reaches the chart (focus on ${await v.focused()})`);
  const [t0, t1] = await tl.range();
  await v.page.keyboard.press('Enter');
  await v.el('pinned').waitFor();
  const pin = BigInt(await tl.pinned());
  assert.equal(pin, t0 + (t1 - t0) / 2n, 'the window\'s middle');
  await v.page.keyboard.press('Shift+ArrowRight');
  await v.page.waitForFunction((p) => document.querySelector('[data-testid="pinned"]')?.dataset.ts !== p, String(pin));
  const moved = BigInt(await tl.pinned());
  assert.equal(moved, pin + (t1 - t0) / 100n, 'one hundredth of the window later');
  assert.deepEqual(await tl.range(), [t0, t1], 'shift+arrow moves the pin, not the window');
  await v.page.keyboard.press('Escape');
  await v.el('pinned').waitFor({ state: 'detached' });
  assert.deepEqual(v.errors, []);
});
