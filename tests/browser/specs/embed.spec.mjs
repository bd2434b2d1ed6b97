// Demos (no trace needed) and embed mode.
import assert from 'node:assert/strict';
import { BASE, LOAD_TIMEOUT, SERVE_URL, spec, traceBytes } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('demos load without a trace; embed mode hides the chrome', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.click('demo-oom');
  await v.overview.waitLoaded();
  assert.ok(Number(await v.value('ov-failed')) > 0, 'the OOM demo has failed allocations');
  assert.match(v.page.url(), /\?demo=oom/);
  await v.click('tab-fragmentation');
  assert.ok(await v.count('oom-row') > 0);
  await v.screenshot('demo-oom-fragmentation.png');
  const embed = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack&embed=1#view=timeline`);
  await embed.timeline.waitShown();
  assert.equal(await embed.count('file-picker-label'), 0, 'no header in embed mode');
  await embed.screenshot('embed-timeline.png', {});
});

test('/embed/<id>?view=… of gpucollect serve opens that view with the minimal chrome, as API.md documents', async (ctx) => {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  const up = await fetch(new URL('api/v1/traces', SERVE_URL), { method: 'POST', body: traceBytes('multi-device.msgpack') });
  assert.equal(up.status, 201, await up.clone().text());
  const { id } = await up.json();
  for (const view of ['timeline', 'leaks']) {
    const v = await Viewer.open(ctx, new URL(`embed/${id}?view=${view}`, SERVE_URL).href);
    await v.page.locator(`main[data-view="${view}"]`).waitFor({ timeout: LOAD_TIMEOUT });
    assert.equal(await v.count('file-picker-label'), 0, 'no header in embed mode');
    if (view === 'timeline') await v.timeline.waitShown();
    assert.deepEqual(v.errors, []);
  }
  // The viewer itself: ?view= in the query, as the server's redirect gives it.
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack&embed=1&view=spikes`);
  await v.page.locator('main[data-view="spikes"]').waitFor({ timeout: LOAD_TIMEOUT });
});

test('an embed of 600 × 400: the timeline and its axes fit, the tabs and the toolbar keep to one row', async (ctx) => {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  const up = await fetch(new URL('api/v1/traces', SERVE_URL), { method: 'POST', body: traceBytes('multi-device.msgpack') });
  assert.equal(up.status, 201, await up.clone().text());
  const { id } = await up.json();
  for (const url of [`${BASE}?trace=traces/spikes.msgpack&embed=1&view=timeline`,
    // Several devices: the filter row takes height too.
    new URL(`embed/${id}?view=timeline`, SERVE_URL).href]) {
    const v = await Viewer.open(ctx);
    await v.page.setViewportSize({ width: 600, height: 400 });
    await v.goto(url);
    await v.timeline.waitShown({ drawn: true });
    const fit = await v.page.evaluate(() => {
      const box = (el) => el.getBoundingClientRect();
      // One row: no taller than its tallest child.
      const oneRow = (el) => box(el).height <= Math.max(...[...el.children].map((c) => box(c).height)) + 1;
      const canvas = document.querySelector('[data-testid="timeline-canvas"]');
      return {
        canvas: box(canvas).toJSON(),
        yLabels: canvas.dataset.yLabels,
        toolbar: oneRow(document.querySelector('[data-testid="timeline-view"] .toolbar')),
        tabs: oneRow(document.querySelector('[data-testid="tabs"]')),
        pageWidth: document.documentElement.scrollWidth,
      };
    });
    assert.ok(fit.canvas.bottom <= 400 && fit.canvas.right <= 600, `${url}: the chart fits: ${JSON.stringify(fit.canvas)}`);
    assert.ok(fit.canvas.height >= 160, `${url}: a chart to read: ${JSON.stringify(fit.canvas)}`);
    assert.ok(fit.yLabels.split('|').length >= 3, `${url}: its axis labels: ${fit.yLabels}`);
    assert.ok(fit.toolbar, `${url}: the toolbar is one row`);
    assert.ok(fit.tabs, `${url}: the tabs are one row`);
    assert.ok(fit.pageWidth <= 600, `${url}: nothing wider than the frame (${fit.pageWidth} px)`);
    await v.screenshot(`embed-600x400-${url.startsWith(BASE) ? 'static' : 'serve'}.png`, {});
    assert.deepEqual(v.errors, []);
    await v.close();
  }
});
