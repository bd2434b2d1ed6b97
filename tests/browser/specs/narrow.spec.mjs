// The viewer on a phone-width screen (390 CSS pixels): every view's tables fit the width, so
// nothing needs sideways scrolling.
import assert from 'node:assert/strict';
import { BASE, LOAD_TIMEOUT, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const WIDTH = 390;

test('on a 390 px wide screen the tables of every view fit the width', async (ctx) => {
  const v = await Viewer.open(ctx);
  await v.page.setViewportSize({ width: WIDTH, height: 844 });
  for (const [trace, views] of [['nvtx-leak', ['overview', 'leaks', 'sites']], ['spikes', ['spikes']], ['fragmented', ['fragmentation']]]) {
    await v.goto(`${BASE}?trace=traces/${trace}.msgpack`);
    await v.overview.waitVerdict();
    for (const view of views) {
      await v.openTab(view);
      await v.page.locator('main table').first().waitFor({ timeout: LOAD_TIMEOUT });
      const wide = await v.page.evaluate(() => [...document.querySelectorAll('main table')]
        .filter((t) => t.offsetParent !== null)
        .map((t) => ({ table: t.dataset.testid || t.className, right: Math.round(t.getBoundingClientRect().right) }))
        .filter((t) => t.right > innerWidth));
      assert.deepEqual(wide, [], `${trace} ${view}: tables within ${WIDTH} px`);
      const page = await v.page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(page <= WIDTH, `${trace} ${view}: the page is ${page} px wide`);
      await v.screenshot(`narrow-${view}.png`);
    }
  }
  assert.deepEqual(v.errors, []);
});
